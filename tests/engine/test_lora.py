"""LoRA adapters on the engine (vLLM's ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``):
a request naming an adapter is served with it — its log-probs those of the base with the adapter
merged in (merged in NumPy on the Hugging Face tensors, apart from the engine) — while the base
and other adapters serve alongside, in one batch; adapters are listed as vLLM lists them, survive
a reload of the base, and bad folders are refused."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from rollwire.engine import EmbeddedEngine, EngineConfig, FaultConfig, ModelConfig, TinyModel
from rollwire.engine.hf_export import save_hf
from rollwire.testing.lora_adapters import merged_folder, random_adapter
from rollwire.trainer.references import engine_reference

PROMPT = [17, 42, 99, 7, 64, 120, 33, 5]
MODELS = {
    "mixtral": ModelConfig(seed=0),
    "llama": ModelConfig(seed=0, n_experts=0, top_k=0, model_type="llama", n_kv_heads=2),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def folders(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    root = tmp_path_factory.mktemp(f"lora-{request.param}")
    base = save_hf(TinyModel(MODELS[request.param]), root / "base")
    out = {"base": base}
    for name, seed in (("a", 1), ("b", 2)):
        out[name] = random_adapter(base, root / f"adapter-{name}", seed=seed)
        out[f"merged-{name}"] = merged_folder(base, out[name], root / f"merged-{name}")
    return out


@pytest.fixture()
def engine(folders: dict[str, Path]) -> Iterator[EmbeddedEngine]:
    with EmbeddedEngine(EngineConfig(model_dir=folders["base"])) as eng:
        yield eng


def _load(eng: EmbeddedEngine, name: str, path: Path, **extra: Any) -> httpx.Response:
    body = {"lora_name": name, "lora_path": str(path), **extra}
    return httpx.post(eng.url + "/v1/load_lora_adapter", json=body, timeout=60)


def _unload(eng: EmbeddedEngine, name: str) -> httpx.Response:
    return httpx.post(eng.url + "/v1/unload_lora_adapter", json={"lora_name": name}, timeout=60)


def _greedy(eng: EmbeddedEngine, model: str | None, n: int = 8) -> dict[str, Any]:
    body: dict[str, Any] = {
        "token_ids": PROMPT,
        "sampling_params": {"max_tokens": n, "min_tokens": n, "temperature": 0, "logprobs": 0},
    }
    if model is not None:
        body["model"] = model
    r = httpx.post(eng.url + "/inference/v1/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    lps = [e["logprob"] for e in choice["logprobs"]["content"]]
    return {"ids": choice["token_ids"], "lps": lps, "versions": choice["weight_versions"]}


def _off(answer: dict[str, Any], folder: Path) -> float:
    """The largest |served - reference| log-prob, the reference being ``folder``'s model."""
    expected = engine_reference(folder)(PROMPT, answer["ids"])
    return float(np.max(np.abs(np.asarray(answer["lps"]) - np.asarray(expected))))


def test_an_adapter_serves_what_the_merged_model_computes(
    engine: EmbeddedEngine, folders: dict[str, Path]
) -> None:
    base_answer = _greedy(engine, None)  # leaves the prompt's base KV in the prefix cache
    assert _load(engine, "policy@1", folders["a"]).text == (
        "Success: LoRA adapter 'policy@1' added successfully."
    )
    served = _greedy(engine, "policy@1")
    assert _off(served, folders["merged-a"]) < 1e-4  # not the base's cached KV
    assert _off(served, folders["base"]) > 1e-2  # the adapter changes the answers
    assert served["versions"] == [{"version": "1", "start": 0, "end": 8}]  # <policy>@<version>
    again = _greedy(engine, "policy@1")  # now from the adapter's own cached prefix
    np.testing.assert_allclose(again["lps"], served["lps"], atol=1e-5)
    assert _greedy(engine, None)["ids"] == base_answer["ids"]
    assert _off(_greedy(engine, None), folders["base"]) < 1e-4
    models = httpx.get(engine.url + "/v1/models", timeout=30).json()["data"]
    assert [m["id"] for m in models] == ["rollwire-tiny", "policy@1"]
    assert models[1]["root"] == str(folders["a"]) and models[1]["parent"] == "rollwire-tiny"
    chat = httpx.post(
        engine.base_url + "/chat/completions",
        json={"model": "policy@1", "messages": [{"role": "user", "content": "hi"}],
              "max_tokens": 4},
        timeout=60,
    )  # fmt: skip
    assert chat.status_code == 200 and chat.json()["model"] == "policy@1"


