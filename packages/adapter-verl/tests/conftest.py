"""Fixtures of the verl adapter's trainer tests: the engine's model as a Hugging Face folder, and
``rollwire train`` run in a subprocess of this venv."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

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
