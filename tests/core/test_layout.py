"""The layout's promises that lint-imports cannot see: what importing a side loads at run time."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _loaded_after(statement: str) -> set[str]:
    code = f"import sys, json\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout))


@pytest.mark.parametrize(
    "statement",
    [
        "import rollwire.agent",
        "from rollwire.agent import app, context, openai, serving",
        "from rollwire import RolloutApp, rollout_context",
    ],
)
def test_the_agent_side_loads_no_gateway_store_engine_or_numpy(statement: str) -> None:
    loaded = _loaded_after(statement)
    heavy = {
        m
        for m in loaded
        if m.split(".")[0] in {"numpy", "torch", "transformers"}
        or m.startswith(("rollwire.gateway", "rollwire.store", "rollwire.engine"))
        or m.startswith(("rollwire.trainer", "rollwire.cli"))
    }
    assert heavy == set()
    assert "rollwire.agent" in loaded


def test_the_data_model_loads_no_io_side() -> None:
    loaded = _loaded_after("import rollwire.data.trajectory, rollwire.data.dataset")
    assert "numpy" in loaded  # the data model is NumPy arrays
    sides = ("rollwire.gateway", "rollwire.store", "rollwire.agent", "rollwire.trainer")
    assert not [m for m in loaded if m.startswith(sides) or m in {"aiohttp", "starlette"}]
