"""The ``tinker`` backend kind: sampling through the Tinker SDK's ``SamplingClient``.

Token-in by construction: the gateway renders the chat template (``capture="tokens"``) and the
sampler returns ids and log-probs. The backend's ``model`` is what it samples first (a base model
name, or a ``tinker://`` sampler path); a weight push swaps in the sampler of a new checkpoint
(``weights_path`` = its ``tinker://…/sampler_weights/NAME`` path) and that checkpoint's version
labels every call sampled by it. The SDK (``pip install "rollwire-tinker[tinker]"``) is imported
only when a ``tinker`` backend is used; its clients live on the :class:`Backend` they serve.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from rollwire.gateway.backends.pool import Backend

__all__ = ["HEALTH_PATH", "TinkerUnavailable", "new_sampler", "sdk", "swap_sampler"]

#: the Tinker service's health route (hosted Tinker and SkyRL's server)
HEALTH_PATH = "/api/v1/healthz"


class TinkerUnavailable(RuntimeError):
    """The Tinker SDK is not installed where the gateway runs."""


def sdk() -> Any:
    """The ``tinker`` module, or :class:`TinkerUnavailable` saying what to install."""
    try:
        import tinker
    except ImportError:
        raise TinkerUnavailable(
            "a tinker backend needs the Tinker SDK in the gateway's environment: "
            'pip install "rollwire[tinker]"'
        ) from None
    return tinker


def _service(backend: Backend) -> Any:
    if backend.client is None:
        tinker = sdk()
        key = os.environ.get("TINKER_API_KEY") or "tml-rollwire"
        backend.client = tinker.ServiceClient(base_url=backend.url, api_key=key)
    return backend.client


def new_sampler(backend: Backend, model: str) -> Any:
    """A SamplingClient of a base model name or a ``tinker://`` sampler path (blocking)."""
    service = _service(backend)
    if model.startswith("tinker://"):
        return service.create_sampling_client(model_path=model)
    return service.create_sampling_client(base_model=model)


async def swap_sampler(backend: Backend, *, model_path: str, version: str) -> dict[str, Any]:
    """Point ``backend`` at the sampler of checkpoint ``model_path`` and label it ``version``."""
    if not model_path.startswith("tinker://"):
        raise ValueError(
            f"a tinker backend takes a sampler checkpoint path tinker://…, got {model_path!r} "
            "(the trainer's save_weights_for_sampler(name).result().path)"
        )
    t0 = time.perf_counter()
    sampler = await asyncio.to_thread(new_sampler, backend, model_path)
    backend.sampler, backend.weight_version = sampler, version
    return {"route": "create_sampling_client", "seconds": time.perf_counter() - t0}
