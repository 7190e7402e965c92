"""Real vLLM (CPU build) serving the embedded engine's own weights as a Mixtral folder.

One vLLM server for the whole group (it takes tens of seconds to start), with the scripted
logits processor of ``rollwire.testing.vllm_script`` and the same script the embedded engine gets,
so both serve the same weights and force the same replies. These tests run in ``.venv-vllm``
(``tests/vllm/ci/setup-venv.sh``, then ``tests/vllm/ci/run-tests.sh``, which ``.ci/run`` calls);
the workspace venv has no vLLM and the root conftest leaves this folder out of collection there.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("torch") is None:
    # only when named explicitly (`uv run pytest tests/vllm`): the root conftest leaves the folder
    # out of the workspace run, and an import error would not say what to do
    raise pytest.UsageError(
        "tests/vllm needs vLLM's CPU build and torch, which the workspace venv does not have: "
        "run `bash tests/vllm/ci/setup-venv.sh && bash tests/vllm/ci/run-tests.sh`"
    )

from rollwire.engine import EmbeddedEngine, EngineConfig, ModelConfig, TinyModel
from rollwire.engine.hf_export import save_hf
from rollwire.testing.agent import arithmetic_task, tool_schema

from . import vllm_scripts
from ._server import VLLMServer

NAME = "rollwire-tiny"
#: the arithmetic task's tools, as the OpenAI ``tools`` list
TOOLS: list[dict[str, Any]] = [tool_schema(fn) for fn in arithmetic_task().tools]
HERE = Path(__file__).parent


@pytest.fixture(scope="session")
def artifacts() -> Path:
    """Where server logs and the parity table go (``$ROLLWIRE_VLLM_ARTIFACTS`` or a temp dir)."""
    out = Path(os.environ.get("ROLLWIRE_VLLM_ARTIFACTS") or "/tmp/rollwire-vllm-tests")
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture(scope="session")
def tiny_model() -> TinyModel:
    return TinyModel(ModelConfig(seed=0))


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model: TinyModel) -> Path:
    """The engine's default model written by ``save_hf`` (what ``save-model --format hf`` does)."""
    return save_hf(tiny_model, tmp_path_factory.mktemp("mixtral") / "rollwire-tiny")


@pytest.fixture(scope="session")
def vllm(model_dir: Path, artifacts: Path) -> Iterator[VLLMServer]:
    server = VLLMServer(
        model_dir,
        artifacts / "vllm-server.log",
        served_name=NAME,
        script="vllm_scripts:script",
        pythonpath=HERE,
    )
    with server:
        print(f"\nvLLM started in {server.started_in_s:.1f} s")
        # tokens-mode sessions load the tokenizer with transformers (which imports torch here):
        # do it once now, so no test's first session waits on the import
        import transformers  # noqa: F401

        yield server


@pytest.fixture(scope="session")
def engine() -> Iterator[EmbeddedEngine]:
    """The embedded engine with the weights the Mixtral folder holds, and the same script."""
    cfg = EngineConfig(seed=0, scripted=vllm_scripts.script, served_model_names=(NAME,))
    with EmbeddedEngine(cfg) as eng:
        yield eng
