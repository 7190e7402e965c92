"""Stubs for the packages slime imports at module level that its CPU-side code does not use.

slime's modules import Ray, SGLang, Megatron (and a few GPU-only helpers) when they load; the
functions ``record_contract.py`` runs need none of them. :func:`install_stubs` answers those
imports, for this process only, with modules whose every name is an inert placeholder; Ray's
decorators and object store become the identity and Megatron's ``mpu`` reports one rank with no
tensor, context or pipeline parallelism.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
from typing import Any

#: imported by slime's modules at load time, not used by the code recorded here
STUBBED = ("ray", "sglang", "sglang_router", "megatron", "wandb", "pybase64", "torch_memory_saver")


class _Anything:
    """Stands in for any name of a stubbed package: constructible, callable, subscriptable."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _Anything()

    def __getattr__(self, name: str) -> Any:
        return _Anything()

    def __class_getitem__(cls, item: Any) -> Any:
        return cls


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (_Anything,), {})


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def install_stubs() -> None:
    """Stub the GPU-side packages; Ray's decorators and object store become the identity, and
    Megatron's ``mpu`` one rank with no tensor, context or pipeline parallelism."""
    os.environ["TORCHDYNAMO_DISABLE"] = "1"
    sys.meta_path.insert(0, _StubFinder())
    import megatron.core
    import ray

    ray.remote = lambda *a, **k: a[0] if a and callable(a[0]) and not k else (lambda c: c)  # type: ignore[assignment]
    ray.put = lambda value, **kwargs: value  # type: ignore[assignment]
    ray.get = lambda value: value  # type: ignore[assignment]
    one = types.SimpleNamespace(
        get_context_parallel_world_size=lambda: 1,
        get_context_parallel_rank=lambda: 0,
        get_tensor_model_parallel_world_size=lambda: 1,
        get_tensor_model_parallel_group=lambda: None,
        get_data_parallel_world_size=lambda with_context_parallel=False: 1,
        get_data_parallel_rank=lambda with_context_parallel=False: 0,
        get_data_parallel_group=lambda with_context_parallel=False: None,
        get_virtual_pipeline_model_parallel_world_size=lambda: None,
        is_pipeline_last_stage=lambda: True,
    )
    megatron.core.mpu = one  # type: ignore[attr-defined]
