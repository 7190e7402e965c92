"""Shared fixtures of the TRL adapter's tests: TRL itself (or a skip outside the TRL venv), and
an embedded engine + gateway + lockbox agent behind a RolloutClient."""

from __future__ import annotations

import os
from collections.abc import Iterator
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
    return pytest.importorskip("trl", reason="TRL runs in .venv-trl (ci/run-tests.sh)")


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
