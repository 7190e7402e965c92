"""Weight-sync routes of the control plane: the store-wide pause, pushing weights to a backend,
probing it, and taking it out of rotation (``rollwire.trainer.weight_sync.WeightSync``)."""

from __future__ import annotations

import math
import time
from typing import Any

import aiohttp
import numpy as np
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rollwire.gateway.backends.pool import Backend
from rollwire.gateway.backends.weights import WEIGHT_KINDS, push_adapter, push_weights
from rollwire.gateway.control.base import ControlRoutes, json_response
from rollwire.gateway.control.staleness import check_seq
from rollwire.gateway.errors import GatewayError
from rollwire.gateway.tokens.backend import BackendFailure, generate, sampling_payload

__all__ = ["WeightRoutes"]

_MAX_PROBE_IDS = 4096
_MAX_PROBE_TOKENS = 64


def _seconds(body: dict[str, Any], key: str, default: float) -> float:
    value = body.get(key, default)
    if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:
        raise GatewayError(400, f"{key} must be a positive number of seconds, got {value!r}")
    return float(value)


def _epoch(body: dict[str, Any]) -> str | None:
    value = body.get("epoch")
    if value is not None and (not isinstance(value, str) or not 0 < len(value) <= 64):
        raise GatewayError(400, f"epoch must be the sync's epoch string, got {value!r}")
    return value


def _lease(body: dict[str, Any]) -> float:
    lease = _seconds(body, "lease", 60.0)
    if not 1.0 <= lease <= 86400.0:
        raise GatewayError(400, f"lease must be 1 to 86400 seconds, got {lease!r}")
    return lease


def _adapter(body: dict[str, Any]) -> tuple[str | None, list[str]]:
    """The LoRA adapter name a push loads the folder under (None: a full reload) and the
    adapters it unloads."""
    name, unload = body.get("adapter"), body.get("unload", [])
    if name is not None and (not isinstance(name, str) or not 0 < len(name) <= 256):
        raise GatewayError(400, f"adapter must be a 1 to 256 character name, got {name!r}")
    if not isinstance(unload, list) or not all(isinstance(n, str) and n for n in unload):
        raise GatewayError(400, f"unload must be a list of adapter names, got {unload!r}")
    if unload and name is None:
        raise GatewayError(400, "unload goes with an adapter push (adapter: NAME)")
    return name, unload


