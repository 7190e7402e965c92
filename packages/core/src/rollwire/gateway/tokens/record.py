"""What a generation becomes: the parsed answer sent to the agent (:func:`build_answer`) and the call
stored for training (:func:`captured_call`), or the failed call and its error."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from starlette.responses import Response

from rollwire.data.arrays import as_array
from rollwire.data.protocol import ModelCall
from rollwire.gateway.dataplane.capture import capture_spans, resolve_policy_version
from rollwire.gateway.dataplane.commit import new_call
from rollwire.gateway.errors import error_response
from rollwire.gateway.tokens.backend import BackendFailure, Generation
from rollwire.gateway.tokens.parsers import ParsedCompletion, ToolParser, parse_completion
from rollwire.gateway.tokens.render import ChatRenderer
from rollwire.gateway.tokens.response import chat_completion

if TYPE_CHECKING:
    from rollwire.gateway.backends.pool import Backend
    from rollwire.gateway.context import ChatContext
    from rollwire.gateway.tokens.plan import Plan

__all__ = ["Answer", "build_answer", "captured_call", "record_failure"]


def _strip_stop(text: str, gen: Generation) -> str:
    stop = gen.stop_reason
    if isinstance(stop, str) and stop and text.endswith(stop):
        return text[: -len(stop)]
    return text


def _openai_finish(gen: Generation, parsed: ParsedCompletion) -> str:
    if gen.finish_reason == "stop" and parsed.tool_calls:
        return "tool_calls"
    return gen.finish_reason


@dataclass
class Answer:
    """The parsed completion and the OpenAI response built from it."""

    parsed: ParsedCompletion
    finish: str
    response: dict[str, Any]


def build_answer(
    renderer: ChatRenderer,
    gen: Generation,
    parser: ToolParser | None,
    parse_tools: Any,
    prompt_ids: np.ndarray,
    body: Mapping[str, Any],
) -> Answer:
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
    return Answer(parsed, finish, response)


async def record_failure(
    ctx: ChatContext, plan: Plan, exc: BackendFailure, call_id: str, request: dict[str, Any],
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


def captured_call(
    ctx: ChatContext, plan: Plan, backend: Backend, gen: Generation, answer: Answer,
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
    heal, completion = plan.heal, as_array(gen.completion_ids, np.int32, 1)
    # a keep pause that swapped weights mid-call: the backend says which tokens each sampled
    spans, spans_flag = capture_spans(gen.weight_spans, int(completion.shape[0]))
    all_flags.extend(f for f in (version_flag, spans_flag) if f)
    prompt = as_array(heal.prompt_ids, np.int32, 1)
    experts = _experts(gen.routed_experts, prompt, completion)
    # The arrays are coerced as the model's validators would; the rest is trusted data.
    return new_call(
        call_id=call_id,
        session_id=ctx.session.session_id,
        index=0,
        prompt_ids=prompt,
        completion_ids=completion,
        logprobs=as_array(gen.logprobs, np.float32, 1),
        routed_experts=None if experts is None else as_array(experts, np.int16),
        finish_reason=answer.finish,
        sampling=plan.effective,
        trainable=not ctx.off_policy_blocked(plan.flags),
        off_policy=bool(plan.flags),
        flags=all_flags,
        policy_version=version,
        weight_versions=spans,
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


def _experts(
    experts: np.ndarray | None, prompt: np.ndarray, completion: np.ndarray
) -> np.ndarray | None:
    if experts is None:
        return None
    if experts.shape[0] != prompt.shape[0] + completion.shape[0] - 1:
        return None
    return experts
