"""Fixtures of the verl adapter's trainer tests: the engine's model as a Hugging Face folder, and
``rollwire train`` run in a subprocess of this venv."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded engine's seeded model as a Hugging Face (Mixtral) folder."""
    from rollwire.engine.hf_export import save_hf
    from rollwire.engine.model import ModelConfig, TinyModel

    return save_hf(TinyModel(ModelConfig(seed=0)), tmp_path_factory.mktemp("base"))


#: runs ``rollwire train ARGS`` in a subprocess of this venv; returns it once it exited 0
TrainCLI = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture(scope="session")
def train_cli() -> TrainCLI:
    """``train_cli(*args, timeout=1200)``: ``rollwire train --no-progress ARGS``, asserted to
    exit 0 without a traceback (its output in the failure message)."""
    rollwire = str(Path(sys.executable).with_name("rollwire"))

    def run(*args: str, timeout: int = 1200) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [rollwire, "train", "--no-progress", *args],
            capture_output=True,
            text=True,
            env={**os.environ, "COLUMNS": "200"},
            timeout=timeout,
        )
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        assert "Traceback" not in proc.stdout + proc.stderr
        return proc

    return run


class FakeTQ(types.ModuleType):
    """``transfer_queue`` (not installed here): records what verl's v1 worker puts."""

    def __init__(self) -> None:
        super().__init__("transfer_queue")
        self.puts: list[dict[str, Any]] = []

    def init(self) -> None:
        return None

    async def async_kv_put(self, **kw: Any) -> None:
        return None

    async def async_kv_batch_put(self, **kw: Any) -> None:
        self.puts.append(kw)


@pytest.fixture
def tq_worker(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, FakeTQ]:
    """``(worker, transfer_queue)``: verl 0.9.1's ``AgentLoopWorkerTQ`` (the v1 trainer's
    worker) loaded from its source file with a stand-in ``transfer_queue``, unwrapped from
    ``ray.remote`` and built without Ray or ``__init__`` (each test sets what it needs)."""
    import verl

    fake = FakeTQ()
    monkeypatch.setitem(sys.modules, "transfer_queue", fake)
    path = Path(verl.__file__).parent / "trainer/ppo/v1/agent_loop_tq.py"
    spec = importlib.util.spec_from_file_location("_rollwire_test_agent_loop_tq", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cls = module.AgentLoopWorkerTQ.__ray_metadata__.modified_class.__mro__[1]
    assert cls.__name__ == "AgentLoopWorkerTQ"
    return object.__new__(cls), fake
