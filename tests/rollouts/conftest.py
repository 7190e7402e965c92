"""Shared servers for the rollout tests: a scripted embedded engine, a real gateway, a stand-in
for ``complete_url``. Every server runs on 127.0.0.1 on a free port and is stopped at the end."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollwire.testing.recording import CompleteRecorder


@pytest.fixture
def recorder() -> Iterator[CompleteRecorder]:
    rec = CompleteRecorder()
    with rec.server:
        yield rec


@pytest.fixture(scope="module")
def stack() -> Iterator[Any]:
    """A scripted embedded engine (Wordle solver) behind a real gateway."""
    from rollwire.engine import EmbeddedEngine, EngineConfig
    from rollwire.envs.wordle import WordleSolver
    from rollwire.gateway import serve_in_thread

    with (
        EmbeddedEngine(EngineConfig(scripted=WordleSolver(seed=0))) as engine,
        serve_in_thread(backends=[(engine.url, "vllm")]) as gateway,
    ):
        yield gateway


@pytest.fixture(scope="session")
def ray_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One local Ray for the whole test session, started with room for a busy machine; yields
    a folder on the workers' ``PYTHONPATH`` (with the driver's ``sys.path``) for test agents.

    Ray waits a fixed 30 s for its raylet to register; on a loaded machine that start can miss
    it, and the next try (with the node's files already in the page cache) is much faster. So
    the start is tried up to three times before the test fails on it.
    """
    # Under `uv run`, Ray would package the working tree and start every worker through `uv
    # run` (minutes on a loaded machine: a rollout once ran past a 240 s deadline that way). Ray
    # reads this switch when it is imported, so it is set first, and set on the constant in case
    # another test imported Ray already.
    os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray = pytest.importorskip("ray")
    from ray._private import ray_constants

    ray_constants.RAY_ENABLE_UV_RUN_RUNTIME_ENV = False
    modules = tmp_path_factory.mktemp("ray-agents")
    paths = [str(modules), *(p for p in sys.path if p and os.path.isdir(p))]
    errors: list[str] = []
    for _ in range(3):
        try:
            ray.init(
                num_cpus=2,
                include_dashboard=False,
                log_to_driver=False,
                runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(paths)}},
            )
            break
        except Exception as exc:  # "The current node timed out during startup"
            errors.append(repr(exc))
            ray.shutdown()
    else:
        raise RuntimeError(f"Ray did not start in three tries: {errors}")
    sys.path.insert(0, str(modules))
    try:
        yield modules
    finally:
        sys.path.remove(str(modules))
        ray.shutdown()
