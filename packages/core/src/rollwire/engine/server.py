"""HTTP server of the embedded engine: vLLM's OpenAI-compatible routes plus SGLang's ``/generate``.

Shapes follow ``SERVER_APIS.md`` (vLLM 0.33 / SGLang 0.5). Model work runs on the scheduler's
worker thread; handlers only await its events, so the event loop never blocks on NumPy.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import numpy as np
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Send

from rollwire.agent.serving import ServerThread

from .config import EngineConfig
from .faults import FaultDraw, FaultInjector
from .model import ModelConfig, TinyModel
from .parsing import StreamParser, parse_assistant_text
from .sampling import SamplingParams
from .scheduler import Completion, GenerationRequest, Scheduler, TokenEvent
from .scripted import Script, load_script, messages_from_prompt
from .tokenizer import EngineTokenizer

__all__ = ["EmbeddedEngine", "Engine", "create_app", "serve_in_thread"]

logger = logging.getLogger(__name__)


class _HTTPError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.headers = headers or {}


_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    429: "RateLimitError",
    500: "InternalServerError",
}


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def _error(
    status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None
) -> Response:
    body = {
        "error": {
            "message": message,
            "type": _ERROR_TYPES.get(status, "Error"),
            "param": param,
            "code": status,
        }
    }
    return _json(body, status, headers)


class _CutStream(Exception):
    """Raised by a stream body to drop the connection mid-body (the truncated-stream fault)."""


class _SSEResponse(StreamingResponse):
    """A streaming response that can end without its final chunk: on :class:`_CutStream` it stops
    sending, the server closes the connection, and the client sees an incomplete chunked body,
    as when a real server dies mid-stream."""

    async def stream_response(self, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        try:
            async for chunk in self.body_iterator:
                data = (
                    chunk if isinstance(chunk, bytes | memoryview) else chunk.encode(self.charset)
                )
                await send({"type": "http.response.body", "body": data, "more_body": True})
        except _CutStream:
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _sse(data: Any) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


def _npy_b64(arr: np.ndarray) -> str:
    buf = io.BytesIO()
    np.save(buf, arr.astype(np.int32), allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode()


class Engine:
    """Model, tokenizer, scheduler, script and faults behind the routes (one per app)."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        if config.model_dir is not None:
            self.model = TinyModel.load(config.model_dir)
        else:
            mc = config.model or ModelConfig()
            self.model = TinyModel(
                replace(mc, seed=config.seed if config.model is None else mc.seed)
            )
        self.tokenizer: EngineTokenizer = self.model.tokenizer
        self.weight_version = config.weight_version
        self.scheduler = Scheduler(
            self.model,
            version=lambda: self.weight_version,
            max_batch_size=config.max_batch_size,
            seed=config.seed,
            prefill_chunk_tokens=config.prefill_chunk_tokens,
            prefix_cache_tokens=config.prefix_cache_tokens,
        )
        self.script: Script | None = (
            load_script(config.scripted) if config.scripted is not None else None
        )
        self.faults = FaultInjector(config.faults)
        self.created = int(time.time())

    @property
    def model_name(self) -> str:
        """The id served by ``/v1/models``."""
        return self.config.model_name

    def forced_text(
        self, messages: list[dict[str, Any]] | None, tools: Any, session_id: str | None
    ) -> str | None:
        """The assistant text the script forces for this request, or None."""
        if self.script is None:
            return None
        try:
            text = self.script.lookup(messages, tools, session_id)
        except Exception as exc:
            logger.exception("engine: the script raised")
            raise _HTTPError(500, f"the script raised {type(exc).__name__}: {exc}") from exc
        if text is not None and not isinstance(text, str):
            raise _HTTPError(
                500, f"the script returned {type(text).__name__}, expected str or None"
            )
        return text

    def forced_ids(self, text: str | None) -> list[int] | None:
        """Token ids of a forced text, ending in ``<|im_end|>`` (None stays None)."""
        if text is None:
            return None
        return [*self.tokenizer.encode(text), self.tokenizer.eos_id]

    def submit(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        emit: Callable[[Any], None],
        *,
        forced: list[int] | None = None,
        stream: bool = False,
        request_id: str | None = None,
        want_experts: bool = False,
    ) -> GenerationRequest:
        """Queue one generation on the worker thread."""
        if not prompt_ids:
            raise _HTTPError(400, "the prompt is empty; send at least one token")
        limit = self.model.config.max_model_len
        if len(prompt_ids) + (len(forced) if forced else params.max_tokens) > limit:
            raise _HTTPError(
                400,
                f"prompt ({len(prompt_ids)} tokens) plus max_tokens ({params.max_tokens}) exceeds "
                f"max_model_len {limit}; shorten the prompt or lower max_tokens",
            )
        bad = [t for t in prompt_ids if not 0 <= t < self.model.config.vocab_size]
        if bad:
            raise _HTTPError(
                400, f"token ids out of range [0, {self.model.config.vocab_size}): {bad[:5]}"
            )
        req = GenerationRequest(
            prompt_ids=list(prompt_ids),
            params=params,
            emit=emit,
            request_id=request_id or uuid.uuid4().hex,
            forced_ids=forced,
            stream=stream,
            logprobs_mode=self.config.logprobs_mode,
            want_experts=want_experts,
        )
        self.scheduler.submit(req)
        return req

    async def generate_many(
        self,
        prompt_ids: list[int],
        params: list[SamplingParams],
        *,
        forced: list[int] | None = None,
        stream: bool = False,
        request_id: str | None = None,
        want_experts: bool = False,
    ) -> tuple[list[GenerationRequest], asyncio.Queue[tuple[int, Any]]]:
        """Submit one request per ``params`` entry; events arrive on the queue as ``(index, event)``."""
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        reqs = []
        for i, p in enumerate(params):

            def emit(ev: Any, i: int = i) -> None:
                with contextlib.suppress(RuntimeError):  # loop already closed: nobody is listening
                    loop.call_soon_threadsafe(q.put_nowait, (i, ev))

            rid = request_id if len(params) == 1 and request_id else None
            reqs.append(
                self.submit(
                    prompt_ids,
                    p,
                    emit,
                    forced=forced,
                    stream=stream,
                    request_id=rid,
                    want_experts=want_experts,
                )
            )
        return reqs, q

    async def complete(
        self, prompt_ids: list[int], params: list[SamplingParams], **kw: Any
    ) -> list[Completion]:
        """Run requests to completion (non-streaming)."""
        reqs, q = await self.generate_many(prompt_ids, params, **kw)
        done: dict[int, Completion] = {}
        try:
            while len(done) < len(reqs):
                i, ev = await q.get()
                if isinstance(ev, Exception):
                    # Requests are validated before they reach the worker: anything it raises
                    # is an engine bug, never the caller's fault.
                    raise _HTTPError(500, f"engine error: {type(ev).__name__}: {ev}")
                if isinstance(ev, Completion):
                    done[i] = ev
        finally:
            for r in reqs:
                if not r.aborted and len(done) < len(reqs):
                    r.abort()
        return [done[i] for i in range(len(reqs))]


