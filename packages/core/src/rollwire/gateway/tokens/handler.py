"""``capture="tokens"``: the gateway owns tokenization (DESIGN §4.2).

For each chat request: check it and plan it (:mod:`.plan`): render the prompt with the model's
chat template, healed from the session's earlier calls so the exact sampled ids are reused
(:mod:`.heal`); generate on a token-in backend (:mod:`.backend`), failing over once; parse the
completion into content, reasoning and tool calls (:mod:`.parsers`) and commit the call
(:mod:`.record`); answer in OpenAI form, streamed or not (:mod:`.response`).

The tokenizer is the first of: the session's ``metadata["tokenizer"]``, ``$ROLLWIRE_TOKENIZER``,
the ``tokenizer_path`` the backend advertises on ``GET /get_model_info`` (SGLang, the embedded
engine) or the ``root`` of ``GET /v1/models`` (vLLM). Loaded renderers and what backends say
about themselves are kept per gateway (:class:`TokensRuntime`), healing state per session.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
from starlette.responses import Response, StreamingResponse

from rollwire.gateway.tokens.backend import (
    TOKEN_KINDS,
    BackendFailure,
    Generation,
    generate,
    sampling_payload,
)
from rollwire.gateway.tokens.plan import Refused, check_request, plan_request
from rollwire.gateway.tokens.record import build_answer, captured_call, record_failure
from rollwire.gateway.tokens.response import iterate, sse_chunks
from rollwire.gateway.tokens.runtime import BackendInfo, TokensRuntime, tokenizer_source

if TYPE_CHECKING:
    from rollwire.gateway.backends.pool import Backend
    from rollwire.gateway.context import ChatContext

__all__ = ["handle_chat"]

_DEFAULT_TIMEOUT = 600.0  # GatewayConfig.upstream_timeout's default, for a context without gateway
# Completions longer than this are decoded, parsed and turned into the response in a worker thread
# (about 0.2 ms per 1k tokens, ~3 ms per 1k with per-token logprob text; less stays inline, where
# it is cheaper than the thread hop). Measured on the embedded engine's tokenizer.
_INLINE_TOKENS = 4096
_INLINE_TOKENS_WITH_LOGPROBS = 256


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
        if target.kind == "tinker":
            from rollwire.gateway.tokens.tinker import tinker_generate

            # a Tinker sampler stops only where told: at the template's end of turn, as vLLM
            renderer = await runtime.renderer(source)
            return await tinker_generate(
                target, prompt_ids, effective, timeout=timeout, eos_id=renderer.eos_id
            )
        payload = sampling_payload(
            target.kind,
            prompt_ids,
            effective,
            top_logprobs=top_logprobs,
            request_id=call_id,
            session_id=ctx.session.session_id,
        )
        if target.kind == "vllm" and target.adapter is not None:
            payload["model"] = target.adapter  # the policy is that LoRA adapter
        return await generate(
            ctx.http,
            target.url,
            target.kind,
            payload,
            prompt_len=int(prompt_ids.shape[0]),
            experts_shape=target_info.experts_shape,
            timeout=timeout,
            connect_timeout=connect_timeout,
            upstream=ctx.gateway.upstream if ctx.gateway is not None else None,
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
        messages = check_request(ctx)
        plan = await plan_request(ctx, messages)
    except Refused as refused:
        return refused.response
    top = body.get("top_logprobs") if body.get("logprobs") else 0
    call_id = ctx.new_call_id()
    try:
        backend, gen = await _generate(
            ctx, plan.runtime, plan.source, plan.info, plan.heal.prompt_ids, plan.effective,
            int(top or 0), call_id,
        )  # fmt: skip
    except BackendFailure as exc:
        return await record_failure(ctx, plan, exc, call_id, request, started, t0)
    args = (plan.renderer, gen, plan.parser, plan.parse_tools, plan.heal.prompt_ids, body)
    inline = _INLINE_TOKENS_WITH_LOGPROBS if body.get("logprobs") else _INLINE_TOKENS
    if gen.completion_ids.shape[0] > inline:
        answer = await asyncio.to_thread(build_answer, *args)
    else:
        answer = build_answer(*args)
    call = captured_call(ctx, plan, backend, gen, answer, call_id, request, started, t0)
    await ctx.commit(call)
    message = answer.response["choices"][0]["message"]
    plan.healer.record(plan.heal, messages, plan.tools, plan.kwargs, gen.completion_ids, message)
    return _respond(body, answer.response)
