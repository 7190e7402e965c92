"""HTTP server of the embedded engine: vLLM's OpenAI-compatible routes plus SGLang's ``/generate``.

Shapes follow ``SERVER_APIS.md`` (vLLM 0.33 / SGLang 0.5). Model work runs on the scheduler's
worker thread; handlers only await its events, so the event loop never blocks on NumPy.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
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

from ..serving import ServerThread
from .config import EngineConfig
from .faults import FaultDraw, FaultInjector
from .model import ModelConfig, TinyModel
from .parsing import StreamParser, parse_assistant_text
from .sampling import SamplingParams
from .scheduler import Completion, GenerationRequest, Scheduler, TokenEvent
from .scripted import Script, load_script, messages_from_prompt
from .tokenizer import EngineTokenizer

__all__ = ["EmbeddedEngine", "Engine", "create_app", "serve_in_thread"]


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


def _sse(data: Any) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


def _npy_b64(arr: np.ndarray) -> str:
    buf = io.BytesIO()
    np.save(buf, arr.astype(np.int32), allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode()


def _as_list(v: Any) -> list[Any]:
    if v is None:
        return []
    return [v] if isinstance(v, str) else list(v)


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

    def forced_ids(
        self, messages: list[dict[str, Any]] | None, tools: Any, session_id: str | None
    ) -> list[int] | None:
        """Token ids the script forces for this request (ending in ``<|im_end|>``), or None."""
        if self.script is None:
            return None
        try:
            text = self.script.lookup(messages, tools, session_id)
        except Exception as exc:
            raise _HTTPError(500, f"the script raised {type(exc).__name__}: {exc}") from exc
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
                    raise _HTTPError(400 if isinstance(ev, ValueError) else 500, str(ev))
                if isinstance(ev, Completion):
                    done[i] = ev
        finally:
            for r in reqs:
                if not r.aborted and len(done) < len(reqs):
                    r.abort()
        return [done[i] for i in range(len(reqs))]


# ---------------------------------------------------------------------- request parsing helpers
def _params(
    body: dict[str, Any], engine: Engine, *, sglang: bool = False, n_index: int = 0
) -> SamplingParams:
    try:
        if sglang:
            sp = body.get("sampling_params") or {}
            max_tokens = sp.get("max_new_tokens", 128)
            seed = sp.get("sampling_seed", sp.get("seed"))
            return SamplingParams(
                max_tokens=int(max_tokens),
                temperature=float(sp.get("temperature", 1.0)),
                top_p=float(sp.get("top_p", 1.0)),
                top_k=int(sp.get("top_k", -1)),
                min_p=float(sp.get("min_p", 0.0)),
                stop=_as_list(sp.get("stop")),
                stop_token_ids=[int(t) for t in sp.get("stop_token_ids") or []],
                ignore_eos=bool(sp.get("ignore_eos", False)),
                seed=None if seed is None else int(seed),
                logprobs=int(body.get("top_logprobs_num", 0) or 0)
                if body.get("return_logprob")
                else None,
                skip_special_tokens=bool(sp.get("skip_special_tokens", True)),
                include_stop_str_in_output=bool(sp.get("no_stop_trim", False)),
            )
        max_tokens = body.get("max_completion_tokens")
        if max_tokens is None:
            max_tokens = body.get("max_tokens")
        if max_tokens is None:
            max_tokens = engine.config.default_max_tokens
        temperature = body.get("temperature")
        seed = body.get("seed")
        if seed is not None and n_index:
            seed = int(seed) + n_index
        top_k = body.get("top_k")
        return SamplingParams(
            max_tokens=int(max_tokens),
            temperature=1.0 if temperature is None else float(temperature),
            top_p=float(body["top_p"]) if body.get("top_p") is not None else 1.0,
            top_k=-1 if top_k is None else int(top_k),
            min_p=float(body.get("min_p") or 0.0),
            stop=_as_list(body.get("stop")),
            stop_token_ids=[int(t) for t in body.get("stop_token_ids") or []],
            ignore_eos=bool(body.get("ignore_eos", False)),
            seed=None if seed is None else int(seed),
            skip_special_tokens=bool(body.get("skip_special_tokens", True)),
            include_stop_str_in_output=bool(body.get("include_stop_str_in_output", False)),
        )
    except (TypeError, ValueError) as exc:
        raise _HTTPError(400, f"invalid sampling parameters: {exc}") from exc


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
    if not body.get("logprobs"):
        return None
    k = int(body.get("top_logprobs") or 0)
    if k < 0 or k > engine.config.max_top_logprobs:
        raise _HTTPError(
            400,
            f"top_logprobs must be in [0, {engine.config.max_top_logprobs}], got {k}",
            param="top_logprobs",
        )
    return k


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

        return wrapped

    tok = engine.tokenizer

    # ---------------------------------------------------------------- chat
    async def chat(request: Request) -> Response:
        body = await _body(request)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _HTTPError(400, "'messages' must be a non-empty list", param="messages")
        tools = body.get("tools")
        if tools is not None and len(tools) == 0:
            # vLLM refuses an empty tools list; keep the same behaviour so gateway tests see it.
            raise _HTTPError(
                400,
                "'tools' must not be an empty list; omit it when there are no tools",
                param="tools",
            )
        tool_choice = body.get("tool_choice", "auto" if tools else "none")
        parse_tools = bool(tools) and tool_choice != "none"
        draw = await _apply_faults(engine)
        kwargs = dict(body.get("chat_template_kwargs") or {})
        try:
            prompt = tok.render_chat(
                messages,
                tools,
                add_generation_prompt=bool(body.get("add_generation_prompt", True)),
                **kwargs,
            )
        except Exception as exc:
            raise _HTTPError(
                400, f"cannot render the chat template: {exc}", param="messages"
            ) from exc
        prompt_ids = tok.encode(prompt)
        n = int(body.get("n") or 1)
        top_k = _top_k_requested(body, engine)
        params = [_params(body, engine, n_index=i) for i in range(n)]
        pl = body.get("prompt_logprobs")
        for p in params:
            p.logprobs = top_k
            p.prompt_logprobs = None if pl is None else int(pl)
        forced = engine.forced_ids(messages, tools, _session_id(request, body))
        want_experts = engine.config.return_routed_experts
        ret_ids = bool(body.get("return_token_ids"))
        ret_versions = bool(body.get("return_weight_versions"))
        render = _Renderer(engine, bool(body.get("return_tokens_as_token_ids")))
        rid = "chatcmpl-" + uuid.uuid4().hex
        created = int(time.time())
        name = body.get("model") or engine.model_name
        if body.get("stream"):
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
                "token_ids": c.output_ids if ret_ids else None,
            }
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
            "prompt_token_ids": prompt_ids if ret_ids else None,
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
            raise _HTTPError(
                400,
                "'prompt' must be a string or a list of token ids (one prompt per request)",
                param="prompt",
            )
        draw = await _apply_faults(engine)
        n = int(body.get("n") or 1)
        k = body.get("logprobs")
        if k is not None and not 0 <= int(k) <= engine.config.max_top_logprobs:
            raise _HTTPError(
                400,
                f"logprobs must be in [0, {engine.config.max_top_logprobs}], got {k}",
                param="logprobs",
            )
        params = [_params(body, engine, n_index=i) for i in range(n)]
        pl = body.get("prompt_logprobs")
        for p in params:
            p.logprobs = None if k is None else int(k)
            p.prompt_logprobs = None if pl is None else int(pl)
        forced = _token_route_forced(engine, request, body, prompt_ids)
        ret_ids = bool(body.get("return_token_ids"))
        render = _Renderer(engine, bool(body.get("return_tokens_as_token_ids")))
        rid = "cmpl-" + uuid.uuid4().hex
        created = int(time.time())
        name = body.get("model") or engine.model_name
        want_experts = engine.config.return_routed_experts
        if body.get("stream"):
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
            raise _HTTPError(400, "'token_ids' must be a list of ints", param="token_ids")
        draw = await _apply_faults(engine)
        sp = dict(body.get("sampling_params") or {})
        params = _params(sp, engine)
        lp = sp.get("logprobs")
        params.logprobs = None if lp is None else int(lp)
        top_n = None if lp is None else int(lp)
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
        draw = await _apply_faults(engine)
        params = _params(body, engine, sglang=True)
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
            "cached_tokens": 0,
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
        card = {
            "id": engine.model_name,
            "object": "model",
            "created": engine.created,
            "owned_by": "rollwire",
            "root": engine.model_name,
            "parent": None,
            "max_model_len": engine.model.config.max_model_len,
            "permission": [],
        }
        return _json({"object": "list", "data": [card]})

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
    return engine.forced_ids(messages, None, _session_id(request, body))


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
    ret_ids = bool(body.get("return_token_ids")) and not draw.drop_token_ids
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
                        return  # injected fault: the connection ends without [DONE]
                elif isinstance(ev, Completion):
                    done += 1
                    completion_tokens += len(ev.output_ids)
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
                    if body.get("return_weight_versions"):
                        last["weight_versions"] = ev.weight_versions()
                    yield chunk([last])
            if draw.truncate_stream:
                return
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

    return StreamingResponse(gen(), media_type="text/event-stream")


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
    ret_ids = bool(body.get("return_token_ids")) and not draw.drop_token_ids
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
                        return
                elif isinstance(ev, Completion):
                    done += 1
                    completion_tokens += len(ev.output_ids)
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
                return
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

    return StreamingResponse(gen(), media_type="text/event-stream")


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
