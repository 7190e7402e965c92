"""What all verl agent loops of one process share: gateway, runner and gateway clients.

verl builds a loop per sample, and gateway, runner and clients are expensive, so they live in a
per-process cache keyed by the loop's :class:`~rollwire_verl.settings.LoopSettings`.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from typing import Any

from rollwire_verl.settings import LoopSettings, _http_url, _import_object

__all__ = ["aclose_resources", "discover_server_addresses"]


async def discover_server_addresses(server_manager: Any) -> tuple[str, ...]:
    """Addresses (``ip:port``) of verl's inference servers, from what verl hands the loop.

    verl 0.9.1 passes an ``LLMServerClient``, whose ``_load_balancer`` (a Ray actor) lists the
    servers by address (``get_all_servers``: the router is built from
    ``LLMServerManager.server_addresses``). An ``LLMServerManager`` itself (``server_addresses``
    / ``get_addresses()``) is accepted too.
    """
    addresses: Any = getattr(server_manager, "server_addresses", None)
    if addresses is None and callable(getattr(server_manager, "get_addresses", None)):
        addresses = server_manager.get_addresses()
    if addresses is None:
        balancer = getattr(server_manager, "_load_balancer", None) or getattr(
            server_manager, "global_load_balancer", None
        )
        if balancer is not None:
            ref = balancer.get_all_servers.remote()
            if inspect.isawaitable(ref):
                addresses = await ref
            else:  # pragma: no cover - a Ray ObjectRef is awaitable in Ray >= 2
                import ray

                addresses = ray.get(ref)
    if inspect.isawaitable(addresses):
        addresses = await addresses
    if not addresses:
        raise ValueError(
            "no gateway configured and no inference servers found on verl's server manager "
            f"({type(server_manager).__name__}): set gateway_url/admin_key or backends in the "
            "agent-loop YAML (or ROLLWIRE_GATEWAY_URL / ROLLWIRE_BACKENDS)"
        )
    return tuple(sorted(_http_url(str(a)) for a in addresses))


class _Resources:
    """What all loops of one process with the same settings share: gateway, runner, clients."""

    def __init__(self, settings: LoopSettings) -> None:
        self.settings = settings
        self.gateway: Any = None
        if settings.gateway_url:
            if not settings.admin_key:
                raise ValueError(
                    f"the gateway at {settings.gateway_url} needs its admin key: set admin_key "
                    "in the agent-loop YAML or ROLLWIRE_ADMIN_KEY"
                )
            self.url, self.admin_key = settings.gateway_url.rstrip("/"), settings.admin_key
        else:
            from rollwire.gateway import serve_in_thread

            self.gateway = serve_in_thread(
                backends=[(b, settings.backend_kind) for b in settings.backends]
            )
            self.url, self.admin_key = self.gateway.url, self.gateway.admin_key
        self.runner = self._make_runner()
        self._clients: dict[int, Any] = {}
        from rollwire.trainer.step_stamp import StepStamp

        #: this process's stamps of the gateway's policy version (once per verl step)
        self.stamp = StepStamp()

    def _make_runner(self) -> Any:
        from rollwire.trainer.runners import make_runner

        spec = self.settings.runner
        if ":" in spec and spec.split(":", 1)[0] not in ("local", "http", "ray", "agentcore"):
            obj = _import_object(spec)  # a Runner object or a factory of one
            return obj() if callable(obj) and not hasattr(obj, "invoke") else obj
        app = None
        if spec == "local":
            if not self.settings.agent:
                raise ValueError(
                    "the local runner needs the agent: set agent: 'package.module:app' (a "
                    "RolloutApp or handler) in the agent-loop YAML or ROLLWIRE_AGENT"
                )
            app = _import_object(self.settings.agent)
        return make_runner(spec, app=app, app_path=self.settings.agent)

    def client(self) -> Any:
        """The gateway client of the running event loop (httpx clients are per loop)."""
        from rollwire.trainer.gateway_client import AsyncGatewayClient

        key = id(asyncio.get_running_loop())
        gw = self._clients.get(key)
        if gw is None:
            gw = AsyncGatewayClient(self.url, self.admin_key)
            self._clients[key] = gw
        return gw

    async def aclose(self) -> None:
        """Close the runner and clients, and stop the in-process gateway if this started one."""
        await self.runner.aclose()
        for gw in self._clients.values():
            await gw.aclose()
        self._clients.clear()
        if self.gateway is not None:
            self.gateway.stop()


_RESOURCES: dict[LoopSettings, _Resources] = {}
_RESOURCES_LOCK = threading.Lock()


async def aclose_resources() -> None:
    """Release what the loops of this process share (runners, clients, in-process gateways)."""
    with _RESOURCES_LOCK:
        items = list(_RESOURCES.values())
        _RESOURCES.clear()
    for res in items:
        await res.aclose()


def _resources(settings: LoopSettings) -> _Resources:
    with _RESOURCES_LOCK:
        res = _RESOURCES.get(settings)
        if res is None:
            res = _Resources(settings)
            _RESOURCES[settings] = res
        return res
