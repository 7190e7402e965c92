"""OpenAI routes of the engine: ``/v1/chat/completions`` and ``/v1/completions`` (vLLM's shapes,
or SGLang's where ``openai_ids_style="sglang"``). Streams are in :mod:`.api_streams`."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .api_streams import _chat_stream, _completions_stream, _Renderer
from .faults import FaultDraw
from .http import _body, _HTTPError, _json, _npy_b64, _session_id, _strip_ids, endpoint
from .parsing import _split_reasoning, parse_assistant_text, parse_mistral_text
from .runtime import Engine, _apply_faults, _token_route_forced
from .sampling import SamplingParams
from .scheduler import Completion
from .tokenizer import template_messages
from .validation import (
    _bad,
    _bool,
    _check_forced_tool_call,
    _int,
    _model_name,
    _n,
    _params,
    _prompt_logprobs,
    _tool_choice,
    _tools,
    _top_k_requested,
)

__all__ = ["routes"]


def _without_tools(text: str) -> tuple[str | None, str | None, list[dict[str, Any]]]:
    # tool_choice "none" (or no tools): keep <tool_call> markup as plain content.
    reasoning, rest = _split_reasoning(text)
    return rest, reasoning, []


def _usage(prompt_ids: list[int], completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": len(prompt_ids),
        "total_tokens": len(prompt_ids) + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
    }


# ---------------------------------------------------------------------- chat
@dataclass
class _ChatRequest:
    """A validated chat request, ready to generate."""

    body: dict[str, Any]
    name: str
    prompt_ids: list[int]
    params: list[SamplingParams]
    forced: list[int] | None
    parse_tools: bool
    top_k: int | None
    draw: FaultDraw


def _chat_messages(body: dict[str, Any]) -> list[Any]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _HTTPError(400, "'messages' must be a non-empty list", param="messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise _bad(f"messages[{i}]", 'an object with a "role" string', m)
    return messages


async def _chat_request(engine: Engine, request: Request) -> _ChatRequest:
    body = await _body(request)
    messages = _chat_messages(body)
    name = _model_name(engine, body)
    tools = _tools(body)
    tool_choice = _tool_choice(body, tools)
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
        prompt = engine.tokenizer.render_chat(
            template_messages(messages),
            tools,
            add_generation_prompt=add_generation_prompt,
            **kwargs,
        )
    except Exception as exc:
        raise _HTTPError(400, f"cannot render the chat template: {exc}", param="messages") from exc
    prompt_ids = engine.tokenizer.encode(prompt)
    forced_text = engine.forced_text(messages, tools, _session_id(request, body))
    _check_forced_tool_call(tool_choice, forced_text)
    return _ChatRequest(
        body=body,
        name=name,
        prompt_ids=prompt_ids,
        params=params,
        forced=engine.forced_ids(forced_text),
        parse_tools=bool(tools) and tool_choice != "none",
        top_k=top_k,
        draw=draw,
    )


def _chat_choice(
    engine: Engine, req: _ChatRequest, render: _Renderer, i: int, c: Completion
) -> dict[str, Any]:
    mistral = engine.config.tool_call_parser == "mistral"
    content, reasoning, calls = (parse_mistral_text if mistral else parse_assistant_text)(c.text)
    if not req.parse_tools and calls:
        content, reasoning, calls = _without_tools(c.text)
    finish = "tool_calls" if calls and c.finish_reason == "stop" else c.finish_reason
    ret_ids = _bool(req.body, "return_token_ids", False)
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
        if req.top_k is None
        else {
            "content": [
                render.entry(t, lp, (c.top_logprobs or [[]] * len(c.output_ids))[j])
                for j, (t, lp) in enumerate(zip(c.output_ids, c.logprobs))
            ]
        },
        "finish_reason": finish,
        "stop_reason": c.stop_reason,
    }
    if engine.config.openai_ids_style == "sglang":  # SGLang's OpenAI chat: both id lists here
        if ret_ids:
            choice["prompt_token_ids"] = req.prompt_ids
            choice["response_token_ids"] = c.output_ids
    else:
        choice["token_ids"] = c.output_ids if ret_ids else None
    if engine.config.return_routed_experts and c.routed_experts is not None:
        choice["routed_experts"] = _npy_b64(c.routed_experts)
    if _bool(req.body, "return_weight_versions", False) or ret_ids:
        choice["weight_versions"] = c.weight_versions()
    return choice


async def chat(engine: Engine, request: Request) -> Response:
    """``POST /v1/chat/completions``."""
    req = await _chat_request(engine, request)
    body = req.body
    ret_ids = _bool(body, "return_token_ids", False)
    sglang_ids = engine.config.openai_ids_style == "sglang"
    stream = _bool(body, "stream", False)
    if sglang_ids and stream and ret_ids:
        raise _HTTPError(
            400,
            "return_token_ids is not supported with stream: true; use return_output_ids_in_sglext",
            param="return_token_ids",
        )
    render = _Renderer(engine, _bool(body, "return_tokens_as_token_ids", False))
    rid = "chatcmpl-" + uuid.uuid4().hex
    created = int(time.time())
    if stream:
        return await _chat_stream(
            engine, request, body, req.prompt_ids, req.params, req.forced,
            req.parse_tools and engine.config.tool_call_parser == "hermes",
            render, rid, created, req.name, req.draw,
        )  # fmt: skip
    completions = await engine.complete(
        req.prompt_ids,
        req.params,
        forced=req.forced,
        want_experts=engine.config.return_routed_experts,
        request_id=request.headers.get("x-request-id"),
        model=req.name,
    )
    choices = [_chat_choice(engine, req, render, i, c) for i, c in enumerate(completions)]
    first = completions[0]
    out: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": req.name,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": None,
        "usage": _usage(req.prompt_ids, sum(len(c.output_ids) for c in completions)),
        "prompt_logprobs": render.prompt_logprobs(first),
        "prompt_token_ids": req.prompt_ids if ret_ids and not sglang_ids else None,
        "kv_transfer_params": None,
        "weight_version": first.token_versions[-1]
        if first.token_versions
        else engine.weight_version,
    }
    if req.draw.drop_token_ids:
        _strip_ids(out)
    return _json(out)


# ---------------------------------------------------------------------- completions
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


def _completion_prompt(engine: Engine, body: dict[str, Any]) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return engine.tokenizer.encode(prompt)
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return [int(t) for t in prompt]
    raise _bad("prompt", "a string or a list of token ids (one prompt per request)", prompt)


async def completions(engine: Engine, request: Request) -> Response:
    """``POST /v1/completions``."""
    body = await _body(request)
    prompt_ids = _completion_prompt(engine, body)
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
        prompt_ids, params, forced=forced, want_experts=want_experts, model=name
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
    out = {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": name,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": None,
        "usage": _usage(prompt_ids, sum(len(c.output_ids) for c in results)),
        "kv_transfer_params": None,
        "weight_version": engine.weight_version,
    }
    if draw.drop_token_ids:
        _strip_ids(out)
    return _json(out)


def routes(engine: Engine) -> list[Route]:
    """The OpenAI routes."""
    return [
        Route("/v1/chat/completions", endpoint(engine, chat), methods=["POST"]),
        Route("/v1/completions", endpoint(engine, completions), methods=["POST"]),
    ]
