"""vLLM's token-level routes of the engine: token-in/token-out generation
(``/inference/v1/generate``, its abort) and scoring helpers (``/tokenize``, ``/detokenize``)."""

from __future__ import annotations

import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .http import _body, _HTTPError, _json, _npy_b64, _strip_ids, endpoint
from .runtime import Engine, _apply_faults, _token_route_forced
from .tokenizer import template_messages
from .validation import _bad, _int, _model_name, _params

__all__ = ["routes"]


async def inference_generate(engine: Engine, request: Request) -> Response:
    body = await _body(request)
    ids = body.get("token_ids")
    if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
        raise _bad("token_ids", "a list of token ids", ids)
    name = _model_name(engine, body)
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
        model=name,
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


async def abort_requests(engine: Engine, request: Request) -> Response:
    body = await _body(request)
    ids = body.get("request_ids") or []
    if isinstance(ids, str):
        ids = [ids]
    return _json({"aborted": engine.scheduler.abort([str(i) for i in ids])})


async def tokenize(engine: Engine, request: Request) -> Response:
    tok = engine.tokenizer
    body = await _body(request)
    if body.get("messages") is not None:
        try:
            text = tok.render_chat(
                template_messages(body["messages"]),
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
        "token_strs": [tok.token_text(t) for t in ids] if body.get("return_token_strs") else None,
    }
    return _json(out)


async def detokenize(engine: Engine, request: Request) -> Response:
    tok = engine.tokenizer
    body = await _body(request)
    ids = body.get("tokens")
    if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
        raise _HTTPError(400, "'tokens' must be a list of ints", param="tokens")
    return _json({"prompt": tok.decode(ids)})


def routes(engine: Engine) -> list[Route]:
    """The token-level routes."""
    return [
        Route("/inference/v1/generate", endpoint(engine, inference_generate), methods=["POST"]),
        Route("/inference/v1/abort_requests", endpoint(engine, abort_requests), methods=["POST"]),
        Route("/tokenize", endpoint(engine, tokenize), methods=["POST"]),
        Route("/detokenize", endpoint(engine, detokenize), methods=["POST"]),
    ]