def _flag(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise GatewayError(400, f"{key} must be true or false, got {value!r}")
    return value


async def probe_backend(
    http: aiohttp.ClientSession,
    backend: Backend,
    *,
    prompt_ids: list[int],
    max_tokens: int,
    timeout: float = 120.0,
    model: str | None = None,
) -> dict[str, Any]:
    """A greedy token-in request: ``max_tokens`` ids and their log-probs after ``prompt_ids``
    (``model``: through the adapter calls asking for that model get, e.g. a role's)."""
    if backend.kind not in WEIGHT_KINDS:
        raise GatewayError(
            409,
            f"backend {backend.name} ({backend.kind}) has no token-in route to probe",
            code="backend_takes_no_weights",
        )
    ids = np.asarray(prompt_ids, dtype=np.int64)
    sampling = {"temperature": 0.0, "max_tokens": int(max_tokens), "min_tokens": int(max_tokens)}
    payload = sampling_payload(backend.kind, ids, sampling)
    if backend.kind == "vllm":
        payload["model"] = backend.model_for(model)
        payload["return_weight_versions"] = True
    t0 = time.perf_counter()
    try:
        if backend.kind == "tinker":
            from rollwire.gateway.tokens.tinker import tinker_generate

            gen = await tinker_generate(backend, ids, sampling, timeout=timeout)
        else:
            gen = await generate(
                http, backend.url, backend.kind, payload, prompt_len=len(ids), timeout=timeout
            )
    except BackendFailure as exc:
        raise GatewayError(
            502, f"probe of {backend.name}: {exc.message}", code="probe_failed"
        ) from exc
    return {
        "backend": backend.name,
        "completion_ids": gen.completion_ids.tolist(),
        "logprobs": gen.logprobs.astype(np.float64).tolist(),
        "weight_version": gen.weight_version,
        "seconds": time.perf_counter() - t0,
    }


class WeightRoutes(ControlRoutes):
    """``/api/sync/begin|renew|end``, ``/api/backends/{name}/weights|probe|quarantine``."""

    def routes(self) -> list[Route]:
        """The Starlette routes of this group."""
        return [
            Route("/api/sync/begin", self.begin, methods=["POST"]),
            Route("/api/sync/renew", self.renew, methods=["POST"]),
            Route("/api/sync/end", self.end, methods=["POST"]),
            Route("/api/backends/{name}/weights", self.weights, methods=["POST"]),
            Route("/api/backends/{name}/probe", self.probe, methods=["POST"]),
            Route("/api/backends/{name}/quarantine", self.quarantine, methods=["POST", "DELETE"]),
        ]

    def backend(self, request: Request) -> Backend:
        name = request.path_params["name"]
        backend = self.gw.pool.backends.get(name)
        if backend is None:
            known = ", ".join(sorted(self.gw.pool.backends)) or "none"
            raise GatewayError(
                404, f"no backend named {name!r} (known: {known})", code="backend_not_found"
            )
        return backend

    async def begin(self, request: Request) -> Response:
        self.require_admin(request)
        body = await self.body_of(request)
        drain = _flag(body, "drain", True)
        timeout = _seconds(body, "timeout", 120.0)
        lease = _lease(body)
        return json_response(await self.gw.barrier.begin(drain=drain, timeout=timeout, lease=lease))

    async def renew(self, request: Request) -> Response:
        self.require_admin(request)
        body = await self.body_of(request)
        epoch = _epoch(body)
        if epoch is None:
            raise GatewayError(400, "epoch is required: the one /api/sync/begin answered")
        return json_response(await self.gw.barrier.renew(epoch, _lease(body)))

    async def end(self, request: Request) -> Response:
        self.require_admin(request)
        body = await self.body_of(request)
        version = body.get("version")
        if version is not None and (not isinstance(version, str) or not 0 < len(version) <= 256):
            raise GatewayError(400, f"version must be a 1 to 256 character string, got {version!r}")
        seq = check_seq(body)
        return json_response(await self.gw.barrier.end(version, seq, epoch=_epoch(body)))

    async def weights(self, request: Request) -> Response:
        self.require_admin(request)
        backend = self.backend(request)
        body = await self.body_of(request)
        path, version = body.get("weights_path"), body.get("version")
        if not isinstance(path, str) or not path:
            raise GatewayError(400, f"weights_path must be a folder path, got {path!r}")
        if not isinstance(version, str) or not 0 < len(version) <= 256:
            raise GatewayError(400, f"version must be a 1 to 256 character string, got {version!r}")
        keep = _flag(body, "keep", False)
        timeout = _seconds(body, "timeout", self.gw.config.upstream_timeout)
        epoch = _epoch(body)
        adapter, unload = _adapter(body)
        seq = check_seq(body)
        await self.gw.barrier.pushing(backend, epoch=epoch, version=version, weights_path=path)
        held: dict[str, Any] = {"adapter": backend.adapter, "adapters": list(backend.adapters)}
        try:
            if adapter is not None:
                result = await push_adapter(
                    self.gw.http, backend, adapter_path=path, name=adapter, version=version,
                    seq=seq, unload=unload, held=held, timeout=timeout,
                )  # fmt: skip
            else:
                result = await push_weights(
                    self.gw.http, backend, weights_path=path, version=version, keep=keep,
                    timeout=timeout,
                )  # fmt: skip
                held["adapter"] = None  # the full weights are the policy now
        finally:  # what the server holds now, for every gateway on the store
            await self.gw.set_adapters(backend, held["adapter"], held["adapters"])
        return json_response(result)

    async def probe(self, request: Request) -> Response:
        self.require_admin(request)
        backend = self.backend(request)
        body = await self.body_of(request)
        ids, n = body.get("prompt_ids"), body.get("max_tokens", 4)
        if (
            not isinstance(ids, list)
            or not 0 < len(ids) <= _MAX_PROBE_IDS
            or not all(type(t) is int and t >= 0 for t in ids)
        ):
            raise GatewayError(
                400, f"prompt_ids must be 1 to {_MAX_PROBE_IDS} non-negative token ids"
            )
        if type(n) is not int or not 0 < n <= _MAX_PROBE_TOKENS:
            raise GatewayError(400, f"max_tokens must be 1 to {_MAX_PROBE_TOKENS}, got {n!r}")
        timeout = _seconds(body, "timeout", 300.0)
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise GatewayError(400, f"model must be a string, got {model!r}")
        result = await probe_backend(
            self.gw.http, backend, prompt_ids=ids, max_tokens=n, timeout=timeout, model=model
        )
        return json_response(result)

    async def quarantine(self, request: Request) -> Response:
        self.require_admin(request)
        backend = self.backend(request)
        if request.method == "DELETE":
            await self.gw.set_quarantine(backend, None)
        else:
            reason = (await self.body_of(request)).get("reason") or "taken out by the control plane"
            if not isinstance(reason, str):
                raise GatewayError(400, f"reason must be a string, got {reason!r}")
            await self.gw.set_quarantine(backend, reason[:2000])
        return json_response(backend.info())