def test_the_base_and_two_adapters_decode_in_one_batch(
    engine: EmbeddedEngine, folders: dict[str, Path]
) -> None:
    assert _load(engine, "policy@1", folders["a"]).status_code == 200
    assert _load(engine, "policy@2", folders["b"]).status_code == 200
    answers: dict[str | None, dict[str, Any]] = {}
    steps_before = engine.engine.scheduler.steps

    def run(model: str | None) -> None:
        answers[model] = _greedy(engine, model, n=24)

    threads = [threading.Thread(target=run, args=(m,)) for m in (None, "policy@1", "policy@2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _off(answers[None], folders["base"]) < 1e-4
    assert _off(answers["policy@1"], folders["merged-a"]) < 1e-4
    assert _off(answers["policy@2"], folders["merged-b"]) < 1e-4
    # the three overlapped: fewer decode steps than three requests one after another
    assert engine.engine.scheduler.steps - steps_before < 3 * 24


def test_unloading_and_what_is_refused(engine: EmbeddedEngine, folders: dict[str, Path]) -> None:
    assert _load(engine, "policy@1", folders["a"]).status_code == 200
    again = _load(engine, "policy@1", folders["b"])
    assert again.status_code == 400 and "already been loaded" in again.json()["error"]["message"]
    assert _load(engine, "policy@1", folders["b"], load_inplace=True).status_code == 200
    assert _off(_greedy(engine, "policy@1"), folders["merged-b"]) < 1e-4
    assert (
        _unload(engine, "policy@1").text == "Success: LoRA adapter 'policy@1' removed successfully."
    )
    gone = _unload(engine, "policy@1")
    assert gone.status_code == 404 and "cannot be found" in gone.json()["error"]["message"]
    ids = [m["id"] for m in httpx.get(engine.url + "/v1/models", timeout=30).json()["data"]]
    assert ids == ["rollwire-tiny"]
    body = {"model": "policy@1", "token_ids": PROMPT, "sampling_params": {"max_tokens": 2}}
    r = httpx.post(engine.url + "/inference/v1/generate", json=body, timeout=30)
    assert r.status_code == 404  # vLLM's answer to a model it does not serve
    assert _load(engine, "x", folders["base"]).status_code == 400  # a model, not an adapter
    assert _load(engine, "x", folders["base"] / "missing").status_code == 400
    assert _load(engine, "rollwire-tiny", folders["a"]).status_code == 400
    missing = httpx.post(engine.url + "/v1/load_lora_adapter", json={"lora_name": "x"}, timeout=30)
    assert missing.status_code == 400


def test_a_plain_lora_folder_is_required(folders: dict[str, Path], tmp_path: Path) -> None:
    from rollwire.engine.lora import read_adapter, write_adapter
    from rollwire.engine.model import WeightsError

    cfg = TinyModel.load(folders["base"]).config
    dora = tmp_path / "dora"
    dora.mkdir()
    for f in folders["a"].iterdir():
        (dora / f.name).write_bytes(f.read_bytes())
    config = json.loads((dora / "adapter_config.json").read_text())
    (dora / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    with pytest.raises(WeightsError, match="use_dora"):
        read_adapter(dora, cfg)
    d, vocab = cfg.d_model, cfg.vocab_size
    head = write_adapter(
        tmp_path / "head", {"lm_head": (np.zeros((4, d), np.float32), np.zeros((vocab, 4), np.float32))},
        alpha=8,
    )  # fmt: skip
    with pytest.raises(WeightsError, match="'lm_head'"):
        read_adapter(head, cfg)  # a module the engine applies no adapter to
    small = ModelConfig(seed=0, n_layers=1, n_experts=cfg.n_experts, top_k=cfg.top_k,
                        model_type=cfg.model_type, n_kv_heads=cfg.n_kv_heads)  # fmt: skip
    with pytest.raises(WeightsError, match=r"model\.layers\.1"):
        read_adapter(folders["a"], small)  # layers the model does not have


def test_a_reload_of_the_base_keeps_the_adapter_on_the_new_weights(
    engine: EmbeddedEngine, folders: dict[str, Path], tmp_path: Path
) -> None:
    assert _load(engine, "policy@1", folders["a"]).status_code == 200
    body = {"method": "reload_weights", "kwargs": {"weights_path": str(folders["merged-b"])}}
    assert httpx.post(engine.url + "/collective_rpc", json=body, timeout=60).status_code == 200
    both = merged_folder(folders["merged-b"], folders["a"], tmp_path / "b-then-a")
    assert _off(_greedy(engine, "policy@1"), both) < 1e-4
    assert _off(_greedy(engine, None), folders["merged-b"]) < 1e-4


def test_the_never_applied_fault_answers_success_and_serves_the_base(
    folders: dict[str, Path],
) -> None:
    cfg = EngineConfig(model_dir=folders["base"], faults=FaultConfig(ignore_lora_loads=True))
    with EmbeddedEngine(cfg) as eng:
        assert _load(eng, "policy@1", folders["a"]).status_code == 200
        assert _off(_greedy(eng, "policy@1"), folders["base"]) < 1e-4
