"""The data-plane handlers: one model call from the agent's request to its captured answer.

:func:`handle_call` parses the request and registers the attempt (retry matching), then either
hands a tokens-mode chat call to :mod:`rollwire.gateway.tokens.handler` or forwards it in passthrough
(:mod:`rollwire.gateway.dataplane.dispatch`, :mod:`rollwire.gateway.dataplane.relay`). Every path commits the call
through :func:`rollwire.gateway.dataplane.commit.commit_call` before the agent sees the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import threading
import time
from typing import Any

import aiohttp
import orjson
from starlette.responses import Response

from rollwire.data.protocol import ModelCall
from rollwire.gateway.asgi import CHAT_PATH, MODELS_PATH, ASGIResponse, header
from rollwire.gateway.context import ChatContext
from rollwire.gateway.dataplane.capture import Asked
from rollwire.gateway.dataplane.commit import commit_call, new_call, store_unavailable
from rollwire.gateway.dataplane.dispatch import Commit, expect_routing, forward
from rollwire.gateway.dataplane.relay import forward_stream, restream
from rollwire.gateway.dataplane.routing import wants_routing
from rollwire.gateway.dataplane.sampling import (
    apply_sampling,
    check_sampling,
    tool_choice_flags,
    trainable_with,
)
from rollwire.gateway.dataplane.sessions import Attempt, SessionState
from rollwire.gateway.errors import GatewayError, error_response
from rollwire.gateway.ports import GatewayPort
from rollwire.store import SessionRecord, StoreUnavailable

__all__ = ["check_budget", "handle_call", "handle_request", "internal_error", "models"]

log = logging.getLogger("rollwire.gateway")

_JSON = "application/json"


def session_sampling(rec: SessionRecord, body: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The session's sampling policy applied to ``body`` in place, plus the token budget:
    (effective parameters, off-policy flags). A 400 when a parameter has the wrong type."""
    try:
        check_sampling(body)
    except ValueError as exc:
        raise GatewayError(400, str(exc), code="invalid_sampling_parameter") from exc
    effective, flags = apply_sampling(body, rec.sampling, rec.sampling_policy)
    if rec.max_tokens is not None:
        left = max(1, rec.max_tokens - rec.num_tokens)
        if body.get("max_tokens") is None or body["max_tokens"] > left:
            body["max_tokens"] = left
            effective["max_tokens"] = left
    return effective, flags


def internal_error(gw: GatewayPort, exc: Exception, st: SessionState | None) -> Response:
    """Log an unexpected failure and answer an OpenAI-shaped 500 (503 when the store is down)."""
    if isinstance(exc, StoreUnavailable):
        gw.metrics.error("store_unavailable")
        return store_unavailable(exc).response()
    sid = st.record.session_id if st is not None else None
    ref = secrets.token_hex(4)
    log.error("unexpected error [%s] serving a call of session %r", ref, sid, exc_info=exc)
    gw.metrics.error("internal")
    # The exception text stays in the log: it may show internals the agent has no use for.
    return error_response(
        500,
        f"internal gateway error [{ref}]: the gateway's log has the details",
        "server_error",
        "internal_error",
    )


def check_budget(gw: GatewayPort, st: SessionState) -> None:
    """Refuse a call of a closed, expired or over-budget session (409 / 401 / 429)."""
    rec = st.record
    if rec.terminal or rec.session_id in gw.closing:
        raise GatewayError(
            409,
            f"session {rec.session_id!r} is "
            f"{rec.status if rec.terminal else 'being completed'}; "
            "it accepts no more model calls",
            "invalid_request_error",
            "session_closed",
        )
    if rec.expires_at is not None and rec.expires_at < time.time():
        # Touched after its TTL: it becomes ``timeout`` (in the background; the call is
        # refused either way).
        gw.spawn(gw.expire(rec))
        raise GatewayError(401, "session expired", "authentication_error", "session_expired")
    if rec.max_calls is not None and rec.num_calls + st.in_flight >= rec.max_calls:
        gw.metrics.error("budget_calls")
        raise GatewayError(
            429,
            f"session {rec.session_id!r} reached its budget of {rec.max_calls} model calls",
            "rate_limit_error",
            "call_budget_exceeded",
        )
    if rec.max_tokens is not None and rec.num_tokens >= rec.max_tokens:
        gw.metrics.error("budget_tokens")
        raise GatewayError(
            429,
            f"session {rec.session_id!r} used its budget of {rec.max_tokens} tokens "
            f"({rec.num_tokens} generated)",
            "rate_limit_error",
            "token_budget_exceeded",
        )


