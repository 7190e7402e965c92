"""``save-model --format hf`` without torch: the safetensors file holds the engine's weights under
Mixtral's names, transposed as ``nn.Linear`` stores them (transformers and vLLM loading the folder
is checked in tests/vllm)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from rollwire.cli import engine as cli
from rollwire.engine import EmbeddedEngine, EngineConfig, ModelConfig, TinyModel
from rollwire.engine.hf_export import mixtral_tensors, write_safetensors

safetensors_numpy = pytest.importorskip("safetensors.numpy")


def test_cli_writes_a_mixtral_folder(tmp_path: Path) -> None:
    out = tmp_path / "hf"
    r = CliRunner().invoke(
        cli.engine_app, ["save-model", str(out), "--format", "hf", "--seed", "2"]
    )
    assert r.exit_code == 0, r.output
    model = TinyModel(ModelConfig(seed=2))
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["MixtralForCausalLM"] and cfg["model_type"] == "mixtral"
    assert cfg["vocab_size"] == model.config.vocab_size
    assert (cfg["num_local_experts"], cfg["num_experts_per_tok"]) == (8, 2)
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [model.tokenizer.eos_id, model.tokenizer.pad_id]
    assert (out / "chat_template.jinja").read_text() == (
        Path(model.tokenizer.folder) / "chat_template.jinja"
    ).read_text()
    loaded = safetensors_numpy.load_file(str(out / "model.safetensors"))
    expected = mixtral_tensors(model)
    assert loaded.keys() == expected.keys()
    assert len(loaded) == 3 + 4 * (7 + 3 * 8)
    for name, arr in expected.items():
        np.testing.assert_array_equal(loaded[name], arr, err_msg=name)
    d = model.config.d_model
    layer0 = model.w.wqkv[0]
    np.testing.assert_array_equal(
        loaded["model.layers.0.self_attn.k_proj.weight"], layer0[:, d : 2 * d].T
    )
    np.testing.assert_array_equal(
        loaded["model.layers.3.block_sparse_moe.experts.5.w2.weight"], model.w.w2[3, 5].T
    )


def test_bad_format_is_refused(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli.engine_app, ["save-model", str(tmp_path / "x"), "--format", "gguf"])
    assert r.exit_code != 0 and "engine or hf" in r.output


def test_only_float32_is_written(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="only float32"):
        write_safetensors(tmp_path / "t.safetensors", {"w": np.zeros(3, np.float64)})


def test_max_model_len_is_served(tmp_path: Path) -> None:
    with EmbeddedEngine(EngineConfig(max_model_len=64)) as eng:
        (card,) = httpx.get(eng.url + "/v1/models", timeout=30).json()["data"]
        assert card["max_model_len"] == 64
        body = {"model": "rollwire-tiny", "prompt": [5] * 60, "max_tokens": 10}
        r = httpx.post(eng.url + "/v1/completions", json=body, timeout=30)
        assert r.status_code == 400 and "max_model_len 64" in r.json()["error"]["message"]
