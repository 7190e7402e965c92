"""Shared fixtures of the TRL adapter's tests: TRL itself (or a skip outside the TRL venv), and
an embedded engine + gateway + lockbox agent behind a RolloutClient."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest


@pytest.fixture(scope="session")
def trl() -> ModuleType:
    """``trl``, else skip — except under ``ROLLWIRE_REQUIRE_TRL=1`` (ci/run-tests.sh), where a
    missing TRL fails instead of hiding the tests."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    if os.environ.get("ROLLWIRE_REQUIRE_TRL") == "1":
        import trl as module

        return module
    return pytest.importorskip(
        "trl",
        reason="needs torch and TRL: bash packages/adapter-trl/ci/setup-venv.sh, then "
        "packages/adapter-trl/ci/run-tests.sh",
    )


@pytest.fixture(scope="session")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded engine's seeded model as a Hugging Face folder."""
    from rollwire.engine.hf_export import save_hf
    from rollwire.engine.model import ModelConfig, TinyModel

    return save_hf(TinyModel(ModelConfig(seed=0)), tmp_path_factory.mktemp("base"))


@pytest.fixture(scope="module")
def serving(trl: ModuleType, base_model: Path) -> Iterator[dict[str, Any]]:
    """Engine on ``base_model``, a gateway, and a RolloutClient running the lockbox agent."""
    from rollwire.engine import EmbeddedEngine, EngineConfig
    from rollwire.envs.lockbox.agent_openai import app
    from rollwire.gateway import serve_in_thread
    from rollwire.trainer.client import RolloutClient
    from rollwire.trainer.runners import LocalRunner

    with (
        EmbeddedEngine(EngineConfig(model_dir=base_model)) as engine,
        serve_in_thread(backends=[(engine.url, "vllm")]) as gateway,
    ):
        client = RolloutClient(
            gateway,
            runner=LocalRunner(app),
            group_size=4,
            sampling={"temperature": 1.0, "max_tokens": 6},
            deadline=120.0,
        )
        try:
            yield {"engine": engine, "gateway": gateway, "client": client}
        finally:
            client.close()


#: runs ``rollwire train ARGS`` in a subprocess of this venv; returns it once it exited 0
TrainCLI = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture(scope="session")
def train_cli() -> TrainCLI:
    """``train_cli(*args, cwd=None, env=None, timeout=2300)``: ``rollwire train`` with ``args``,
    asserted to exit 0 without a traceback (its output in the failure message)."""
    rollwire = str(Path(sys.executable).with_name("rollwire"))

    def run(
        *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: int = 2300
    ) -> subprocess.CompletedProcess[str]:
        full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
        proc = subprocess.run(
            [rollwire, "train", "--no-progress", *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            env=full_env,
            timeout=timeout,
        )
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        assert "Traceback" not in proc.stdout + proc.stderr
        return proc

    return run
