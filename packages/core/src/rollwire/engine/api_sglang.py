"""SGLang's native routes of the engine: ``/generate`` (``input_ids`` or ``text``),
``/abort_request``, ``/update_weights_from_disk`` and ``/flush_cache``."""

from __future__ import annotations

import base64
import time
import uuid
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .http import _body, _HTTPError, _json, endpoint
from .model import WeightsError
from .runtime import Engine, _apply_faults, _token_route_forced
from .validation import _bad, _bool, _params

__all__ = ["routes"]

_FLUSHED = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)


async def sglang_generate(engine: Engine, request: Request) -> Response:
    tok = engine.tokenizer
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


async def update_weights_from_disk(engine: Engine, request: Request) -> Response:
    """SGLang's ``POST /update_weights_from_disk {"model_path", "weight_version"?,
    "abort_all_requests"?}``: ``{"success", "message", "num_paused_requests"}``, 400 on failure.

    As SGLang does, it waits for the requests in flight to finish (holding new ones) unless
    generation is paused, in which case paused requests continue on the new weights.
    """
    body = await _body(request)
    path = body.get("model_path")
    if not isinstance(path, str) or not path:
        raise _bad("model_path", "a model folder path", path)
    version = body.get("weight_version")
    if version is not None and not isinstance(version, (str, int)):
        raise _bad("weight_version", "a string", version)
    keep_pause = _bool(body, "keep_pause", False)
    if _bool(body, "abort_all_requests", False):
        engine.scheduler.abort(None)
    paused, num_paused = engine.scheduler.paused, 0
    if paused:  # as SGLang: paused requests stay, and go on with the new weights
        num_paused = engine.scheduler.num_active - engine.scheduler.num_held
    else:  # as SGLang's writer lock: hold new requests, let the ones in flight finish
        await engine.pause("wait", clear_cache=False)
    try:
        await engine.reload_weights(path, version=None if version is None else str(version))
    except WeightsError as exc:
        out = {"success": False, "message": f"Failed to get weights iterator: {exc}."}
        return _json({**out, "num_paused_requests": num_paused}, 400)
    finally:
        if not paused and not keep_pause:
            engine.resume()
    message = "Succeeded to update model weights."
    if version is not None:
        message += f" Weight version updated to {version}."
    return _json({"success": True, "message": message, "num_paused_requests": num_paused})


async def flush_cache(engine: Engine, request: Request) -> Response:
    """SGLang's ``/flush_cache`` (GET or POST): its text answer, 200."""
    await engine.reset_prefix_cache()
    return Response(_FLUSHED, status_code=200, media_type="text/plain")


async def sglang_abort(engine: Engine, request: Request) -> Response:
    body = await _body(request)
    rid = body.get("rid")
    n = engine.scheduler.abort(None if body.get("abort_all") else [str(rid)] if rid else [])
    return _json({"aborted": n})


def routes(engine: Engine) -> list[Route]:
    """The SGLang routes."""
    return [
        Route("/generate", endpoint(engine, sglang_generate), methods=["POST"]),
        Route("/abort_request", endpoint(engine, sglang_abort), methods=["POST"]),
        Route(
            "/update_weights_from_disk",
            endpoint(engine, update_weights_from_disk),
            methods=["POST"],
        ),
        Route("/flush_cache", endpoint(engine, flush_cache), methods=["GET", "POST"]),
    ]
