"""Admin routes of the engine: weight versions, reloads, LoRA adapters, pause and resume, the
prefix cache (vLLM's dev-mode and runtime-LoRA routes, SGLang's pause names), model list and
info, health. SGLang's weight
reload lives with its other routes in :mod:`.api_sglang`."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .http import _body, _HTTPError, _json, endpoint
from .model import WeightsError
from .runtime import Engine
from .scheduler import PauseMode
from .validation import _bad, _bool

__all__ = ["routes"]


async def update_weight_version(engine: Engine, request: Request) -> Response:
    """vLLM's ``{"success", "new_version"}`` plus SGLang's ``message`` (both servers' clients)."""
    body = await _body(request)
    new = body.get("new_version")
    if not isinstance(new, (str, int)) or isinstance(new, bool):
        raise _bad("new_version", "a string", new)
    engine.weight_version = str(new)
    return _json(
        {"success": True, "message": f"Weight version updated to {new}", "new_version": str(new)}
    )


async def weight_info(engine: Engine, request: Request) -> Response:
    """vLLM's ``GET /weight_info``."""
    return _json({"weight_version": engine.weight_version})


async def get_weight_version(engine: Engine, request: Request) -> Response:
    return _json({"weight_version": engine.weight_version})


_VLLM_MODES: dict[str, PauseMode] = {"abort": "abort", "wait": "wait", "keep": "keep"}


async def pause(engine: Engine, request: Request) -> Response:
    """vLLM's ``POST /pause?mode=abort|wait|keep&clear_cache=true``."""
    query = dict(request.query_params)
    mode = query.get("mode", "abort")
    if mode not in _VLLM_MODES:
        raise _HTTPError(400, f"pause mode must be abort, wait or keep; got {mode!r}", param="mode")
    await engine.pause(_VLLM_MODES[mode], clear_cache=_bool(query, "clear_cache", True))
    return _json({"status": "paused"})


async def resume(engine: Engine, request: Request) -> Response:
    engine.resume()
    return _json({"status": "resumed"})


async def is_paused(engine: Engine, request: Request) -> Response:
    return _json({"is_paused": engine.scheduler.paused})


#: SGLang's ``/pause_generation`` modes, as the engine runs them (``retract`` keeps the KV too).
_SGLANG_MODES: dict[str, PauseMode] = {"abort": "abort", "in_place": "keep", "retract": "keep"}


async def pause_generation(engine: Engine, request: Request) -> Response:
    """SGLang's ``POST /pause_generation {"mode": "abort" | "in_place" | "retract"}``."""
    mode = (await _body(request)).get("mode", "abort")
    if not isinstance(mode, str) or mode not in _SGLANG_MODES:
        raise _HTTPError(
            400, f"mode must be abort, in_place or retract; got {mode!r}", param="mode"
        )
    await engine.pause(_SGLANG_MODES[mode], clear_cache=False)
    return _json({"message": "Generation paused successfully.", "status": "ok"})


async def continue_generation(engine: Engine, request: Request) -> Response:
    engine.resume()
    return _json({"message": "Generation continued successfully.", "status": "ok"})


async def reset_prefix_cache(engine: Engine, request: Request) -> Response:
    """vLLM's ``POST /reset_prefix_cache``: 200, no body. It always succeeds here: the cache
    holds finished sequences only, which no running request depends on."""
    await engine.reset_prefix_cache()
    return Response(status_code=200)


async def collective_rpc(engine: Engine, request: Request) -> Response:
    """vLLM's ``POST /collective_rpc {"method", "args", "kwargs", "timeout"}`` for the one method
    the engine runs, ``reload_weights(weights_path=...)``; answers ``{"results": [null]}`` (one
    worker, which returns None)."""
    body = await _body(request)
    method = body.get("method")
    if method is None:
        raise _HTTPError(400, "Missing 'method' in request body", param="method")
    if method != "reload_weights":
        raise _HTTPError(
            400,
            f"the embedded engine runs only collective_rpc method 'reload_weights' "
            f"(kwargs: weights_path); got {method!r}",
            param="method",
        )
    args, kwargs = body.get("args") or [], body.get("kwargs") or {}
    if args or not isinstance(kwargs, dict):
        raise _bad("kwargs", 'an object like {"weights_path": DIR} (no positional args)', body)
    unknown = sorted(set(kwargs) - {"weights_path", "is_checkpoint_format"})
    if unknown:
        raise _HTTPError(
            400, f"reload_weights takes weights_path (and is_checkpoint_format); got {unknown}"
        )
    path = kwargs.get("weights_path")
    if path is not None and not isinstance(path, str):
        raise _bad("kwargs.weights_path", "a folder path", path)
    try:
        await engine.reload_weights(path)
    except WeightsError as exc:
        raise _HTTPError(
            400, f"reload_weights failed, the old weights keep serving: {exc}"
        ) from exc
    return _json({"results": [None]})


async def models(engine: Engine, request: Request) -> Response:
    """The served names, then each loaded LoRA adapter (``root``: its folder, ``parent``: the
    base), as vLLM lists them."""
    card = {"object": "model", "created": engine.created, "owned_by": "rollwire", "permission": []}
    cards: list[dict[str, Any]] = [
        {
            "id": served,
            **card,
            "root": engine.model_name,
            "parent": None,
            "max_model_len": engine.model.config.max_model_len,
        }
        for served in engine.config.served_model_names
    ]
    cards += [
        {"id": a.name, **card, "root": a.path, "parent": engine.model_name}
        for a in engine.adapters.values()
    ]
    return _json({"object": "list", "data": cards})


async def load_lora_adapter(engine: Engine, request: Request) -> Response:
    """vLLM's ``POST /v1/load_lora_adapter {"lora_name", "lora_path", "load_inplace"?}``: a PEFT
    LoRA folder served to requests whose ``model`` is ``lora_name``; answers vLLM's text."""
    body = await _body(request)
    name, path = body.get("lora_name"), body.get("lora_path")
    if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
        raise _HTTPError(400, "Both 'lora_name' and 'lora_path' must be provided.")
    try:
        await engine.load_adapter(name, path, replace=_bool(body, "load_inplace", False))
    except WeightsError as exc:
        raise _HTTPError(400, str(exc), param="lora_path") from exc
    return Response(f"Success: LoRA adapter '{name}' added successfully.", 200)


async def unload_lora_adapter(engine: Engine, request: Request) -> Response:
    """vLLM's ``POST /v1/unload_lora_adapter {"lora_name"}`` (404 when it is not loaded)."""
    name = (await _body(request)).get("lora_name")
    if not isinstance(name, str) or not name:
        raise _HTTPError(400, "either 'lora_name' and 'lora_int_id' needs to be provided.")
    try:
        await engine.unload_adapter(name)
    except KeyError:
        raise _HTTPError(404, f"The lora adapter '{name}' cannot be found.") from None
    return Response(f"Success: LoRA adapter '{name}' removed successfully.", 200)


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
        Route("/v1/load_lora_adapter", endpoint(engine, load_lora_adapter), methods=["POST"]),
        Route("/v1/unload_lora_adapter", endpoint(engine, unload_lora_adapter), methods=["POST"]),
        Route("/health", endpoint(engine, health), methods=["GET"]),
        Route("/update_weight_version", endpoint(engine, update_weight_version), methods=["POST"]),
        Route("/weight_info", endpoint(engine, weight_info), methods=["GET"]),
        Route("/get_weight_version", endpoint(engine, get_weight_version), methods=["GET"]),
        Route("/get_model_info", endpoint(engine, model_info), methods=["GET"]),
        Route("/pause", endpoint(engine, pause), methods=["POST"]),
        Route("/resume", endpoint(engine, resume), methods=["POST"]),
        Route("/is_paused", endpoint(engine, is_paused), methods=["GET"]),
        Route("/reset_prefix_cache", endpoint(engine, reset_prefix_cache), methods=["POST"]),
        Route("/collective_rpc", endpoint(engine, collective_rpc), methods=["POST"]),
        Route("/pause_generation", endpoint(engine, pause_generation), methods=["POST"]),
        Route("/continue_generation", endpoint(engine, continue_generation), methods=["POST"]),
    ]
