"""The dialect routes of the data plane: ``/v1/responses``, ``/v1/messages`` and
``/v1/messages/count_tokens``.

Each request is converted to a Chat Completions request and served by the gateway's own chat path
(either capture mode, non-streaming towards the backend), so the call is captured exactly like a
chat call; the ``chat.completion`` answer is converted back, and streamed as the dialect's event
stream when the client asked for ``stream: true`` (the call is committed before the first event).
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import orjson
from starlette.responses import StreamingResponse

from rollwire.gateway.asgi import CHAT_PATH, ASGIResponse, RawResponse
from rollwire.gateway.dataplane import calls
from rollwire.gateway.dialects import anthropic, responses
from rollwire.gateway.dialects.anthropic_stream import message_events
from rollwire.gateway.dialects.errors import DialectError
from rollwire.gateway.dialects.responses_stream import response_events
from rollwire.gateway.errors import GatewayError

if TYPE_CHECKING:
    from rollwire.data.protocol import ModelCall
    from rollwire.gateway.dataplane.sessions import SessionState
    from rollwire.gateway.ports import GatewayPort

__all__ = [
    "CALL_ROUTES",
    "COUNT_TOKENS",
    "MESSAGES",
    "RESPONSES",
    "anthropic_error",
    "refusal",
    "serve_count_tokens",
    "serve_messages",
    "serve_responses",
]

RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
COUNT_TOKENS = "/v1/messages/count_tokens"
_HISTORY_KEY = "dialects.responses"
# Stored responses per session kept in memory for previous_response_id: a chain continues the
# latest ones; an older id is read back from the store. Each is a whole conversation, so 256 of
# them per session held ~100 MB over the benchmark's sessions.
_MAX_KEPT = 16
_SSE_HEADERS = {"cache-control": "no-cache"}


async def _capture(
    gw: GatewayPort, scope: dict[str, Any], st: SessionState, raw: bytes, chat: dict[str, Any]
) -> tuple[ASGIResponse, ModelCall | None]:
    """Serve ``chat`` on the gateway's chat path: its response and the call it committed."""
    committed: list[ModelCall] = []
    answer = await calls.handle_request(gw, scope, st, CHAT_PATH, raw, chat, committed)
    return answer, committed[-1] if committed else None


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in str(exc):
            raise DialectError(calls.TOO_DEEP) from exc
        raise DialectError(f"request body is not valid JSON: {exc}") from exc
    if calls.json_too_deep(body):
        raise DialectError(calls.TOO_DEEP)
    if not isinstance(body, dict):
        raise DialectError("request body must be a JSON object")
    return body


def _answer(response: Any, call: ModelCall | None) -> tuple[int, dict[str, Any]]:
    """Status and ``chat.completion`` body of what the chat path answered: the committed call's
    response when it succeeded (no second parse), else the (error) body it sent."""
    status = getattr(response, "status_code", None) or getattr(response, "status", None) or 200
    if status == 200 and call is not None and call.status == "ok" and call.response:
        return 200, call.response
    try:
        data = orjson.loads(response.body)
    except (orjson.JSONDecodeError, AttributeError):
        data = {"error": {"message": "the chat path gave no JSON answer", "type": "server_error"}}
    return int(status), data if isinstance(data, dict) else {}  # type: ignore[arg-type]


def _json(data: Any, status: int = 200) -> RawResponse:
    return RawResponse(orjson.dumps(data), status)


def _openai_error(exc: DialectError) -> RawResponse:
    body = {
        "error": {
            "message": exc.message,
            "type": "invalid_request_error",
            "param": exc.param,
            "code": None,
        }
    }
    return _json(body, exc.status)


# ---------------------------------------------------------------------------------- Responses
def _kept(st: SessionState) -> OrderedDict[str, list[dict[str, Any]]]:
    kept = st.state.get(_HISTORY_KEY)
    if not isinstance(kept, OrderedDict):
        kept = st.state[_HISTORY_KEY] = OrderedDict()
    return kept


