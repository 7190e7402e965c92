"""A tokens-mode request checked and planned before generation: sampling, tokenizer, parser and the
prompt healed from the session's earlier calls (:class:`Plan`), or the 4xx it is refused with."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rollwire.gateway.errors import error_response
from rollwire.gateway.tokens.backend import TOKEN_KINDS
from rollwire.gateway.tokens.heal import FullRender, Healer, HealResult
from rollwire.gateway.tokens.parsers import (
    TemplateNotSupported,
    ToolParser,
    check_template_supported,
    detect_parser,
)
from rollwire.gateway.tokens.render import ChatRenderer, MissingTokensExtra
from rollwire.gateway.tokens.runtime import (
    BackendInfo,
    TokensRuntime,
    ctx_runtime,
    kind_refusal,
    tokenizer_source,
)

if TYPE_CHECKING:
    from rollwire.gateway.context import ChatContext

__all__ = ["Plan", "Refused", "check_request", "plan_request"]

_STATE_KEY = "tokens.healer"


class Refused(Exception):
    """A request refused before generation: the 4xx to answer with (nothing is recorded)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.response = error_response(status, message)


@dataclass
class Plan:
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


def _merged_kwargs(ctx: ChatContext) -> dict[str, Any]:
    agent = ctx.body.get("chat_template_kwargs")
    kwargs: dict[str, Any] = dict(agent) if isinstance(agent, Mapping) else {}
    kwargs.update(ctx.session.chat_template_kwargs or {})
    return kwargs


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


async def _heal(
    healer: Healer, messages: list[Any], tools: Any, kwargs: dict[str, Any]
) -> HealResult:
    # Healing costs what the new messages cost (~0.4 ms): inline. A full render grows with the
    # history (tens of ms at 100+ turns): in a worker thread, so other sessions keep moving.
    step = healer.heal(messages, tools, kwargs)
    if isinstance(step, FullRender):
        return await asyncio.to_thread(step.run)
    return step


def check_request(ctx: ChatContext) -> list[dict[str, Any]]:
    """The request's messages, after the checks that need no backend (raises :class:`Refused`)."""
    body = ctx.body
    if ctx.backend.kind not in TOKEN_KINDS:
        raise Refused(400, kind_refusal(ctx.backend))
    messages = body.get("messages")
    if (
        not isinstance(messages, list)
        or not messages
        or not all(isinstance(m, dict) for m in messages)
    ):
        raise Refused(400, "'messages' must be a non-empty list of message objects")
    n = body.get("n")
    if isinstance(n, int) and n > 1:
        raise Refused(
            400, f"capture='tokens' serves one choice per request; got n={n}. Send n requests"
        )
    return messages


async def plan_request(ctx: ChatContext, messages: list[dict[str, Any]]) -> Plan:
    """Sampling, tokenizer, parser and the healed prompt for this request (or :class:`Refused`)."""
    body = ctx.body
    try:
        effective, flags = ctx.apply_sampling(body)
    except ValueError as exc:
        raise Refused(400, str(exc)) from exc
    constraints = _constraints(body)
    if constraints:
        raise Refused(400, _constraint_refusal(constraints))
    runtime = ctx_runtime(ctx)
    try:
        info = await runtime.describe(ctx.http, ctx.backend.url)
        source = tokenizer_source(
            ctx.session.metadata, info, ctx.backend.url, ctx.backend.tokenizer
        )
        renderer = await runtime.renderer(source)
    except (LookupError, ValueError, MissingTokensExtra) as exc:
        raise Refused(400, str(exc)) from exc
    tools = body.get("tools") or None
    parse_tools = None if body.get("tool_choice") == "none" else tools
    parser = detect_parser(renderer.chat_template)
    if tools and parser is None:
        raise Refused(400, str(_unsupported(renderer)))
    kwargs = _merged_kwargs(ctx)
    healer = ctx.state.get(_STATE_KEY)
    if not isinstance(healer, Healer) or healer.renderer is not renderer:
        healer = Healer(renderer)
        ctx.state[_STATE_KEY] = healer
    try:
        heal = await _heal(healer, messages, tools, kwargs)
    except Exception as exc:  # a template raising on these messages (jinja TemplateError...)
        raise Refused(400, f"the chat template could not render these messages: {exc}") from exc
    effective = _cap_to_context(effective, len(heal.prompt_ids), info.max_model_len)
    return Plan(
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
        raise Refused(
            400,
            f"the prompt ({prompt_len} tokens) fills the backend's context (max_model_len "
            f"{context}); shorten the conversation",
        )
    asked = effective.get("max_tokens")
    if isinstance(asked, int) and asked <= room:
        return effective
    return {**effective, "max_tokens": room}


def _unsupported(renderer: ChatRenderer) -> TemplateNotSupported:
    try:
        check_template_supported(renderer)
    except TemplateNotSupported as exc:
        return exc
    return TemplateNotSupported("no tool-call parser matches this chat template")
