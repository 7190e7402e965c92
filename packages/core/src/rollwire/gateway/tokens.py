"""``capture="tokens"``: the gateway owns tokenization (DESIGN §4.2).

For each chat request: render the prompt with the model's chat template, healed from the session's
earlier calls so the exact sampled ids are reused (:mod:`rollwire.gateway.tokens_heal`); generate
on a token-in backend (:mod:`rollwire.gateway.tokens_backend`); parse the completion into content,
reasoning and tool calls (:mod:`rollwire.gateway.parsers`); commit the call; answer in OpenAI form,
streamed or not (:mod:`rollwire.gateway.tokens_response`).

The tokenizer is the first of: the session's ``metadata["tokenizer"]``, ``$ROLLWIRE_TOKENIZER``,
the ``tokenizer_path`` the backend advertises on ``GET /get_model_info`` (SGLang, the embedded
engine) or the ``root`` of ``GET /v1/models`` (vLLM).
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

from rollwire.gateway.errors import error_response
from rollwire.gateway.parsers import (
    ParsedCompletion,
    TemplateNotSupported,
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
from rollwire.gateway.tokens_heal import Healer
from rollwire.gateway.tokens_response import chat_completion, iterate, sse_chunks
from rollwire.protocol import ModelCall

if TYPE_CHECKING:
    from rollwire.gateway.context import ChatContext

__all__ = ["BackendInfo", "handle_chat", "load_renderer"]

_STATE_KEY = "tokens.healer"
_renderers: dict[str, ChatRenderer] = {}
_renderers_lock = threading.Lock()
_backend_info: dict[str, BackendInfo] = {}


@dataclass(frozen=True)
class BackendInfo:
    """What a backend says about itself: its tokenizer and MoE routing shape (when it tells)."""

    tokenizer: str | None
    experts_shape: tuple[int, int] | None


def load_renderer(tokenizer: str) -> ChatRenderer:
    """A :class:`ChatRenderer` for a tokenizer folder, loaded once per process."""
    with _renderers_lock:
        renderer = _renderers.get(tokenizer)
        if renderer is None:
            renderer = ChatRenderer.from_dir(tokenizer)
            _renderers[tokenizer] = renderer
        return renderer


async def _fetch_json(http: aiohttp.ClientSession, url: str) -> Any:
    with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=10)) as resp:
            if resp.status == 200:
                return await resp.json(content_type=None)
    return None


async def _describe_backend(ctx: ChatContext) -> BackendInfo:
    url = ctx.backend.url
    info = _backend_info.get(url)
    if info is not None:
        return info
    tokenizer = None
    shape = None
    model_info = await _fetch_json(ctx.http, url + "/get_model_info")
    if isinstance(model_info, dict):
        tokenizer = model_info.get("tokenizer_path") or model_info.get("model_path")
        layers, top_k = model_info.get("num_layers"), model_info.get("top_k")
        if isinstance(layers, int) and isinstance(top_k, int):
            shape = (layers, top_k)
    if tokenizer is None:
        models = await _fetch_json(ctx.http, url + "/v1/models")
        data = models.get("data") if isinstance(models, dict) else None
        if data:
            tokenizer = data[0].get("root") or data[0].get("id")
    info = BackendInfo(tokenizer=str(tokenizer) if tokenizer else None, experts_shape=shape)
    if tokenizer or shape:  # an unreachable backend is asked again next time
        _backend_info[url] = info
    return info


def _tokenizer_source(ctx: ChatContext, info: BackendInfo) -> str:
    meta = ctx.session.metadata or {}
    for candidate in (
        getattr(ctx.session, "tokenizer", None),
        meta.get("tokenizer"),
        os.environ.get("ROLLWIRE_TOKENIZER"),
        info.tokenizer,
    ):
        if candidate:
            return str(candidate)
    raise LookupError(
        f"capture='tokens' needs the model's tokenizer and backend {ctx.backend.url} does not "
        "name one: create the session with metadata={'tokenizer': '/path/to/hf/folder'} or set "
        "ROLLWIRE_TOKENIZER"
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


async def handle_chat(ctx: ChatContext) -> Response:
    """Serve one chat-completions request of a ``capture="tokens"`` session (see module docs)."""
    started = ctx.started_at or time.time()
    t0 = time.perf_counter()
    body = ctx.body
    request = dict(body)
    kind = ctx.backend.kind
    if kind not in TOKEN_KINDS:
        return error_response(
            400,
            f"capture='tokens' needs a token-in backend (vllm or sglang); backend "
            f"{ctx.backend.name!r} at {ctx.backend.url} is kind {kind!r}. Register the server with "
            "kind='vllm' or 'sglang', or create the session with capture='passthrough'",
        )
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
        info = await _describe_backend(ctx)
        source = _tokenizer_source(ctx, info)
        cached = _renderers.get(source)
        renderer = cached if cached is not None else await asyncio.to_thread(load_renderer, source)
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
        heal = healer.prompt(messages, tools, kwargs)
    except Exception as exc:  # a template raising on these messages (jinja TemplateError...)
        return error_response(400, f"the chat template could not render these messages: {exc}")

    effective, flags = ctx.apply_sampling(body)
    top = body.get("top_logprobs") if body.get("logprobs") else 0
    call_id = ctx.new_call_id()
    payload = sampling_payload(
        kind,
        heal.prompt_ids,
        effective,
        top_logprobs=int(top or 0),
        request_id=call_id,
        session_id=ctx.session.session_id,
    )
    try:
        gen = await generate(
            ctx.http,
            ctx.backend.url,
            kind,
            payload,
            prompt_len=int(heal.prompt_ids.shape[0]),
            experts_shape=info.experts_shape,
        )
    except BackendFailure as exc:
        if exc.connection:
            ctx.mark_backend_failed()
        failed = ModelCall(
            call_id=call_id,
            session_id=ctx.session.session_id,
            index=0,
            prompt_ids=heal.prompt_ids,
            status="failed",
            error=exc.message,
            sampling=effective,
            flags=list(flags),
            backend=ctx.backend.name,
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
    visible = completion
    while visible.size and int(visible[-1]) in renderer.special_ids:
        visible = visible[:-1]
    text = _strip_stop(renderer.decode(visible), gen)
    parsed = parse_completion(text, parser, parse_tools)
    all_flags = list(flags)
    if parsed.ill_formed:
        all_flags.append("ill_formed")
    finish = _openai_finish(gen, parsed)
    response = chat_completion(
        model=str(body.get("model") or "policy"),
        parsed=parsed,
        finish_reason=finish,
        prompt_ids=heal.prompt_ids,
        completion_ids=completion,
        logprobs=gen.logprobs,
        token_text=renderer.token_text,
        want_logprobs=bool(body.get("logprobs")),
        want_token_ids=bool(body.get("return_token_ids")),
    )
    call = ModelCall(
        call_id=call_id,
        session_id=ctx.session.session_id,
        index=0,
        prompt_ids=heal.prompt_ids,
        completion_ids=completion,
        logprobs=gen.logprobs,
        routed_experts=_experts(gen.routed_experts, heal.prompt_ids, completion),
        finish_reason=finish,
        sampling=effective,
        trainable=not ctx.off_policy_blocked(flags),
        off_policy=bool(flags),
        flags=all_flags,
        policy_version=ctx.policy_version or gen.weight_version,
        backend=ctx.backend.name,
        logprobs_mode="raw" if kind == "vllm" else "processed",
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
    from rollwire.gateway.parsers import check_template_supported

    try:
        check_template_supported(renderer)
    except TemplateNotSupported as exc:
        return exc
    return TemplateNotSupported("no tool-call parser matches this chat template")
