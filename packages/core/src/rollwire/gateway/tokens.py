"""``capture="tokens"``: the gateway owns tokenization (DESIGN §4.2).

For each chat request: render the prompt with the model's chat template, healed from the session's
earlier calls so the exact sampled ids are reused (:mod:`rollwire.gateway.tokens_heal`); generate
on a token-in backend (:mod:`rollwire.gateway.tokens_backend`); parse the completion into content,
reasoning and tool calls (:mod:`rollwire.gateway.parsers`); commit the call; answer in OpenAI form,
streamed or not (:mod:`rollwire.gateway.tokens_response`).

The tokenizer is the first of: the session's ``metadata["tokenizer"]``, ``$ROLLWIRE_TOKENIZER``,
the ``tokenizer_path`` the backend advertises on ``GET /get_model_info`` (SGLang, the embedded
engine) or the ``root`` of ``GET /v1/models`` (vLLM). Loaded renderers and what backends say
about themselves are kept per gateway (:class:`TokensRuntime`), healing state per session.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp
import numpy as np
import orjson
from starlette.responses import Response, StreamingResponse

from rollwire.data.protocol import ModelCall
from rollwire.gateway.capture import resolve_policy_version
from rollwire.gateway.errors import error_response
from rollwire.gateway.parsers import (
    ParsedCompletion,
    TemplateNotSupported,
    ToolParser,
    check_template_supported,
    detect_parser,
    parse_completion,
)
from rollwire.gateway.render import ChatRenderer, MissingTokensExtra
from rollwire.gateway.tokens_backend import (
    TOKEN_KINDS,
    BackendFailure,
    Generation,
    generate,
    sampling_payload,
)
from rollwire.gateway.tokens_heal import FullRender, Healer, HealResult
from rollwire.gateway.tokens_response import chat_completion, iterate, sse_chunks

if TYPE_CHECKING:
    from rollwire.gateway.app import Gateway
    from rollwire.gateway.backends import Backend
    from rollwire.gateway.context import ChatContext

__all__ = ["BackendInfo", "TokensRuntime", "check_session", "handle_chat", "runtime_of"]

_STATE_KEY = "tokens.healer"
_RUNTIME_KEY = "tokens_runtime"
_DEFAULT_TIMEOUT = 600.0  # GatewayConfig.upstream_timeout's default, for a context without gateway
# Completions longer than this are decoded, parsed and turned into the response in a worker thread
# (about 0.2 ms per 1k tokens, ~3 ms per 1k with per-token logprob text; less stays inline, where
# it is cheaper than the thread hop). Measured on the embedded engine's tokenizer.
_INLINE_TOKENS = 4096
_INLINE_TOKENS_WITH_LOGPROBS = 256


@dataclass(frozen=True)
class BackendInfo:
    """What a backend says about itself: its tokenizer and MoE routing shape (when it tells)."""

    tokenizer: str | None
    experts_shape: tuple[int, int] | None


async def _fetch_json(http: aiohttp.ClientSession, url: str) -> Any:
    with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=10)) as resp:
            if resp.status == 200:
                return await resp.json(content_type=None)
    return None


class TokensRuntime:
    """Tokens-mode state shared by one gateway's sessions: loaded renderers (one per tokenizer)
    and what each backend says about itself. Owned by the gateway (see :func:`runtime_of`)."""

    def __init__(self) -> None:
        self._renderers: dict[str, ChatRenderer] = {}
        self._lock = threading.Lock()
        self._backend_info: dict[str, BackendInfo] = {}

    def load_renderer(self, tokenizer: str) -> ChatRenderer:
        """A :class:`ChatRenderer` for a tokenizer folder, loaded once (blocking; thread-safe)."""
        with self._lock:
            renderer = self._renderers.get(tokenizer)
            if renderer is None:
                renderer = ChatRenderer.from_dir(tokenizer)
                self._renderers[tokenizer] = renderer
            return renderer

    async def renderer(self, tokenizer: str) -> ChatRenderer:
        """:meth:`load_renderer` without blocking the event loop on a first load."""
        cached = self._renderers.get(tokenizer)
        if cached is not None:
            return cached
        return await asyncio.to_thread(self.load_renderer, tokenizer)

    async def describe(self, http: aiohttp.ClientSession, url: str) -> BackendInfo:
        """Ask the backend at ``url`` for its tokenizer and routing shape (cached once answered)."""
        info = self._backend_info.get(url)
        if info is not None:
            return info
        tokenizer = None
        shape = None
        model_info = await _fetch_json(http, url + "/get_model_info")
        if isinstance(model_info, dict):
            tokenizer = model_info.get("tokenizer_path") or model_info.get("model_path")
            layers, top_k = model_info.get("num_layers"), model_info.get("top_k")
            if isinstance(layers, int) and isinstance(top_k, int):
                shape = (layers, top_k)
        if tokenizer is None:
            models = await _fetch_json(http, url + "/v1/models")
            data = models.get("data") if isinstance(models, dict) else None
            if data:
                tokenizer = data[0].get("root") or data[0].get("id")
        info = BackendInfo(tokenizer=str(tokenizer) if tokenizer else None, experts_shape=shape)
        if tokenizer or shape:  # an unreachable backend is asked again next time
            self._backend_info[url] = info
        return info


def runtime_of(gateway: Gateway | None) -> TokensRuntime:
    """The gateway's :class:`TokensRuntime`, created on first use; a fresh one without gateway.

    Kept in the gateway instance's own attributes, so it lives and dies with that gateway (no
    process-wide state: two gateways in one process share nothing).
    """
    if gateway is None:
        return TokensRuntime()
    attrs = vars(gateway)
    runtime = attrs.get(_RUNTIME_KEY)
    if not isinstance(runtime, TokensRuntime):
        runtime = attrs[_RUNTIME_KEY] = TokensRuntime()
    return runtime


def _ctx_runtime(ctx: ChatContext) -> TokensRuntime:
    if ctx.gateway is not None:
        return runtime_of(ctx.gateway)
    # Outside a gateway (unit tests): per session, so a session's calls still share one renderer.
    runtime = ctx.state.get(_RUNTIME_KEY)
    if not isinstance(runtime, TokensRuntime):
        runtime = ctx.state[_RUNTIME_KEY] = TokensRuntime()
    return runtime


def _kind_refusal(backend: Backend) -> str:
    return (
        f"capture='tokens' needs a token-in backend (vllm or sglang); backend "
        f"{backend.name!r} at {backend.url} is kind {backend.kind!r}. Register the server with "
        "kind='vllm' or 'sglang', or create the session with capture='passthrough'"
    )


async def check_session(
    metadata: Mapping[str, Any] | None,
    backend: Backend | None,
    *,
    gateway: Gateway | None = None,
) -> None:
    """Check, when a ``capture="tokens"`` session is created, that its calls can be served.

    Resolves the tokenizer and chat template exactly as a request would (``metadata["tokenizer"]``,
    ``$ROLLWIRE_TOKENIZER``, what ``backend`` advertises) and raises ``ValueError`` saying what to
    do when none is found, it cannot be loaded, ``backend`` is not token-in, or no tool-call parser
    matches the template. Pass ``gateway`` to reuse its HTTP client and renderer cache.
    """
    if backend is not None and backend.kind not in TOKEN_KINDS:
        raise ValueError(_kind_refusal(backend))
    runtime = runtime_of(gateway)
    info = BackendInfo(None, None)
    if backend is not None:
        if gateway is not None:
            info = await runtime.describe(gateway.http, backend.url)
        else:
            async with aiohttp.ClientSession() as http:
                info = await runtime.describe(http, backend.url)
    try:
        source = _tokenizer_source(metadata, info, backend.url if backend else None)
        renderer = await runtime.renderer(source)
    except LookupError as exc:
        raise ValueError(str(exc)) from exc
    except MissingTokensExtra as exc:
        raise ValueError(str(exc)) from exc
    check_template_supported(renderer, tools=True)


def _tokenizer_source(
    metadata: Mapping[str, Any] | None, info: BackendInfo, backend_url: str | None
) -> str:
    meta = metadata or {}
    for candidate in (meta.get("tokenizer"), os.environ.get("ROLLWIRE_TOKENIZER"), info.tokenizer):
        if candidate:
            return str(candidate)
    where = f"backend {backend_url} does not name one" if backend_url else "no backend names one"
    raise LookupError(
        f"capture='tokens' needs the model's tokenizer and {where}: create the session with "
        "metadata={'tokenizer': '/path/to/hf/folder'} or set ROLLWIRE_TOKENIZER"
    )


def _strip_stop(text: str, gen: Generation) -> str:
    stop = gen.stop_reason
    if isinstance(stop, str) and stop and text.endswith(stop):
        return text[: -len(stop)]
    return text


def _merged_kwargs(ctx: ChatContext) -> dict[str, Any]:
    agent = ctx.body.get("chat_template_kwargs")
    kwargs: dict[str, Any] = dict(agent) if isinstance(agent, Mapping) else {}
    kwargs.update(ctx.session.chat_template_kwargs or {})
    return kwargs


def _openai_finish(gen: Generation, parsed: ParsedCompletion) -> str:
    if gen.finish_reason == "stop" and parsed.tool_calls:
        return "tool_calls"
    return gen.finish_reason


def _constraints(body: Mapping[str, Any]) -> list[str]:
    """The request keys that constrain sampling (guided decoding, ``logit_bias``), by name."""
    found = []
    if body.get("logit_bias"):
        found.append("logit_bias")
    rf = body.get("response_format")
    if isinstance(rf, dict) and rf.get("type") not in (None, "text"):
        found.append(f"response_format (type {rf.get('type')!r})")
    found += sorted(k for k, v in body.items() if k.startswith("guided_") and v is not None)
    if body.get("structured_outputs") is not None:
        found.append("structured_outputs")
    return found


def _constraint_refusal(keys: list[str]) -> str:
    return (
        f"capture='tokens' does not apply {', '.join(keys)}: the gateway generates on the "
        "backend's token-in route, where this constraint is not applied faithfully, and sampling "
        "without it would return something the agent did not ask for. Drop it from the request "
        "(and from the session's sampling), or create the session with capture='passthrough'"
    )


@dataclass
class _Answer:
    """The parsed completion and the OpenAI response built from it."""

    parsed: ParsedCompletion
    finish: str
    response: dict[str, Any]


def _answer(
    renderer: ChatRenderer,
    gen: Generation,
    parser: ToolParser | None,
    parse_tools: Any,
    prompt_ids: np.ndarray,
    body: Mapping[str, Any],
) -> _Answer:
    """Decode and parse the completion and build the response (pure; may run in a thread)."""
    completion = gen.completion_ids
    visible = completion
    while visible.size and int(visible[-1]) in renderer.special_ids:
        visible = visible[:-1]
    text = _strip_stop(renderer.decode(visible), gen)
    parsed = parse_completion(text, parser, parse_tools)
    finish = _openai_finish(gen, parsed)
    response = chat_completion(
        model=str(body.get("model") or "policy"),
        parsed=parsed,
        finish_reason=finish,
        prompt_ids=prompt_ids,
        completion_ids=completion,
        logprobs=gen.logprobs,
        token_text=renderer.token_text,
        want_logprobs=bool(body.get("logprobs")),
        want_token_ids=bool(body.get("return_token_ids")),
    )
    return _Answer(parsed, finish, response)


async def _heal(
    healer: Healer, messages: list[Any], tools: Any, kwargs: dict[str, Any]
) -> HealResult:
    # Healing costs what the new messages cost (~0.4 ms): inline. A full render grows with the
    # history (tens of ms at 100+ turns): in a worker thread, so other sessions keep moving.
    step = healer.heal(messages, tools, kwargs)
    if isinstance(step, FullRender):
        return await asyncio.to_thread(step.run)
    return step


def _other_backend(ctx: ChatContext, failed: Backend) -> Backend | None:
    """Another healthy token-in backend for this session, when the gateway has one."""
    if ctx.gateway is None:
        return None
    other = ctx.gateway.pool.pick(ctx.session.session_id, exclude=frozenset({failed.name}))
    if other is None or not other.healthy or other.kind not in TOKEN_KINDS:
        return None
    return other


async def _generate(
    ctx: ChatContext,
    runtime: TokensRuntime,
    source: str,
    info: BackendInfo,
    prompt_ids: np.ndarray,
    effective: dict[str, Any],
    top_logprobs: int,
    call_id: str,
) -> tuple[Backend, Generation]:
    """Generate on the call's backend; on a connection failure, once more on another healthy
    backend that serves the same tokenizer. Raises :class:`BackendFailure` (``.backend`` set)."""
    cfg = ctx.gateway.config if ctx.gateway is not None else None
    timeout = cfg.upstream_timeout if cfg is not None else _DEFAULT_TIMEOUT
    connect_timeout = cfg.connect_timeout if cfg is not None else None
    backend = ctx.backend

    async def attempt(target: Backend, target_info: BackendInfo) -> Generation:
        payload = sampling_payload(
            target.kind,
            prompt_ids,
            effective,
            top_logprobs=top_logprobs,
            request_id=call_id,
            session_id=ctx.session.session_id,
        )
        return await generate(
            ctx.http,
            target.url,
            target.kind,
            payload,
            prompt_len=int(prompt_ids.shape[0]),
            experts_shape=target_info.experts_shape,
            timeout=timeout,
            connect_timeout=connect_timeout,
        )

    try:
        return backend, await attempt(backend, info)
    except BackendFailure as exc:
        exc.backend = backend.name
        if not exc.connection:
            raise
        ctx.mark_backend_failed()
        first = exc
    other = _other_backend(ctx, backend)
    if other is None:
        raise first
    other_info = await runtime.describe(ctx.http, other.url)
    try:
        same_tokenizer = _tokenizer_source(ctx.session.metadata, other_info, other.url) == source
    except LookupError:
        same_tokenizer = False
    if not same_tokenizer:  # its ids would stand for other tokens: fail rather than mis-sample
        raise first
    other.in_flight += 1
    try:
        return other, await attempt(other, other_info)
    except BackendFailure as exc:
        exc.backend = other.name
        if exc.connection and ctx.gateway is not None:
            ctx.gateway.pool.mark_failed(other)
        raise
    finally:
        other.in_flight -= 1


async def handle_chat(ctx: ChatContext) -> Response:
    """Serve one chat-completions request of a ``capture="tokens"`` session (see module docs)."""
    started = ctx.started_at or time.time()
    t0 = time.perf_counter()
    body = ctx.body
    request = dict(body)
    if ctx.backend.kind not in TOKEN_KINDS:
        return error_response(400, _kind_refusal(ctx.backend))
    messages = body.get("messages")
    if (
        not isinstance(messages, list)
        or not messages
        or not all(isinstance(m, dict) for m in messages)
    ):
        return error_response(400, "'messages' must be a non-empty list of message objects")
    n = body.get("n")
    if isinstance(n, int) and n > 1:
        return error_response(
            400, f"capture='tokens' serves one choice per request; got n={n}. Send n requests"
        )
    try:
        effective, flags = ctx.apply_sampling(body)
    except ValueError as exc:
        return error_response(400, str(exc))
    constraints = _constraints(body)
    if constraints:
        return error_response(400, _constraint_refusal(constraints))
    runtime = _ctx_runtime(ctx)
    try:
        info = await runtime.describe(ctx.http, ctx.backend.url)
        source = _tokenizer_source(ctx.session.metadata, info, ctx.backend.url)
        renderer = await runtime.renderer(source)
    except (LookupError, ValueError, MissingTokensExtra) as exc:
        return error_response(400, str(exc))
    tools = body.get("tools") or None
    parse_tools = None if body.get("tool_choice") == "none" else tools
    parser = detect_parser(renderer.chat_template)
    if tools and parser is None:
        return error_response(400, str(_unsupported(renderer)))
    kwargs = _merged_kwargs(ctx)

    healer = ctx.state.get(_STATE_KEY)
    if not isinstance(healer, Healer) or healer.renderer is not renderer:
        healer = Healer(renderer)
        ctx.state[_STATE_KEY] = healer
    try:
        heal = await _heal(healer, messages, tools, kwargs)
    except Exception as exc:  # a template raising on these messages (jinja TemplateError...)
        return error_response(400, f"the chat template could not render these messages: {exc}")

    top = body.get("top_logprobs") if body.get("logprobs") else 0
    call_id = ctx.new_call_id()
    try:
        backend, gen = await _generate(
            ctx, runtime, source, info, heal.prompt_ids, effective, int(top or 0), call_id
        )
    except BackendFailure as exc:
        failed = ModelCall(
            call_id=call_id,
            session_id=ctx.session.session_id,
            index=0,
            prompt_ids=heal.prompt_ids,
            status="failed",
            error=exc.message,
            sampling=effective,
            flags=list(flags),
            backend=exc.backend or ctx.backend.name,
            capture="tokens",
            branch=heal.branch,
            fork_reason=heal.fork_reason,
            stream=bool(body.get("stream")),
            started_at=started,
            latency_ms=(time.perf_counter() - t0) * 1e3,
            request=request,
        )
        await ctx.commit(failed)
        return error_response(
            exc.status,
            exc.message,
            type="server_error" if exc.status >= 500 else "invalid_request_error",
        )

    completion = gen.completion_ids
    args = (renderer, gen, parser, parse_tools, heal.prompt_ids, body)
    inline = _INLINE_TOKENS_WITH_LOGPROBS if body.get("logprobs") else _INLINE_TOKENS
    if completion.shape[0] > inline:
        answer = await asyncio.to_thread(_answer, *args)
    else:
        answer = _answer(*args)
    all_flags = list(flags)
    if answer.parsed.ill_formed:
        all_flags.append("ill_formed")
    version, mismatch = resolve_policy_version(gen.weight_version, ctx.policy_version)
    if mismatch:
        all_flags.append("policy_version_mismatch")
    response = answer.response
    call = ModelCall(
        call_id=call_id,
        session_id=ctx.session.session_id,
        index=0,
        prompt_ids=heal.prompt_ids,
        completion_ids=completion,
        logprobs=gen.logprobs,
        routed_experts=_experts(gen.routed_experts, heal.prompt_ids, completion),
        finish_reason=answer.finish,
        sampling=effective,
        trainable=not ctx.off_policy_blocked(flags),
        off_policy=bool(flags),
        flags=all_flags,
        policy_version=version,
        backend=backend.name,
        logprobs_mode="raw" if backend.kind == "vllm" else "processed",
        capture="tokens",
        branch=heal.branch,
        fork_reason=heal.fork_reason,
        stream=bool(body.get("stream")),
        started_at=started,
        latency_ms=(time.perf_counter() - t0) * 1e3,
        request=request,
        response=response,
    )
    await ctx.commit(call)
    healer.record(heal, messages, tools, kwargs, completion, response["choices"][0]["message"])
    if body.get("stream"):
        opts = body.get("stream_options")
        usage = bool(isinstance(opts, dict) and opts.get("include_usage"))
        return StreamingResponse(
            iterate(sse_chunks(response, usage)),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )
    return Response(orjson.dumps(response), media_type="application/json")


def _experts(
    experts: np.ndarray | None, prompt: np.ndarray, completion: np.ndarray
) -> np.ndarray | None:
    if experts is None:
        return None
    if experts.shape[0] != prompt.shape[0] + completion.shape[0] - 1:
        return None
    return experts


def _unsupported(renderer: ChatRenderer) -> TemplateNotSupported:
    try:
        check_template_supported(renderer)
    except TemplateNotSupported as exc:
        return exc
    return TemplateNotSupported("no tool-call parser matches this chat template")