def _share(prev: list[dict[str, Any]] | None, cur: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``cur`` with the messages it begins with in common with ``prev`` replaced by ``prev``'s
    own (equal) objects: the kept conversations of a session then hold their history once."""
    if not prev:
        return cur
    n = 0
    for a, b in zip(prev, cur):
        if a is not b and a != b:
            break
        n += 1
    return prev[:n] + cur[n:] if n else cur


async def _history(gw: GatewayPort, st: SessionState, response_id: Any) -> list[dict[str, Any]]:
    """The conversation ``previous_response_id`` names, from this session's own responses only."""
    if not isinstance(response_id, str) or not response_id:
        raise DialectError("'previous_response_id' must be a string", param="previous_response_id")
    kept = _kept(st)
    if response_id in kept:
        return kept[response_id]
    # Not in memory (evicted, or another gateway process served it): the store has the call.
    call_id = response_id.removeprefix("resp_")
    for call in await gw.store.calls(st.record.session_id):
        if call.call_id == call_id and call.status == "ok" and call.request.get("messages"):
            reply = ((call.response.get("choices") or [{}])[0]).get("message")
            if isinstance(reply, dict):
                return responses.history_after(call.request, reply)
    raise DialectError(
        f"previous response {response_id!r} not found in this session (responses created with "
        "store: false, or by another session, cannot be continued)",
        param="previous_response_id",
        status=404,
    )


async def serve_responses(
    gw: GatewayPort, scope: dict[str, Any], st: SessionState, path: str, raw: bytes
) -> ASGIResponse:
    """``POST /v1/responses``: one model call, answered as a ``response`` (or its events)."""
    try:
        body = _parse(raw)
        history: list[dict[str, Any]] = []
        if body.get("previous_response_id") is not None:
            history = await _history(gw, st, body["previous_response_id"])
        chat = responses.request_to_chat(body, history)
    except DialectError as exc:
        return _openai_error(exc)
    created = time.time()
    answer, call = await _capture(gw, scope, st, raw, chat)
    status, data = _answer(answer, call)
    if status != 200:
        return answer  # already an OpenAI-shaped error, which is what Responses clients read
    store = body.get("store", True) is not False
    rid = f"resp_{call.call_id}" if store and call else f"resp_{secrets.token_hex(12)}"
    out = responses.response_from_chat(data, body, response_id=rid, created_at=created)
    if store:
        reply = ((data.get("choices") or [{}])[0]).get("message") or {}
        kept = _kept(st)
        history = responses.history_after(chat, reply)
        kept[rid] = _share(next(reversed(kept.values()), None), history)
        while len(kept) > _MAX_KEPT:
            kept.popitem(last=False)
    if body.get("stream"):
        return _stream(response_events(out))
    return _json(out)


def _stream(events: list[bytes]) -> StreamingResponse:
    async def gen() -> Any:
        for event in events:
            yield event

    return StreamingResponse(gen(), media_type="text/event-stream", headers=_SSE_HEADERS)


# ---------------------------------------------------------------------------------- Messages
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def anthropic_error(status: int, message: str) -> RawResponse:
    """An Anthropic-shaped error: ``{"type": "error", "error": {"type", "message"}}``."""
    kind = _ANTHROPIC_TYPES.get(status, "api_error")
    return _json({"type": "error", "error": {"type": kind, "message": message}}, status)


def refusal(path: str, exc: GatewayError) -> ASGIResponse:
    """A gateway refusal (auth, budget, closed session, ...) of a data-plane request at
    ``path``, in the shape that path's clients read: Anthropic's for ``/v1/messages...``."""
    if path.startswith(MESSAGES):
        return anthropic_error(exc.status, exc.message)
    return exc.response()


def _as_anthropic(status: int, data: dict[str, Any]) -> RawResponse:
    err = data.get("error")
    message = err.get("message") if isinstance(err, dict) else None
    return anthropic_error(status, str(message or data))


async def serve_messages(
    gw: GatewayPort, scope: dict[str, Any], st: SessionState, path: str, raw: bytes
) -> ASGIResponse:
    """``POST /v1/messages``: one model call, answered as a ``message`` (or its events)."""
    try:
        body = _parse(raw)
        chat = anthropic.request_to_chat(body)
    except DialectError as exc:
        return anthropic_error(exc.status, exc.message)
    answer, call = await _capture(gw, scope, st, raw, chat)
    status, data = _answer(answer, call)
    if status != 200:
        return _as_anthropic(status, data)
    mid = f"msg_{call.call_id}" if call else f"msg_{secrets.token_hex(12)}"
    out = anthropic.message_from_chat(data, body, message_id=mid)
    if body.get("stream"):
        return _stream(message_events(out))
    return _json(out)


async def serve_count_tokens(
    gw: GatewayPort, scope: dict[str, Any], st: SessionState, path: str, raw: bytes
) -> ASGIResponse:
    """``POST /v1/messages/count_tokens``: the prompt's length in the policy's tokens, counted by
    the session's backend (``POST /tokenize`` with the converted messages). Not a model call."""
    try:
        body = _parse(raw)
        chat = anthropic.count_request(body)
    except DialectError as exc:
        return anthropic_error(exc.status, exc.message)
    backend = gw.pool.pick(st.record.session_id)
    if backend is None:
        return anthropic_error(503, "no inference backend configured")
    if backend.model is not None:
        chat["model"] = backend.model
    if st.record.chat_template_kwargs:
        chat["chat_template_kwargs"] = dict(st.record.chat_template_kwargs)
    try:
        async with gw.http.post(backend.url + "/tokenize", json=chat) as resp:
            payload = await resp.read()
            status = resp.status
    except Exception as exc:
        return anthropic_error(502, f"inference backend {backend.url} unreachable: {exc}")
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError:
        data = {}
    count = data.get("count") if isinstance(data, dict) else None
    if status != 200 or not isinstance(count, int):
        said = payload[:300].decode(errors="replace")
        return anthropic_error(
            502 if status == 200 else status,
            f"inference backend could not count tokens (POST /tokenize answered {status}: {said})",
        )
    return _json({"input_tokens": count})


#: The dialects' routes, as :attr:`Gateway.call_routes` entries (count_tokens makes no model
#: call, but is held and budget-checked like one: it is the prompt of the next call).
CALL_ROUTES: dict[
    str, Callable[[Any, dict[str, Any], Any, str, bytes], Awaitable[ASGIResponse]]
] = {
    RESPONSES: serve_responses,
    MESSAGES: serve_messages,
    COUNT_TOKENS: serve_count_tokens,
}