# ---------------------------------------------------------------------- request parsing helpers
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _bad(name: str, expected: str, value: Any) -> _HTTPError:
    return _HTTPError(400, f"'{name}' must be {expected}, got {_show(value)}", param=name)


def _int(
    body: dict[str, Any],
    key: str,
    default: int | None,
    *,
    lo: int | None = None,
    hi: int | None = None,
    where: str = "",
) -> int | None:
    """``body[key]`` as an int (ints, integral floats, bools and numeric strings, like pydantic's
    lax mode); a 400 naming the field otherwise."""
    value = body.get(key)
    if value is None:
        return default
    name = where + key
    span = f" in [{lo}, {hi}]" if lo is not None and hi is not None else ""
    span = span or (f" >= {lo}" if lo is not None else "")
    out: int | None = None
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        out = int(value)
    elif isinstance(value, str):
        with contextlib.suppress(ValueError):
            out = int(value.strip())
    if out is None or (lo is not None and out < lo) or (hi is not None and out > hi):
        raise _bad(name, "an integer" + span, value)
    return out


def _float(
    body: dict[str, Any],
    key: str,
    default: float,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    where: str = "",
) -> float:
    """``body[key]`` as a finite float in range; a 400 naming the field otherwise."""
    value = body.get(key)
    if value is None:
        return default
    out: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        out = float(value)
    elif isinstance(value, str):
        with contextlib.suppress(ValueError):
            out = float(value.strip())
    low_ok = out is not None and (lo is None or (out > lo if lo_open else out >= lo))
    if out is None or not math.isfinite(out) or not low_ok or (hi is not None and out > hi):
        bounds = ""
        if lo is not None:
            bounds = f" {'>' if lo_open else '>='} {lo}"
        if hi is not None:
            bounds += f"{' and' if bounds else ''} <= {hi}"
        raise _bad(where + key, "a number" + bounds, value)
    return out


def _bool(body: dict[str, Any], key: str, default: bool, *, where: str = "") -> bool:
    """``body[key]`` as a bool (also 0/1 and "true"/"false"); a 400 naming the field otherwise."""
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise _bad(where + key, "a boolean", value)


def _str_list(body: dict[str, Any], key: str, *, where: str = "") -> list[str]:
    value = body.get(key)
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise _bad(where + key, "a string or a list of strings", value)


def _int_list(body: dict[str, Any], key: str, *, where: str = "") -> list[int]:
    value = body.get(key)
    if value is None:
        return []
    if isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        return [int(v) for v in value]
    raise _bad(where + key, "a list of integers", value)


def _params(
    body: dict[str, Any], engine: Engine, *, sglang: bool = False, n_index: int = 0, where: str = ""
) -> SamplingParams:
    """Sampling parameters of a request; every field is type- and range-checked (400 naming it)."""
    w = where
    if sglang:
        sp = body.get("sampling_params")
        sp = {} if sp is None else sp
        if not isinstance(sp, dict):
            raise _bad("sampling_params", "an object", sp)
        w = "sampling_params."
        seed = _int(sp, "sampling_seed", None, where=w)
        if seed is None:
            seed = _int(sp, "seed", None, where=w)
        return SamplingParams(
            max_tokens=_int(sp, "max_new_tokens", 128, lo=0, where=w) or 0,
            temperature=_float(sp, "temperature", 1.0, lo=0.0, where=w),
            top_p=_float(sp, "top_p", 1.0, lo=0.0, hi=1.0, lo_open=True, where=w),
            top_k=_int(sp, "top_k", -1, lo=-1, where=w) or -1,
            min_p=_float(sp, "min_p", 0.0, lo=0.0, hi=1.0, where=w),
            stop=_str_list(sp, "stop", where=w),
            stop_token_ids=_int_list(sp, "stop_token_ids", where=w),
            ignore_eos=_bool(sp, "ignore_eos", False, where=w),
            seed=seed,
            logprobs=_int(body, "top_logprobs_num", 0, lo=0, hi=engine.config.max_top_logprobs)
            if _bool(body, "return_logprob", False)
            else None,
            skip_special_tokens=_bool(sp, "skip_special_tokens", True, where=w),
            include_stop_str_in_output=_bool(sp, "no_stop_trim", False, where=w),
        )
    max_tokens = _int(body, "max_completion_tokens", None, lo=0, where=w)
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens", engine.config.default_max_tokens, lo=0, where=w)
    seed = _int(body, "seed", None, where=w)
    if seed is not None and n_index:
        seed += n_index
    return SamplingParams(
        max_tokens=max_tokens or 0,
        temperature=_float(body, "temperature", 1.0, lo=0.0, where=w),
        top_p=_float(body, "top_p", 1.0, lo=0.0, hi=1.0, lo_open=True, where=w),
        top_k=_int(body, "top_k", -1, lo=-1, where=w) or -1,
        min_p=_float(body, "min_p", 0.0, lo=0.0, hi=1.0, where=w),
        stop=_str_list(body, "stop", where=w),
        stop_token_ids=_int_list(body, "stop_token_ids", where=w),
        ignore_eos=_bool(body, "ignore_eos", False, where=w),
        seed=seed,
        skip_special_tokens=_bool(body, "skip_special_tokens", True, where=w),
        include_stop_str_in_output=_bool(body, "include_stop_str_in_output", False, where=w),
    )


