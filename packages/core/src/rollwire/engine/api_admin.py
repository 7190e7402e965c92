"""Admin routes of the engine: weight versions, pause and resume (vLLM's and SGLang's names),
model list and info, health."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .http import _body, _HTTPError, _json, endpoint
from .runtime import Engine

__all__ = ["routes"]


async def update_weight_version(engine: Engine, request: Request) -> Response:
    body = await _body(request)
    new = body.get("new_version")
    if new is None:
        raise _HTTPError(400, "'new_version' is required", param="new_version")
    old = engine.weight_version
    engine.weight_version = str(new)
    return _json(
        {"success": True, "message": f"weight version {old} -> {new}", "new_version": str(new)}
    )


async def get_weight_version(engine: Engine, request: Request) -> Response:
    return _json({"weight_version": engine.weight_version})


async def pause(engine: Engine, request: Request) -> Response:
    mode = request.query_params.get("mode")
    if mode is None and request.method == "POST":
        with contextlib.suppress(_HTTPError):
            mode = (await _body(request)).get("mode")
    mode = mode or "abort"
    if mode not in ("abort", "wait", "keep", "in_place", "retract"):
        raise _HTTPError(400, f"pause mode must be abort, wait or keep; got {mode!r}", param="mode")
    if mode == "abort":
        engine.scheduler.abort(None)
    elif mode == "wait":
        while engine.scheduler.num_active:
            await asyncio.sleep(0.005)
    engine.scheduler.pause()
    return _json({"status": "paused", "mode": mode})


async def resume(engine: Engine, request: Request) -> Response:
    engine.scheduler.resume()
    return _json({"status": "resumed"})


async def is_paused(engine: Engine, request: Request) -> Response:
    return _json({"is_paused": engine.scheduler.paused})


async def models(engine: Engine, request: Request) -> Response:
    cards: list[dict[str, Any]] = [
        {
            "id": served,
            "object": "model",
            "created": engine.created,
            "owned_by": "rollwire",
            "root": engine.model_name,
            "parent": None,
            "max_model_len": engine.model.config.max_model_len,
            "permission": [],
        }
        for served in engine.config.served_model_names
    ]
    return _json({"object": "list", "data": cards})


async def health(engine: Engine, request: Request) -> Response:
    return Response(status_code=200)


async def model_info(engine: Engine, request: Request) -> Response:
    tok = engine.tokenizer
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


def routes(engine: Engine) -> list[Route]:
    """The admin routes."""
    return [
        Route("/v1/models", endpoint(engine, models), methods=["GET"]),
        Route("/health", endpoint(engine, health), methods=["GET"]),
        Route("/update_weight_version", endpoint(engine, update_weight_version), methods=["POST"]),
        Route("/get_weight_version", endpoint(engine, get_weight_version), methods=["GET"]),
        Route("/get_model_info", endpoint(engine, model_info), methods=["GET"]),
        Route("/pause", endpoint(engine, pause), methods=["POST"]),
        Route("/resume", endpoint(engine, resume), methods=["POST"]),
        Route("/is_paused", endpoint(engine, is_paused), methods=["GET"]),
        Route("/pause_generation", endpoint(engine, pause), methods=["POST"]),
        Route("/continue_generation", endpoint(engine, resume), methods=["POST"]),
    ]
