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
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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
from rollwire.gateway.tokens_runtime import (
    BackendInfo,
    TokensRuntime,
    check_session,
    ctx_runtime,
    kind_refusal,
    runtime_of,
    tokenizer_source,
)

if TYPE_CHECKING:
    from rollwire.gateway.backends import Backend
    from rollwire.gateway.context import ChatContext

__all__ = ["BackendInfo", "TokensRuntime", "check_session", "handle_chat", "runtime_of"]

_STATE_KEY = "tokens.healer"
_DEFAULT_TIMEOUT = 600.0  # GatewayConfig.upstream_timeout's default, for a context without gateway
# Completions longer than this are decoded, parsed and turned into the response in a worker thread
# (about 0.2 ms per 1k tokens, ~3 ms per 1k with per-token logprob text; less stays inline, where
# it is cheaper than the thread hop). Measured on the embedded engine's tokenizer.
_INLINE_TOKENS = 4096
_INLINE_TOKENS_WITH_LOGPROBS = 256


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
        top_logprobs=gen.top_logprobs,
        top_n=int(body.get("top_logprobs") or 0),
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
        same_tokenizer = (
            tokenizer_source(ctx.session.metadata, other_info, other.url, other.tokenizer) == source
        )
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


class _Refused(Exception):
    """A request refused before generation: the 4xx to answer with (nothing is recorded)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.response = error_response(status, message)


@dataclass
class _Plan:
    """What a validated request generates with: renderer, parser, healed prompt, sampling."""

    runtime: TokensRuntime
    info: BackendInfo
    source: str
    renderer: ChatRenderer
    parser: ToolParser | None
    tools: Any
    parse_tools: Any
    kwargs: dict[str, Any]
    healer: Healer
    heal: HealResult
    effective: dict[str, Any]
    flags: list[str]


def _check_request(ctx: ChatContext) -> list[dict[str, Any]]:
    """The request's messages, after the checks that need no backend (raises :class:`_Refused`)."""
    body = ctx.body
    if ctx.backend.kind not in TOKEN_KINDS:
        raise _Refused(400, kind_refusal(ctx.backend))
    messages = body.get("messages")
    if (
        not isinstance(messages, list)
        or not messages
        or not all(isinstance(m, dict) for m in messages)
    ):
        raise _Refused(400, "'messages' must be a non-empty list of message objects")
    n = body.get("n")
    if isinstance(n, int) and n > 1:
        raise _Refused(
            400, f"capture='tokens' serves one choice per request; got n={n}. Send n requests"
        )
    return messages


async def _plan(ctx: ChatContext, messages: list[dict[str, Any]]) -> _Plan:
    """Sampling, tokenizer, parser and the healed prompt for this request (or :class:`_Refused`)."""
    body = ctx.body
    try:
        effective, flags = ctx.apply_sampling(body)
    except ValueError as exc:
        raise _Refused(400, str(exc)) from exc
    constraints = _constraints(body)
    if constraints:
        raise _Refused(400, _constraint_refusal(constraints))
    runtime = ctx_runtime(ctx)
    try:
        info = await runtime.describe(ctx.http, ctx.backend.url)
        source = tokenizer_source(
            ctx.session.metadata, info, ctx.backend.url, ctx.backend.tokenizer
        )
        renderer = await runtime.renderer(source)
    except (LookupError, ValueError, MissingTokensExtra) as exc:
        raise _Refused(400, str(exc)) from exc
    tools = body.get("tools") or None
    parse_tools = None if body.get("tool_choice") == "none" else tools
    parser = detect_parser(renderer.chat_template)
    if tools and parser is None:
        raise _Refused(400, str(_unsupported(renderer)))
    kwargs = _merged_kwargs(ctx)
    healer = ctx.state.get(_STATE_KEY)
    if not isinstance(healer, Healer) or healer.renderer is not renderer:
        healer = Healer(renderer)
        ctx.state[_STATE_KEY] = healer
    try:
        heal = await _heal(healer, messages, tools, kwargs)
    except Exception as exc:  # a template raising on these messages (jinja TemplateError...)
        raise _Refused(400, f"the chat template could not render these messages: {exc}") from exc
    effective = _cap_to_context(effective, len(heal.prompt_ids), info.max_model_len)
    return _Plan(
        runtime, info, source, renderer, parser, tools, parse_tools, kwargs, healer, heal,
        effective, flags,
    )  # fmt: skip


def _cap_to_context(
    effective: dict[str, Any], prompt_len: int, context: int | None
) -> dict[str, Any]:
    """``max_tokens`` capped to what the backend's context leaves after the prompt. vLLM's token-in
    route would otherwise generate to the end of the context (its OpenAI routes answer 400)."""
    if context is None:
        return effective
    room = context - prompt_len
    if room <= 0:
        raise _Refused(
            400,
            f"the prompt ({prompt_len} tokens) fills the backend's context (max_model_len "
            f"{context}); shorten the conversation",
        )
    asked = effective.get("max_tokens")
    if isinstance(asked, int) and asked <= room:
        return effective
    return {**effective, "max_tokens": room}


