"""verl's actor in this process, on the CPU: a verl platform for the CPU and a one-rank process
group, set up before the actor is built.

verl 0.9.1 reaches the device through its platform plugin (:mod:`verl.plugin.platform`) and
builds its workers inside a ``torch.distributed`` process group. Its built-in platforms are
accelerators; :class:`CpuPlatform` is the CPU under the same interface (device ``cpu``, the
``gloo`` backend, memory statistics 0). The FSDP engine is registered for ``cuda`` devices only,
so ``VERL_ENGINE_DEVICE=cuda`` selects it while the platform, and so every tensor, stays on the
CPU. The group is made here, world size 1 on a ``HashStore`` (no port), because verl's own
``initialize_global_process_group_ray`` asks for ``cpu:gloo,cpu:gloo``, which torch rejects.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist
from verl.plugin.platform import PlatformBase, set_platform

__all__ = ["CpuPlatform", "use_cpu"]

#: the ``torch.<device>`` functions verl calls that ``torch.cpu`` lacks: memory figures are 0,
#: the RNG is the CPU's
_CPU_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "max_memory_allocated": lambda *a, **k: 0,
    "max_memory_reserved": lambda *a, **k: 0,
    "memory_allocated": lambda *a, **k: 0,
    "memory_reserved": lambda *a, **k: 0,
    "mem_get_info": lambda *a, **k: (0, 0),
    "reset_peak_memory_stats": lambda *a, **k: None,
    "empty_cache": lambda *a, **k: None,
    "synchronize": lambda *a, **k: None,
    "set_device": lambda *a, **k: None,
    "manual_seed": lambda seed: torch.manual_seed(seed),
    "manual_seed_all": lambda seed: torch.manual_seed(seed),
    "get_rng_state": lambda *a, **k: torch.get_rng_state(),
    "set_rng_state": lambda state, *a, **k: torch.set_rng_state(state),
    "get_device_name": lambda *a, **k: "CPU",
    "is_available": lambda: True,
    "device_count": lambda: 1,
}


class _CpuDevice(ModuleType):
    """``torch.cpu`` with the ``torch.cuda`` functions verl calls (memory figures 0)."""

    def __init__(self) -> None:
        super().__init__("rollwire_verl.cpu_device")

    def __getattr__(self, name: str) -> Any:
        if name in _CPU_FUNCTIONS:
            return _CPU_FUNCTIONS[name]
        return getattr(torch.cpu, name)


class CpuPlatform(PlatformBase):  # type: ignore[misc]
    """The CPU as a verl platform: device ``cpu``, backend ``gloo``, no profiler, no IPC."""

    device_module = _CpuDevice()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    def is_available(self) -> bool:
        return True

    def current_device(self) -> Any:  # verl passes it to ``tensor.to(...)``: the device itself
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def use_cpu() -> None:
    """Make verl run on the CPU in this process (safe to call again): the platform, the engine's
    device key, the one-rank ``gloo`` group and the rank variables verl's ``Worker`` reads."""
    from verl.plugin.platform import platform_manager

    if not isinstance(getattr(platform_manager, "_current_platform", None), CpuPlatform):
        set_platform(CpuPlatform())
    os.environ["VERL_ENGINE_DEVICE"] = "cuda"  # the FSDP engine's registry key, not the device
    if dist.is_initialized():
        if dist.get_world_size() != 1 or dist.get_backend() != "gloo":
            raise RuntimeError(
                "the verl trainer runs verl's actor in this process, on a one-rank gloo group; "
                f"this process already has a {dist.get_backend()} group of "
                f"{dist.get_world_size()} ranks"
            )
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    # verl's Worker reads these (and writes them back); the group above does not use them
    for key, value in (("WORLD_SIZE", "1"), ("RANK", "0"), ("LOCAL_RANK", "0"),
                       ("LOCAL_WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                       ("MASTER_PORT", "0")):  # fmt: skip
        os.environ[key] = value
