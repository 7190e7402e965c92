"""Inference backends: sticky-per-session routing with least-loaded fallback, health checks."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from rollwire.gateway.config import BackendSpec
from rollwire.gateway.errors import GatewayError

__all__ = ["Backend", "BackendPool"]

log = logging.getLogger("rollwire.gateway")


@dataclass
class Backend:
    """One inference server the gateway forwards to."""

    name: str
    url: str
    kind: str = "vllm"
    healthy: bool = True
    in_flight: int = 0
    #: the served model name given when the backend was added (``BackendSpec.model``): always
    #: used, never re-read
    pinned_model: str | None = None
    #: the name ``GET /v1/models`` last reported (re-read on every passing health check)
    discovered_model: str | None = None
    #: the tokenizer given when the backend was added (``BackendSpec.tokenizer``), if any
    tokenizer: str | None = None
    #: why a weight sync (or an operator) took it out of rotation; health checks never undo it
    quarantined: str | None = None
    #: the version the last weight push labelled it with
    weight_version: str | None = None
    #: the LoRA adapter it serves the policy under (``<policy>@<version>``): forwarded calls
    #: name it instead of the base model (None: the base weights are the policy)
    adapter: str | None = None
    #: the adapters loaded on it, oldest first: ``{"name", "version", "seq"}`` each
    adapters: list[dict[str, Any]] = field(default_factory=list)
    #: ``tinker`` kind: the SDK's ServiceClient and the SamplingClient it samples with now
    client: Any = field(default=None, repr=False, compare=False)
    sampler: Any = field(default=None, repr=False, compare=False)
    #: an answer of it carried routed experts (an MoE model served with routing): streamed
    #: calls are then captured with routing by default (learnt per gateway, never unlearnt)
    returns_routing: bool = False

    @property
    def model(self) -> str | None:
        """The model name every forwarded request uses: the policy's LoRA adapter when it
        serves one, else the pinned name, else the one last discovered (None: requests keep
        the agent's model name)."""
        if self.adapter is not None:
            return self.adapter
        return self.pinned_model if self.pinned_model is not None else self.discovered_model

    def model_for(self, requested: object) -> str | None:
        """The model name a request asking for ``requested`` is forwarded under: the newest
        adapter loaded for the policy of that name (``<requested>@<version>``: one policy per
        role, the role being the model the agent asks for), else :attr:`model`. After a full
        sync (no adapter is the policy) every request gets :attr:`model`."""
        if isinstance(requested, str) and self.adapter is not None:
            prefix = requested + "@"
            mine = [str(a["name"]) for a in self.adapters if str(a.get("name")).startswith(prefix)]
            if mine:
                return mine[-1]
        return self.model

    def adapter_version(self, name: object) -> str | None:
        """The version of the loaded adapter ``name`` (an answer's ``model``), else None."""
        return next((str(a["version"]) for a in self.adapters if a.get("name") == name), None)

    def info(self) -> dict[str, object]:
        """The JSON form the control plane returns."""
        return {
            "name": self.name,
            "url": self.url,
            "kind": self.kind,
            "model": self.model,
            "model_pinned": self.pinned_model is not None,
            "tokenizer": self.tokenizer,
            "healthy": self.healthy,
            "in_flight": self.in_flight,
            "quarantined": self.quarantined,
            "weight_version": self.weight_version,
            "adapter": self.adapter,
            "adapters": [dict(a) for a in self.adapters],
            "returns_routing": self.returns_routing,
        }


class BackendPool:
    """The set of backends, session affinity, and the periodic health check."""

    def __init__(self, specs: list[BackendSpec], max_sticky: int = 100_000) -> None:
        self.backends: dict[str, Backend] = {}
        self._sticky: OrderedDict[str, str] = OrderedDict()
        self._max_sticky = max_sticky
        for spec in specs:
            self.add(spec)

    def add(self, spec: BackendSpec) -> Backend:
        """Add (or replace, by name) a backend."""
        name = spec.name or f"b{len(self.backends)}"
        while spec.name is None and name in self.backends:
            name = f"b{len(self.backends) + 1}-{len(name)}"
        backend = Backend(
            name=name,
            url=spec.url,
            kind=spec.kind,
            pinned_model=spec.model,
            tokenizer=spec.tokenizer,
        )
        self.backends[name] = backend
        return backend

    def remove(self, name: str) -> bool:
        """Take a backend out for good; False when unknown."""
        return self.backends.pop(name, None) is not None

    def pick(self, session_id: str, exclude: frozenset[str] = frozenset()) -> Backend | None:
        """The session's sticky backend if healthy, else the least-loaded healthy one."""
        name = self._sticky.get(session_id)
        if name is not None and name not in exclude:
            b = self.backends.get(name)
            if b is not None and b.healthy and b.quarantined is None:
                return b
        usable = [b for b in self.backends.values() if b.quarantined is None]
        candidates = [b for b in usable if b.healthy and b.name not in exclude]
        if not candidates and not exclude:
            # Every backend is marked down: try anyway rather than refuse (health may be stale);
            # never one a weight sync took out (it may serve weights nobody verified).
            candidates = usable
        if not candidates:
            return None
        best = min(candidates, key=lambda b: b.in_flight)
        self._sticky[session_id] = best.name
        if len(self._sticky) > self._max_sticky:
            self._sticky.popitem(last=False)
        return best

    def unavailable(self) -> GatewayError:
        """The 503 for a call no backend may take, saying why (none added, or each one out of
        rotation with its reason)."""
        out = [b for b in self.backends.values() if b.quarantined is not None]
        if not self.backends or len(out) < len(self.backends):
            return GatewayError(
                503, "no inference backend configured", "server_error", "no_backend"
            )
        reasons = "; ".join(f"{b.name} ({b.url}): {b.quarantined}" for b in out)
        return GatewayError(
            503,
            f"every inference backend is out of rotation: {reasons}",
            "server_error",
            "no_backend",
        )

    def stick(self, session_id: str, name: str) -> bool:
        """Route the session to backend ``name`` (learnt from the shared store) when this pool
        has it; False otherwise."""
        if name not in self.backends:
            return False
        self._sticky[session_id] = name
        if len(self._sticky) > self._max_sticky:
            self._sticky.popitem(last=False)
        return True

    def forget(self, session_id: str) -> None:
        """Drop the session's affinity (when it ends)."""
        self._sticky.pop(session_id, None)

    def mark_failed(self, backend: Backend) -> None:
        """Take a backend out of routing until its health check passes."""
        if backend.healthy:
            log.warning("backend %s (%s) failed; routing around it", backend.name, backend.url)
        backend.healthy = False

    async def check(self, http: aiohttp.ClientSession, backend: Backend) -> bool:
        """Probe one backend (``GET /health``; for ``openai`` kind any answer counts)."""
        path = {"openai": "/v1/models", "tinker": "/api/v1/healthz"}.get(backend.kind, "/health")
        try:
            async with http.get(backend.url + path, timeout=aiohttp.ClientTimeout(total=5)) as resp:
                await resp.read()
                ok = resp.status < 500 if backend.kind == "openai" else resp.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            ok = False
        if ok and backend.pinned_model is None and backend.kind not in ("openai", "tinker"):
            # Re-read every time: a backend restarted under another served name must not be
            # sent the old one (it answers 404). A failed read keeps the last name known.
            served = await self._served_model(http, backend)
            if served is not None:
                if backend.discovered_model not in (None, served):
                    log.warning(
                        "backend %s (%s) now serves model %r (was %r)",
                        backend.name,
                        backend.url,
                        served,
                        backend.discovered_model,
                    )
                backend.discovered_model = served
        if ok and not backend.healthy:
            log.warning("backend %s (%s) is healthy again", backend.name, backend.url)
        backend.healthy = ok
        return ok

    @staticmethod
    async def _served_model(http: aiohttp.ClientSession, backend: Backend) -> str | None:
        # vLLM and SGLang answer only to the name they serve (404 otherwise), while agents are
        # told the session's model name: the gateway sends the served one.
        try:
            async with http.get(
                backend.url + "/v1/models", timeout=aiohttp.ClientTimeout(total=5)
            ) as resp:
                if resp.status != 200:
                    return None
                data = await resp.json(content_type=None)
            model = str(data["data"][0]["id"])
        except (
            aiohttp.ClientError,
            asyncio.TimeoutError,
            OSError,
            ValueError,
            LookupError,
            TypeError,
        ):
            return None
        if model != backend.discovered_model:
            log.info("backend %s (%s) serves model %r", backend.name, backend.url, model)
        return model

    async def check_all(self, http: aiohttp.ClientSession) -> None:
        """Probe every backend concurrently."""
        await asyncio.gather(*(self.check(http, b) for b in list(self.backends.values())))

    async def run_health_checks(self, http: aiohttp.ClientSession, interval: float) -> None:
        """Probe all backends every ``interval`` seconds until cancelled."""
        while True:
            with contextlib.suppress(Exception):
                await self.check_all(http)
            await asyncio.sleep(interval)
