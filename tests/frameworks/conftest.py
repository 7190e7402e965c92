"""Eight agent frameworks, each run for real through the gateway (docs/frameworks.md).

They run in ``.venv-frameworks`` (``tests/frameworks/ci/setup-venv.sh``, then
``tests/frameworks/ci/run-tests.sh``, which ``.ci/run`` calls, inside a network namespace with
only loopback up); the workspace venv has none of them and the root conftest leaves this folder
out of collection there. Everything the frameworks would send home is switched off here, by the
environment variables their production deployments use, before any of them is imported.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

#: the import name of each framework tested here
FRAMEWORKS = (
    "pydantic_ai",
    "smolagents",
    "llama_index.llms.openai_like",
    "dspy",
    "autogen_agentchat",
    "crewai",
    "google.adk",
    "claude_agent_sdk",
)


def _missing() -> list[str]:
    missing = []
    for name in FRAMEWORKS:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # a parent package is missing
            found = False
        if not found:
            missing.append(name)
    return missing


if _missing():
    # only when named explicitly (`uv run pytest tests/frameworks`): the root conftest leaves the
    # folder out of the workspace run, and an import error would not say what to do
    raise pytest.UsageError(
        f"tests/frameworks needs {', '.join(_missing())}, which the workspace venv does not have: "
        "run `bash tests/frameworks/ci/setup-venv.sh && bash tests/frameworks/ci/run-tests.sh`"
    )

QUIET = {
    # LiteLLM (DSPy, CrewAI, ADK's LiteLlm): the bundled model-cost map, not a download
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_TELEMETRY": "False",
    # CrewAI: anonymous telemetry and its tracing service
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_DISABLE_TRACKING": "true",
    "CREWAI_TRACING_ENABLED": "false",
    "OTEL_SDK_DISABLED": "true",
    # Hugging Face hub (smolagents, tokens capture): nothing from the hub
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    # DSPy: its LM cache stays out of the home directory
    "DSPY_CACHEDIR": os.path.join(os.environ.get("TMPDIR", "/tmp"), "rollwire-dspy-cache"),
}
for _key, _value in QUIET.items():
    os.environ.setdefault(_key, _value)