async def _record_failure(
    ctx: ChatContext, plan: _Plan, exc: BackendFailure, call_id: str, request: dict[str, Any],
    started: float, t0: float,
) -> Response:  # fmt: skip
    """Commit the failed call (its prompt, no completion) and answer the backend's error."""
    failed = ModelCall(
        call_id=call_id,
        session_id=ctx.session.session_id,
        index=0,
        prompt_ids=plan.heal.prompt_ids,
        status="failed",
        error=exc.message,
        sampling=plan.effective,
        flags=list(plan.flags),
        backend=exc.backend or ctx.backend.name,
        capture="tokens",
        branch=plan.heal.branch,
        fork_reason=plan.heal.fork_reason,
        stream=bool(ctx.body.get("stream")),
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


def _captured_call(
    ctx: ChatContext, plan: _Plan, backend: Backend, gen: Generation, answer: _Answer,
    call_id: str, request: dict[str, Any], started: float, t0: float,
) -> ModelCall:  # fmt: skip
    """The call as it is stored: ids, log-probs, experts, flags and the answer sent."""
    all_flags = list(plan.flags)
    if answer.parsed.ill_formed:
        all_flags.append("ill_formed")
    choice = ctx.body.get("tool_choice")
    if choice == "required" or isinstance(choice, dict):
        # tokens mode samples freely (no grammar): the call is on-policy, but the agent's
        # constraint was not applied, which it should be able to see
        all_flags.append("tool_choice_ignored")
    version, version_flag = resolve_policy_version(gen.weight_version, ctx.policy_version)
    if version_flag:
        all_flags.append(version_flag)
    heal, completion = plan.heal, gen.completion_ids
    return ModelCall(
        call_id=call_id,
        session_id=ctx.session.session_id,
        index=0,
        prompt_ids=heal.prompt_ids,
        completion_ids=completion,
        logprobs=gen.logprobs,
        routed_experts=_experts(gen.routed_experts, heal.prompt_ids, completion),
        finish_reason=answer.finish,
        sampling=plan.effective,
        trainable=not ctx.off_policy_blocked(plan.flags),
        off_policy=bool(plan.flags),
        flags=all_flags,
        policy_version=version,
        backend=backend.name,
        logprobs_mode="raw" if backend.kind == "vllm" else "processed",
        capture="tokens",
        branch=heal.branch,
        fork_reason=heal.fork_reason,
        stream=bool(ctx.body.get("stream")),
        started_at=started,
        latency_ms=(time.perf_counter() - t0) * 1e3,
        request=request,
        response=answer.response,
    )


def _respond(body: Mapping[str, Any], response: dict[str, Any]) -> Response:
    if body.get("stream"):
        opts = body.get("stream_options")
        usage = bool(isinstance(opts, dict) and opts.get("include_usage"))
        return StreamingResponse(
            iterate(sse_chunks(response, usage)),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )
    return Response(orjson.dumps(response), media_type="application/json")


async def handle_chat(ctx: ChatContext) -> Response:
    """Serve one chat-completions request of a ``capture="tokens"`` session (see module docs)."""
    started = ctx.started_at or time.time()
    t0 = time.perf_counter()
    body = ctx.body
    request = dict(body)
    try:
        messages = _check_request(ctx)
        plan = await _plan(ctx, messages)
    except _Refused as refused:
        return refused.response
    top = body.get("top_logprobs") if body.get("logprobs") else 0
    call_id = ctx.new_call_id()
    try:
        backend, gen = await _generate(
            ctx, plan.runtime, plan.source, plan.info, plan.heal.prompt_ids, plan.effective,
            int(top or 0), call_id,
        )  # fmt: skip
    except BackendFailure as exc:
        return await _record_failure(ctx, plan, exc, call_id, request, started, t0)
    args = (plan.renderer, gen, plan.parser, plan.parse_tools, plan.heal.prompt_ids, body)
    inline = _INLINE_TOKENS_WITH_LOGPROBS if body.get("logprobs") else _INLINE_TOKENS
    if gen.completion_ids.shape[0] > inline:
        answer = await asyncio.to_thread(_answer, *args)
    else:
        answer = _answer(*args)
    call = _captured_call(ctx, plan, backend, gen, answer, call_id, request, started, t0)
    await ctx.commit(call)
    message = answer.response["choices"][0]["message"]
    plan.healer.record(plan.heal, messages, plan.tools, plan.kwargs, gen.completion_ids, message)
    return _respond(body, answer.response)


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