async def models(gw: GatewayPort) -> Response:
    """``GET /v1/models``, relayed from a backend."""
    backend = gw.pool.pick("")
    if backend is None:
        raise gw.pool.unavailable()
    try:
        async with gw.http.get(backend.url + MODELS_PATH) as resp:
            data = await resp.read()
            return Response(data, status_code=resp.status, media_type=_JSON)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        gw.pool.mark_failed(backend)
        raise GatewayError(
            502, f"backend {backend.url} unreachable: {exc}", "server_error", "bad_gateway"
        ) from exc


#: How deep a request body may nest JSON. The gateway re-encodes bodies with orjson (for the
#: backend, the store, the control API, each wrapping a request in a few levels of its own), and
#: orjson stops at 254 levels: deeper JSON would fail there, after the call had begun.
MAX_JSON_DEPTH = 128
_ORJSON_DEPTH = 254
TOO_DEEP = (
    f"the request body nests JSON more than {MAX_JSON_DEPTH} levels deep (the gateway's depth "
    "limit); flatten the deepest message content or tool schema"
)


class _Wrapper(threading.local):
    """Per thread: (254 - MAX_JSON_DEPTH) nested lists, built once, the innermost left empty."""

    def __init__(self) -> None:
        self.holder: list[Any] = []
        outer: list[Any] = self.holder
        for _ in range(_ORJSON_DEPTH - MAX_JSON_DEPTH - 1):
            outer = [outer]
        self.outer = outer


_wrapper = _Wrapper()


def json_too_deep(value: Any) -> bool:
    """True when ``value`` nests lists and objects more than :data:`MAX_JSON_DEPTH` deep."""
    # Encoding inside (254 - MAX_JSON_DEPTH) extra lists fails exactly when the value is over
    # MAX_JSON_DEPTH deep, checked in C: ~0.15 ms for a 300 kB chat body, a sixth of its parse.
    # The lists are built once per thread (building them per call cost more than the encoding).
    w = _wrapper
    w.holder.append(value)
    try:
        orjson.dumps(w.outer)
    except orjson.JSONEncodeError:
        return True
    finally:
        w.holder.clear()
    return False