def _n(body: dict[str, Any]) -> int:
    return _int(body, "n", 1, lo=1, hi=128) or 1


def _model_name(engine: Engine, body: dict[str, Any]) -> str:
    """The name to echo; with ``strict_model_name`` an unknown model is vLLM's 404."""
    model = body.get("model")
    if model is None or model == "":
        return engine.model_name
    if not isinstance(model, str):
        raise _bad("model", "a string", model)
    if engine.config.strict_model_name and model not in engine.config.served_model_names:
        raise _HTTPError(404, f"The model `{model}` does not exist.", param="model")
    return model


def _tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise _bad("tools", "a list of tool objects", tools)
    if not tools:
        # vLLM refuses an empty tools list; keep the same behaviour so gateway tests see it.
        raise _HTTPError(
            400, "'tools' must not be an empty list; omit it when there are no tools", param="tools"
        )
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise _bad(f"tools[{i}]", '{"type": "function", "function": {"name": ...}}', t)
    return tools


def _tool_choice(body: dict[str, Any], tools: list[dict[str, Any]] | None) -> str | tuple[str]:
    """``"none"``, ``"auto"``, ``"required"`` or ``(name,)`` for a named function (checked
    against ``tools``, like vLLM)."""
    choice = body.get("tool_choice")
    if choice is None:
        return "auto" if tools else "none"
    if choice in ("none", "auto", "required"):
        if choice == "required" and not tools:
            raise _HTTPError(
                400, "tool_choice 'required' needs a non-empty 'tools' list", param="tool_choice"
            )
        return str(choice)
    fn = choice.get("function") if isinstance(choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise _bad(
            "tool_choice",
            '"none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
            choice,
        )
    names = [t["function"]["name"] for t in tools or []]
    if name not in names:
        raise _HTTPError(
            400,
            f"tool_choice names function {name!r}, which is not in 'tools' ({names})",
            param="tool_choice",
        )
    return (name,)


def _check_forced_tool_call(choice: str | tuple[str], forced_text: str | None) -> None:
    """``required``/named tool_choice: the engine cannot constrain sampling, so only a scripted
    reply that is a tool call (to the named function) satisfies it."""
    if choice in ("none", "auto"):
        return
    what = "'required'" if choice == "required" else f"function {choice[0]!r}"
    if forced_text is None:
        raise _HTTPError(
            400,
            f"tool_choice {what} cannot be enforced by the embedded engine (it samples freely); "
            "script the reply with scripted mode (--scripted) or use tool_choice 'auto'",
            param="tool_choice",
        )
    calls = parse_assistant_text(forced_text)[2]
    if not calls:
        raise _HTTPError(
            400,
            f"tool_choice {what}: the scripted reply is not a tool call: {_show(forced_text)}",
            param="tool_choice",
        )
    if isinstance(choice, tuple):
        wrong = [c["function"]["name"] for c in calls if c["function"]["name"] != choice[0]]
        if wrong:
            raise _HTTPError(
                400,
                f"tool_choice {what}: the scripted reply calls {wrong}",
                param="tool_choice",
            )


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        data = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError as exc:
        raise _HTTPError(400, f"request body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise _HTTPError(400, f"request body must be a JSON object, got {type(data).__name__}")
    return data


def _session_id(request: Request, body: dict[str, Any]) -> str | None:
    sid = request.headers.get("x-session-id") or body.get("session_id")
    return None if sid is None else str(sid)


async def _apply_faults(engine: Engine) -> FaultDraw:
    draw = engine.faults.draw()
    if draw.latency_s:
        await asyncio.sleep(draw.latency_s)
    if draw.error:
        raise _HTTPError(500, "injected fault: internal server error (--fault-error-rate)")
    if draw.throttle:
        raise _HTTPError(
            429,
            "injected fault: too many requests (--fault-throttle-rate); retry later",
            headers={"Retry-After": str(engine.config.faults.retry_after_s)},
        )
    return draw


def _top_k_requested(body: dict[str, Any], engine: Engine) -> int | None:
    k = _int(body, "top_logprobs", 0, lo=0, hi=engine.config.max_top_logprobs) or 0
    if not _bool(body, "logprobs", False):
        return None
    return k


def _prompt_logprobs(body: dict[str, Any], engine: Engine) -> int | None:
    return _int(body, "prompt_logprobs", None, lo=0, hi=engine.config.max_top_logprobs)


class _Renderer:
    """Per-request formatting of tokens and log-probs in vLLM's chat shapes."""

    def __init__(self, engine: Engine, as_ids: bool) -> None:
        self.tok = engine.tokenizer
        self.as_ids = as_ids

    def token(self, tid: int) -> str:
        return f"token_id:{tid}" if self.as_ids else self.tok.token_text(tid)

    def entry(self, tid: int, lp: float, top: list[tuple[int, float]] | None) -> dict[str, Any]:
        return {
            "token": self.token(tid),
            "logprob": max(lp, -9999.0),
            "bytes": list(self.tok.token_bytes(tid)),
            "top_logprobs": [
                {
                    "token": self.token(t),
                    "logprob": max(v, -9999.0),
                    "bytes": list(self.tok.token_bytes(t)),
                }
                for t, v in (top or [])
            ],
        }

    def prompt_logprobs(self, c: Completion) -> list[dict[str, Any] | None] | None:
        if c.prompt_logprobs is None:
            return None
        out: list[dict[str, Any] | None] = []
        for item in c.prompt_logprobs:
            if item is None:
                out.append(None)
                continue
            tid, lp, rank, top = item
            d: dict[str, Any] = {
                str(tid): {"logprob": lp, "rank": rank, "decoded_token": self.tok.decode([tid])}
            }
            for r, (t, v) in enumerate(top, start=1):
                d.setdefault(
                    str(t), {"logprob": v, "rank": r, "decoded_token": self.tok.decode([t])}
                )
            out.append(d)
        return out


def _strip_ids(obj: dict[str, Any]) -> None:
    obj.pop("prompt_token_ids", None)
    for ch in obj.get("choices") or []:
        ch.pop("token_ids", None)
        ch.pop("prompt_token_ids", None)
        ch.pop("response_token_ids", None)


def _sglext_chunk(
    kind: str, rid: str, created: int, name: str, prompt_ids: list[int], output_ids: list[int]
) -> bytes:
    """SGLang's final stream chunk for ``return_output_ids_in_sglext`` (ids of choice 0)."""
    return _sse(
        {
            "id": rid,
            "object": kind,
            "created": created,
            "model": name,
            "choices": [],
            "sglext": {"input_ids": prompt_ids, "output_ids": output_ids},
        }
    )


# ---------------------------------------------------------------------- routes
def create_app(config: EngineConfig | None = None) -> Starlette:
    """The engine's ASGI app; the model loads now and the worker thread starts with the app."""
    engine = Engine(config or EngineConfig())

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        engine.scheduler.start()
        try:
            yield
        finally:
            engine.scheduler.stop()

    def handler(fn: Callable[[Request], Any]) -> Callable[[Request], Any]:
        async def wrapped(request: Request) -> Response:
            try:
                return await fn(request)  # type: ignore[no-any-return]
            except _HTTPError as exc:
                return _error(exc.status, exc.message, exc.param, exc.headers)
            except Exception as exc:  # a bug: say so in the OpenAI shape, and log it
                logger.exception("engine: %s %s failed", request.method, request.url.path)
                return _error(500, f"internal error: {type(exc).__name__}: {exc}")

        return wrapped

    tok = engine.tokenizer

    # ---------------------------------------------------------------- chat
    async def chat(request: Request) -> Response:
        body = await _body(request)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _HTTPError(400, "'messages' must be a non-empty list", param="messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise _bad(f"messages[{i}]", 'an object with a "role" string', m)
        name = _model_name(engine, body)
        tools = _tools(body)
        tool_choice = _tool_choice(body, tools)
        parse_tools = bool(tools) and tool_choice != "none"
        kwargs = body.get("chat_template_kwargs")
        kwargs = {} if kwargs is None else kwargs
        if not isinstance(kwargs, dict):
            raise _bad("chat_template_kwargs", "an object", kwargs)
        n = _n(body)
        top_k = _top_k_requested(body, engine)
        pl = _prompt_logprobs(body, engine)
        params = [_params(body, engine, n_index=i) for i in range(n)]
        for p in params:
            p.logprobs = top_k
            p.prompt_logprobs = pl
        add_generation_prompt = _bool(body, "add_generation_prompt", True)
        draw = await _apply_faults(engine)
        try:
            prompt = tok.render_chat(
                messages, tools, add_generation_prompt=add_generation_prompt, **kwargs
            )
        except Exception as exc:
            raise _HTTPError(
                400, f"cannot render the chat template: {exc}", param="messages"
            ) from exc
        prompt_ids = tok.encode(prompt)
        forced_text = engine.forced_text(messages, tools, _session_id(request, body))
        _check_forced_tool_call(tool_choice, forced_text)
        forced = engine.forced_ids(forced_text)
        want_experts = engine.config.return_routed_experts
        ret_ids = _bool(body, "return_token_ids", False)
        ret_versions = _bool(body, "return_weight_versions", False)
        sglang_ids = engine.config.openai_ids_style == "sglang"
        stream = _bool(body, "stream", False)
        if sglang_ids and stream and ret_ids:
            raise _HTTPError(
                400,
                "return_token_ids is not supported with stream: true; "
                "use return_output_ids_in_sglext",
                param="return_token_ids",
            )
        render = _Renderer(engine, _bool(body, "return_tokens_as_token_ids", False))
        rid = "chatcmpl-" + uuid.uuid4().hex
        created = int(time.time())
        if stream:
            return await _chat_stream(
                engine,
                request,
                body,
                prompt_ids,
                params,
                forced,
                parse_tools,
                render,
                rid,
                created,
                name,
                draw,
            )
        completions = await engine.complete(
            prompt_ids,
            params,
            forced=forced,
            want_experts=want_experts,
            request_id=request.headers.get("x-request-id"),
        )
        choices = []
        for i, c in enumerate(completions):
            content, reasoning, calls = parse_assistant_text(c.text)
            if not parse_tools and calls:
                content, reasoning, calls = _without_tools(c.text)
            finish = "tool_calls" if calls and c.finish_reason == "stop" else c.finish_reason
            choice: dict[str, Any] = {
                "index": i,
                "message": {
                    "role": "assistant",
                    "content": content,
                    "refusal": None,
                    "annotations": None,
                    "audio": None,
                    "function_call": None,
                    "tool_calls": calls,
                    "reasoning": reasoning,
                    "reasoning_content": reasoning,
                },
                "logprobs": None
                if top_k is None
                else {
                    "content": [
                        render.entry(t, lp, (c.top_logprobs or [[]] * len(c.output_ids))[j])
                        for j, (t, lp) in enumerate(zip(c.output_ids, c.logprobs))
                    ]
                },
                "finish_reason": finish,
                "stop_reason": c.stop_reason,
            }
            if sglang_ids:  # SGLang's OpenAI chat: both id lists on the choice
                if ret_ids:
                    choice["prompt_token_ids"] = prompt_ids
                    choice["response_token_ids"] = c.output_ids
            else:
                choice["token_ids"] = c.output_ids if ret_ids else None
            if want_experts and c.routed_experts is not None:
                choice["routed_experts"] = _npy_b64(c.routed_experts)
            if ret_versions or ret_ids:
                choice["weight_versions"] = c.weight_versions()
            choices.append(choice)
        completion_tokens = sum(len(c.output_ids) for c in completions)
        out: dict[str, Any] = {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": name,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": None,
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "total_tokens": len(prompt_ids) + completion_tokens,
                "completion_tokens": completion_tokens,
                "prompt_tokens_details": None,
            },
            "prompt_logprobs": render.prompt_logprobs(completions[0]),
            "prompt_token_ids": prompt_ids if ret_ids and not sglang_ids else None,
            "kv_transfer_params": None,
            "weight_version": completions[0].token_versions[-1]
            if completions[0].token_versions
            else engine.weight_version,
        }
        if draw.drop_token_ids:
            _strip_ids(out)
        return _json(out)

    # ---------------------------------------------------------------- completions
    async def completions(request: Request) -> Response:
        body = await _body(request)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            prompt_ids = tok.encode(prompt)
        elif isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            prompt_ids = [int(t) for t in prompt]
        else:
            raise _bad("prompt", "a string or a list of token ids (one prompt per request)", prompt)
        name = _model_name(engine, body)
        n = _n(body)
        k = _int(body, "logprobs", None, lo=0, hi=engine.config.max_top_logprobs)
        pl = _prompt_logprobs(body, engine)
        params = [_params(body, engine, n_index=i) for i in range(n)]
        for p in params:
            p.logprobs = k
            p.prompt_logprobs = pl
        draw = await _apply_faults(engine)
        forced = _token_route_forced(engine, request, body, prompt_ids)
        ret_ids = _bool(body, "return_token_ids", False)
        render = _Renderer(engine, _bool(body, "return_tokens_as_token_ids", False))
        rid = "cmpl-" + uuid.uuid4().hex
        created = int(time.time())
        want_experts = engine.config.return_routed_experts
        if _bool(body, "stream", False):
            return await _completions_stream(
                engine, body, prompt_ids, params, forced, render, rid, created, name, draw
            )
        results = await engine.complete(
            prompt_ids, params, forced=forced, want_experts=want_experts
        )
        choices = []
        for i, c in enumerate(results):
            choice: dict[str, Any] = {
                "index": i,
                "text": c.text,
                "logprobs": None if k is None else _completion_logprobs(render, c),
                "finish_reason": c.finish_reason,
                "stop_reason": c.stop_reason,
                "prompt_logprobs": render.prompt_logprobs(c),
                "prompt_token_ids": prompt_ids if ret_ids else None,
                "token_ids": c.output_ids if ret_ids else None,
            }
            if want_experts and c.routed_experts is not None:
                choice["routed_experts"] = _npy_b64(c.routed_experts)
            if ret_ids or body.get("return_weight_versions"):
                choice["weight_versions"] = c.weight_versions()
            choices.append(choice)
        completion_tokens = sum(len(c.output_ids) for c in results)
        out = {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": name,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": None,
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "total_tokens": len(prompt_ids) + completion_tokens,
                "completion_tokens": completion_tokens,
                "prompt_tokens_details": None,
            },
            "kv_transfer_params": None,
            "weight_version": engine.weight_version,
        }
        if draw.drop_token_ids:
            _strip_ids(out)
        return _json(out)

    # ---------------------------------------------------------------- vLLM token-in/token-out
    async def inference_generate(request: Request) -> Response:
        body = await _body(request)
        ids = body.get("token_ids")
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            raise _bad("token_ids", "a list of token ids", ids)
        _model_name(engine, body)
        sp = body.get("sampling_params")
        sp = {} if sp is None else sp
        if not isinstance(sp, dict):
            raise _bad("sampling_params", "an object", sp)
        params = _params(sp, engine, where="sampling_params.")
        top_n = _int(
            sp, "logprobs", None, lo=0, hi=engine.config.max_top_logprobs, where="sampling_params."
        )
        params.logprobs = top_n
        draw = await _apply_faults(engine)
        forced = _token_route_forced(engine, request, body, ids)
        rid = str(body.get("request_id") or uuid.uuid4().hex)
        [c] = await engine.complete(
            ids,
            [params],
            forced=forced,
            request_id=rid,
            want_experts=engine.config.return_routed_experts,
        )
        choice: dict[str, Any] = {
            "index": 0,
            "finish_reason": c.finish_reason,
            "stop_reason": c.stop_reason,
            "token_ids": c.output_ids,
            "routed_experts": _npy_b64(c.routed_experts) if c.routed_experts is not None else None,
            "weight_versions": c.weight_versions(),
            "logprobs": None
            if top_n is None
            else {
                "content": [
                    {
                        "token_id": t,
                        "logprob": v,
                        "rank": c.ranks[j],
                        "top_logprobs": [
                            {"token_id": tt, "logprob": vv, "rank": r}
                            for r, (tt, vv) in enumerate(
                                (c.top_logprobs or [[]] * len(c.output_ids))[j], start=1
                            )
                        ],
                    }
                    for j, (t, v) in enumerate(zip(c.output_ids, c.logprobs))
                ]
            },
        }
        out = {"request_id": rid, "choices": [choice], "weight_version": engine.weight_version}
        if draw.drop_token_ids:
            _strip_ids(out)
        return _json(out)

    async def abort_requests(request: Request) -> Response:
        body = await _body(request)
        ids = body.get("request_ids") or []
        if isinstance(ids, str):
            ids = [ids]
        return _json({"aborted": engine.scheduler.abort([str(i) for i in ids])})

    # ---------------------------------------------------------------- SGLang native
    async def sglang_generate(request: Request) -> Response:
        body = await _body(request)
        if body.get("input_ids") is not None:
            ids = body["input_ids"]
            if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
                raise _HTTPError(
                    400,
                    "'input_ids' must be a list of ints (batches are not supported)",
                    param="input_ids",
                )
        elif isinstance(body.get("text"), str):
            ids = tok.encode(body["text"])
        else:
            raise _HTTPError(
                400, "send 'input_ids' (list of ints) or 'text' (string)", param="input_ids"
            )
        params = _params(body, engine, sglang=True)
        draw = await _apply_faults(engine)
        forced = _token_route_forced(engine, request, body, ids)
        want = bool(body.get("return_routed_experts")) or engine.config.return_routed_experts
        rid = str(body.get("rid") or uuid.uuid4().hex)
        t0 = time.perf_counter()
        [c] = await engine.complete(ids, [params], forced=forced, request_id=rid, want_experts=want)
        if c.finish_reason == "stop":
            matched: Any = c.stop_reason if c.stop_reason is not None else c.output_ids[-1]
            finish: dict[str, Any] = {"type": "stop", "matched": matched}
        elif c.finish_reason == "length":
            finish = {"type": "length", "length": params.max_tokens}
        else:
            finish = {"type": "abort", "message": "aborted"}
        meta: dict[str, Any] = {
            "id": rid,
            "finish_reason": finish,
            "prompt_tokens": len(ids),
            "completion_tokens": len(c.output_ids),
            "cached_tokens": c.cached_tokens,
            "weight_version": c.token_versions[-1] if c.token_versions else engine.weight_version,
            "e2e_latency": time.perf_counter() - t0,
        }
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [[v, t, None] for t, v in zip(c.output_ids, c.logprobs)]
            if params.logprobs:
                meta["output_top_logprobs"] = [
                    [[v, t, None] for t, v in top] for top in (c.top_logprobs or [])
                ]
        if want and c.routed_experts is not None:
            meta["routed_experts"] = base64.b64encode(
                c.routed_experts.astype(np.int32).tobytes()
            ).decode()
        out: dict[str, Any] = {"text": c.text, "output_ids": c.output_ids, "meta_info": meta}
        if draw.drop_token_ids:
            out.pop("output_ids", None)
        return _json(out)

    async def sglang_abort(request: Request) -> Response:
        body = await _body(request)
        rid = body.get("rid")
        n = engine.scheduler.abort(None if body.get("abort_all") else [str(rid)] if rid else [])
        return _json({"aborted": n})

    # ---------------------------------------------------------------- weights, pause, info
    async def update_weight_version(request: Request) -> Response:
        body = await _body(request)
        new = body.get("new_version")
        if new is None:
            raise _HTTPError(400, "'new_version' is required", param="new_version")
        old = engine.weight_version
        engine.weight_version = str(new)
        return _json(
            {"success": True, "message": f"weight version {old} -> {new}", "new_version": str(new)}
        )

    async def get_weight_version(request: Request) -> Response:
        return _json({"weight_version": engine.weight_version})

    async def pause(request: Request) -> Response:
        mode = request.query_params.get("mode")
        if mode is None and request.method == "POST":
            with contextlib.suppress(_HTTPError):
                mode = (await _body(request)).get("mode")
        mode = mode or "abort"
        if mode not in ("abort", "wait", "keep", "in_place", "retract"):
            raise _HTTPError(
                400, f"pause mode must be abort, wait or keep; got {mode!r}", param="mode"
            )
        if mode == "abort":
            engine.scheduler.abort(None)
        elif mode == "wait":
            while engine.scheduler.num_active:
                await asyncio.sleep(0.005)
        engine.scheduler.pause()
        return _json({"status": "paused", "mode": mode})

    async def resume(request: Request) -> Response:
        engine.scheduler.resume()
        return _json({"status": "resumed"})

    async def is_paused(request: Request) -> Response:
        return _json({"is_paused": engine.scheduler.paused})

    async def tokenize(request: Request) -> Response:
        body = await _body(request)
        if body.get("messages") is not None:
            try:
                text = tok.render_chat(
                    body["messages"],
                    body.get("tools"),
                    add_generation_prompt=bool(body.get("add_generation_prompt", True)),
                    **dict(body.get("chat_template_kwargs") or {}),
                )
            except Exception as exc:
                raise _HTTPError(
                    400, f"cannot render the chat template: {exc}", param="messages"
                ) from exc
        elif isinstance(body.get("prompt"), str):
            text = body["prompt"]
        else:
            raise _HTTPError(400, "send 'prompt' (string) or 'messages'", param="prompt")
        ids = tok.encode(text)
        out: dict[str, Any] = {
            "count": len(ids),
            "max_model_len": engine.model.config.max_model_len,
            "tokens": ids,
            "token_strs": [tok.token_text(t) for t in ids]
            if body.get("return_token_strs")
            else None,
        }
        return _json(out)

    async def detokenize(request: Request) -> Response:
        body = await _body(request)
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            raise _HTTPError(400, "'tokens' must be a list of ints", param="tokens")
        return _json({"prompt": tok.decode(ids)})

    async def models(request: Request) -> Response:
        cards: list[dict[str, Any]] = [
            {
                "id": served,
                "object": "model",
                "created": engine.created,
                "owned_by": "rollwire",
                "root": engine.model_name,
                "parent": None,
                "max_model_len": engine.model.config.max_model_len,
                "permission": [],
            }
            for served in engine.config.served_model_names
        ]
        return _json({"object": "list", "data": cards})

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def model_info(request: Request) -> Response:
        mc = engine.model.config
        return _json(
            {
                "model_path": engine.model_name,
                "tokenizer_path": str(tok.folder),
                "is_generation": True,
                "weight_version": engine.weight_version,
                "max_model_len": mc.max_model_len,
                "num_layers": mc.n_layers,
                "num_experts": mc.n_experts,
                "top_k": mc.top_k,
                "vocab_size": mc.vocab_size,
                "logprobs_mode": engine.config.logprobs_mode,
            }
        )

    routes = [
        Route("/v1/chat/completions", handler(chat), methods=["POST"]),
        Route("/v1/completions", handler(completions), methods=["POST"]),
        Route("/inference/v1/generate", handler(inference_generate), methods=["POST"]),
        Route("/inference/v1/abort_requests", handler(abort_requests), methods=["POST"]),
        Route("/generate", handler(sglang_generate), methods=["POST"]),
        Route("/abort_request", handler(sglang_abort), methods=["POST"]),
        Route("/tokenize", handler(tokenize), methods=["POST"]),
        Route("/detokenize", handler(detokenize), methods=["POST"]),
        Route("/v1/models", handler(models), methods=["GET"]),
        Route("/health", handler(health), methods=["GET"]),
        Route("/update_weight_version", handler(update_weight_version), methods=["POST"]),
        Route("/get_weight_version", handler(get_weight_version), methods=["GET"]),
        Route("/get_model_info", handler(model_info), methods=["GET"]),
        Route("/pause", handler(pause), methods=["POST"]),
        Route("/resume", handler(resume), methods=["POST"]),
        Route("/is_paused", handler(is_paused), methods=["GET"]),
        Route("/pause_generation", handler(pause), methods=["POST"]),
        Route("/continue_generation", handler(resume), methods=["POST"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.engine = engine
    return app


def _without_tools(text: str) -> tuple[str | None, str | None, list[dict[str, Any]]]:
    # tool_choice "none" (or no tools): keep <tool_call> markup as plain content.
    from .parsing import _split_reasoning

    reasoning, rest = _split_reasoning(text)
    return rest, reasoning, []


def _token_route_forced(
    engine: Engine, request: Request, body: dict[str, Any], ids: list[int]
) -> list[int] | None:
    if engine.script is None:
        return None
    # Token-in routes have no messages; recover the ChatML turns so regex rules still match.
    messages = messages_from_prompt(engine.tokenizer.decode(ids))
    return engine.forced_ids(engine.forced_text(messages, None, _session_id(request, body)))


def _completion_logprobs(render: _Renderer, c: Completion) -> dict[str, Any]:
    tokens, offsets, tops = [], [], []
    offset = 0
    for j, t in enumerate(c.output_ids):
        s = render.token(t)
        tokens.append(s)
        offsets.append(offset)
        offset += len(render.tok.token_text(t))
        top = (c.top_logprobs or [[]] * len(c.output_ids))[j]
        d = {render.token(tt): vv for tt, vv in top}
        d.setdefault(s, c.logprobs[j])
        tops.append(d)
    return {
        "tokens": tokens,
        "token_logprobs": list(c.logprobs),
        "top_logprobs": tops,
        "text_offset": offsets,
    }


class _TextStream:
    """Incremental detokenization that never emits half a UTF-8 character or part of a stop string."""

    def __init__(self, engine: Engine, params: SamplingParams) -> None:
        self.tok = engine.tokenizer
        self.params = params
        self.ids: list[int] = []
        self.hold = max((len(s) for s in params.stop), default=1) - 1

    def visible(self, final_text: str | None = None) -> str:
        if final_text is not None:
            return final_text
        text = self.tok.decode(self.ids, skip_special_tokens=self.params.skip_special_tokens)
        while text.endswith("\ufffd"):
            text = text[:-1]
        return text[: len(text) - self.hold] if self.hold else text


async def _chat_stream(
    engine: Engine,
    request: Request,
    body: dict[str, Any],
    prompt_ids: list[int],
    params: list[SamplingParams],
    forced: list[int] | None,
    parse_tools: bool,
    render: _Renderer,
    rid: str,
    created: int,
    name: str,
    draw: FaultDraw,
) -> Response:
    reqs, q = await engine.generate_many(prompt_ids, params, forced=forced, stream=True)
    ret_ids = _bool(body, "return_token_ids", False) and not draw.drop_token_ids
    sglext = _bool(body, "return_output_ids_in_sglext", False) and not draw.drop_token_ids
    want_lp = params[0].logprobs is not None
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    n = len(params)

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        obj = {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": name,
            "choices": choices,
        }
        obj.update(extra)
        return _sse(obj)

    async def gen() -> AsyncIterator[bytes]:
        texts = [_TextStream(engine, p) for p in params]
        parsers = [StreamParser(parse_tools=parse_tools) for _ in params]
        sent = 0
        done = 0
        completion_tokens = 0
        tool_seen = [False] * n
        output_ids: list[int] = []
        try:
            first_extra: dict[str, Any] = {"prompt_token_ids": prompt_ids} if ret_ids else {}
            yield chunk(
                [
                    {
                        "index": i,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                    for i in range(n)
                ],
                **first_extra,
            )
            while done < n:
                i, ev = await q.get()
                if isinstance(ev, Exception):
                    yield _sse(
                        {"error": {"message": str(ev), "type": "InternalServerError", "code": 500}}
                    )
                    return
                if isinstance(ev, TokenEvent):
                    texts[i].ids.append(ev.token_id)
                    frags = parsers[i].feed(texts[i].visible())
                    base: dict[str, Any] = {
                        "index": i,
                        "delta": frags[0] if frags else {},
                        "logprobs": {"content": [render.entry(ev.token_id, ev.logprob, ev.top)]}
                        if want_lp
                        else None,
                        "finish_reason": None,
                    }
                    if ret_ids:
                        base["token_ids"] = [ev.token_id]
                    yield chunk([base])
                    for frag in frags[1:]:
                        extra_choice: dict[str, Any] = {
                            "index": i,
                            "delta": frag,
                            "logprobs": None,
                            "finish_reason": None,
                        }
                        if ret_ids:
                            extra_choice["token_ids"] = []
                        yield chunk([extra_choice])
                    tool_seen[i] = tool_seen[i] or any("tool_calls" in f for f in frags)
                    sent += 1
                    if draw.truncate_stream and sent >= 2:
                        raise _CutStream  # injected fault: the connection drops mid-body
                elif isinstance(ev, Completion):
                    done += 1
                    completion_tokens += len(ev.output_ids)
                    if i == 0:
                        output_ids = list(ev.output_ids)
                    frags = parsers[i].feed(texts[i].visible(ev.text), final=True)
                    tool_seen[i] = tool_seen[i] or any("tool_calls" in f for f in frags)
                    for frag in frags:
                        c: dict[str, Any] = {
                            "index": i,
                            "delta": frag,
                            "logprobs": None,
                            "finish_reason": None,
                        }
                        if ret_ids:
                            c["token_ids"] = []
                        yield chunk([c])
                    finish = (
                        "tool_calls"
                        if tool_seen[i] and ev.finish_reason == "stop"
                        else ev.finish_reason
                    )
                    last: dict[str, Any] = {
                        "index": i,
                        "delta": {},
                        "logprobs": None,
                        "finish_reason": finish,
                        "stop_reason": ev.stop_reason,
                    }
                    if ret_ids:
                        last["token_ids"] = []
                    if _bool(body, "return_weight_versions", False):
                        last["weight_versions"] = ev.weight_versions()
                    yield chunk([last])
            if draw.truncate_stream:
                raise _CutStream
            if sglext:
                yield _sglext_chunk(
                    "chat.completion.chunk", rid, created, name, prompt_ids, output_ids
                )
            if include_usage:
                yield chunk(
                    [],
                    usage={
                        "prompt_tokens": len(prompt_ids),
                        "total_tokens": len(prompt_ids) + completion_tokens,
                        "completion_tokens": completion_tokens,
                        "prompt_tokens_details": None,
                    },
                )
            yield b"data: [DONE]\n\n"
        finally:
            for r in reqs:
                r.abort()

    return _SSEResponse(gen(), media_type="text/event-stream")


async def _completions_stream(
    engine: Engine,
    body: dict[str, Any],
    prompt_ids: list[int],
    params: list[SamplingParams],
    forced: list[int] | None,
    render: _Renderer,
    rid: str,
    created: int,
    name: str,
    draw: FaultDraw,
) -> Response:
    reqs, q = await engine.generate_many(prompt_ids, params, forced=forced, stream=True)
    ret_ids = _bool(body, "return_token_ids", False) and not draw.drop_token_ids
    sglext = _bool(body, "return_output_ids_in_sglext", False) and not draw.drop_token_ids
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    n = len(params)

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        obj = {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": name,
            "choices": choices,
        }
        obj.update(extra)
        return _sse(obj)

    async def gen() -> AsyncIterator[bytes]:
        texts = [_TextStream(engine, p) for p in params]
        emitted = [""] * n
        first = [True] * n
        done = 0
        sent = 0
        completion_tokens = 0
        output_ids: list[int] = []
        try:
            while done < n:
                i, ev = await q.get()
                if isinstance(ev, Exception):
                    yield _sse(
                        {"error": {"message": str(ev), "type": "InternalServerError", "code": 500}}
                    )
                    return
                if isinstance(ev, TokenEvent):
                    texts[i].ids.append(ev.token_id)
                    vis = texts[i].visible()
                    delta, emitted[i] = vis[len(emitted[i]) :], vis
                    c: dict[str, Any] = {
                        "index": i,
                        "text": delta,
                        "logprobs": None,
                        "finish_reason": None,
                    }
                    if params[i].logprobs is not None:
                        s = render.token(ev.token_id)
                        top = {render.token(t): v for t, v in ev.top or []}
                        top.setdefault(s, ev.logprob)
                        c["logprobs"] = {
                            "tokens": [s],
                            "token_logprobs": [ev.logprob],
                            "top_logprobs": [top],
                            "text_offset": [0],
                        }
                    if ret_ids:
                        c["token_ids"] = [ev.token_id]
                        if first[i]:
                            c["prompt_token_ids"] = prompt_ids
                    first[i] = False
                    yield chunk([c])
                    sent += 1
                    if draw.truncate_stream and sent >= 2:
                        raise _CutStream
                elif isinstance(ev, Completion):
                    done += 1
                    completion_tokens += len(ev.output_ids)
                    if i == 0:
                        output_ids = list(ev.output_ids)
                    rest = ev.text[len(emitted[i]) :] if ev.text.startswith(emitted[i]) else ""
                    last: dict[str, Any] = {
                        "index": i,
                        "text": rest,
                        "logprobs": None,
                        "finish_reason": ev.finish_reason,
                        "stop_reason": ev.stop_reason,
                    }
                    if ret_ids:
                        last["token_ids"] = []
                    yield chunk([last])
            if draw.truncate_stream:
                raise _CutStream
            if sglext:
                yield _sglext_chunk("text_completion", rid, created, name, prompt_ids, output_ids)
            if include_usage:
                yield chunk(
                    [],
                    usage={
                        "prompt_tokens": len(prompt_ids),
                        "total_tokens": len(prompt_ids) + completion_tokens,
                        "completion_tokens": completion_tokens,
                    },
                )
            yield b"data: [DONE]\n\n"
        finally:
            for r in reqs:
                r.abort()

    return _SSEResponse(gen(), media_type="text/event-stream")


class EmbeddedEngine:
    """The embedded engine served on a background thread: ``with EmbeddedEngine() as eng: eng.base_url``.

    ``url`` is ``http://host:port``; ``base_url`` adds ``/v1`` for OpenAI clients.
    """

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        **overrides: Any,
    ) -> None:
        cfg = config or EngineConfig()
        if overrides:
            cfg = replace(cfg, **overrides)
        self.config = cfg
        self.app = create_app(cfg)
        self.engine: Engine = self.app.state.engine
        self._server = ServerThread(self.app, host=host, port=port)
        self.url = self._server.url
        self.base_url = self.url + "/v1"

    @property
    def tokenizer(self) -> EngineTokenizer:
        """The engine's tokenizer."""
        return self.engine.tokenizer

    @property
    def model(self) -> TinyModel:
        """The engine's model."""
        return self.engine.model

    @property
    def port(self) -> int:
        """The TCP port served."""
        return self._server.port

    def start(self) -> EmbeddedEngine:
        """Start serving; returns self once the socket accepts connections."""
        self._server.start()
        return self

    def stop(self) -> None:
        """Stop the server and the worker thread."""
        self._server.stop()
        self.engine.scheduler.stop()

    def __enter__(self) -> EmbeddedEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_in_thread(
    config: EngineConfig | None = None, *, host: str = "127.0.0.1", port: int | None = None
) -> EmbeddedEngine:
    """Start an :class:`EmbeddedEngine` and return it (call ``.stop()`` when done)."""
    return EmbeddedEngine(config, host=host, port=port).start()