def parse_request(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object (400 otherwise, also past :data:`MAX_JSON_DEPTH`), an
    empty ``tools`` list dropped."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in str(exc):  # orjson's own bound (1024), far past the gateway's
            raise GatewayError(400, TOO_DEEP, code="json_too_deep") from exc
        raise GatewayError(400, f"request body is not valid JSON: {exc}") from exc
    if json_too_deep(body):
        raise GatewayError(400, TOO_DEEP, code="json_too_deep")
    if not isinstance(body, dict):
        raise GatewayError(400, "request body must be a JSON object")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise GatewayError(
            400, f"stream must be true or false, got {stream!r}", code="invalid_stream"
        )
    if body.get("tools") == []:
        del body["tools"]  # vLLM rejects an empty tool list; Strands always sends one
    return body


def retry_count_of(scope: dict[str, Any]) -> int:
    """The OpenAI SDK's retry counter (``x-stainless-retry-count``), 0 when absent."""
    rc = header(scope, b"x-stainless-retry-count")
    if rc:
        with contextlib.suppress(ValueError):
            return int(rc)
    return 0


async def handle_call(
    gw: GatewayPort, scope: dict[str, Any], st: SessionState, path: str, raw: bytes
) -> ASGIResponse:
    """A chat or completions call: parse, register the attempt, capture, commit, answer."""
    return await handle_request(gw, scope, st, path, raw, parse_request(raw))


async def handle_request(
    gw: GatewayPort,
    scope: dict[str, Any],
    st: SessionState,
    path: str,
    raw: bytes,
    body: dict[str, Any],
    committed: list[ModelCall] | None = None,
) -> ASGIResponse:
    """:func:`handle_call` for a request already parsed (or converted from another wire
    dialect: ``raw`` is what the agent sent, for retry matching); the call committed is
    appended to ``committed`` when given."""
    t0 = time.perf_counter()
    started_at = time.time()
    attempt = st.register_attempt(raw, retry_count_of(scope))
    hangup = scope.get("rollwire.hangup")

    async def commit(call: ModelCall) -> None:
        if hangup is not None and hangup.is_set() and not call.stream:
            # Nobody got this answer: the agent will not build on it, so it does not train.
            call.trainable = False
            if "client_disconnected" not in call.flags:
                call.flags.append("client_disconnected")
            call.error = call.error or "the agent hung up before the answer was ready"
        await commit_call(gw, st, call, attempt)
        if committed is not None:
            committed.append(call)

    try:
        return await _dispatch(gw, scope, st, path, body, attempt, commit, t0, started_at)
    except GatewayError:
        raise
    except Exception as exc:
        if not attempt.committed:
            # Still leave a trace of the attempt: a failed, non-trainable call.
            call = new_call(
                call_id=attempt.call_id or gw.new_call_id(),
                session_id=st.record.session_id,
                index=0,
                status="failed",
                trainable=False,
                error=f"internal gateway error: {type(exc).__name__}: {exc}",
                stream=bool(body.get("stream")),
                started_at=started_at,
                latency_ms=(time.perf_counter() - t0) * 1000.0,
                request=body,
                capture=st.record.capture,
            )
            with contextlib.suppress(Exception):
                await commit(call)
        return internal_error(gw, exc, st)


async def _dispatch(
    gw: GatewayPort,
    scope: dict[str, Any],
    st: SessionState,
    path: str,
    body: dict[str, Any],
    attempt: Attempt,
    commit: Commit,
    t0: float,
    started_at: float,
) -> ASGIResponse:
    rec = st.record
    if path == CHAT_PATH and rec.capture == "tokens":
        return await tokens_chat(gw, scope, st, body, commit, started_at)

    fwd = dict(body)
    asked = Asked.from_body(body)
    effective, flags = gw.apply_sampling(rec, fwd)
    if "tool_choice" in body:
        flags += tool_choice_flags(body)
    backend = gw.pool.pick(rec.session_id)
    if backend is None:
        raise gw.pool.unavailable()
    stream = bool(body.get("stream"))
    chat = path == CHAT_PATH
    if rec.chat_template_kwargs and chat:
        agent_kwargs = fwd.get("chat_template_kwargs")
        fwd["chat_template_kwargs"] = {
            **(agent_kwargs if isinstance(agent_kwargs, dict) else {}),
            **rec.chat_template_kwargs,
        }
    attempt.call_id = gw.new_call_id()
    call = new_call(
        call_id=attempt.call_id,
        session_id=rec.session_id,
        index=0,
        sampling=effective,
        trainable=trainable_with(flags, rec.allow_off_policy),
        off_policy=bool(flags),
        flags=list(flags),
        stream=stream,
        started_at=started_at,
        request=body,
        capture="passthrough",
    )
    if wants_routing(rec, backend):
        commit = expect_routing(gw, commit)
        if stream and chat and body.get("n") in (None, 1):
            return await restream(gw, st, call, fwd, asked, body, path, t0, commit)
    if stream:
        headers = {"content-type": _JSON, "x-session-id": st.header_id}
        return await forward_stream(gw, st, call, fwd, asked, chat, path, headers, t0, commit)
    return await forward(gw, st, call, fwd, asked, path, st.upstream_headers, t0, commit)


async def tokens_chat(
    gw: GatewayPort,
    scope: dict[str, Any],
    st: SessionState,
    body: dict[str, Any],
    commit: Commit,
    started_at: float,
) -> ASGIResponse:
    """A chat call of a ``capture="tokens"`` session, handed to the tokens-mode handler."""
    # Imported on first use: passthrough-only gateways never load the renderer stack.
    from rollwire.gateway.tokens.handler import handle_chat

    rec = st.record
    backend = gw.pool.pick(rec.session_id)
    if backend is None:
        raise gw.pool.unavailable()

    def _apply(params: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        return gw.apply_sampling(rec, params)

    ctx = ChatContext(
        body=body,
        session=rec,
        state=st.state,
        backend=backend,
        http=gw.http,
        apply_sampling=_apply,
        commit=commit,
        new_call_id=gw.new_call_id,
        policy_version=gw.policy_version,
        request_headers={
            k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]
        },
        mark_backend_failed=lambda: gw.pool.mark_failed(backend),
        started_at=started_at,
        gateway=gw,
    )
    backend.in_flight += 1
    try:
        response: Response = await handle_chat(ctx)
    finally:
        backend.in_flight -= 1
    return response
