"""``save-model --format hf``: transformers loads the folder and reproduces the engine exactly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rollwire.engine import TinyModel

from .conftest import TOOLS

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is the weather in Paris today? Answer in one word."},
]


@pytest.fixture(scope="module")
def hf_model(model_dir: Path) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return model.eval()


def test_folder_is_a_mixtral_checkpoint(model_dir: Path, tiny_model: TinyModel) -> None:
    cfg = json.loads((model_dir / "config.json").read_text())
    assert cfg["architectures"] == ["MixtralForCausalLM"]
    assert (cfg["num_hidden_layers"], cfg["hidden_size"]) == (4, 128)
    assert (cfg["num_local_experts"], cfg["num_experts_per_tok"]) == (8, 2)
    assert cfg["vocab_size"] == tiny_model.config.vocab_size
    names = {p.name for p in model_dir.iterdir()}
    assert {"model.safetensors", "tokenizer.json", "chat_template.jinja"} <= names


def test_tokenizer_and_chat_template_agree(model_dir: Path, tiny_model: TinyModel) -> None:
    tok = AutoTokenizer.from_pretrained(model_dir)
    text = tok.apply_chat_template(
        MESSAGES, tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    assert text == tiny_model.tokenizer.render_chat(MESSAGES, TOOLS)
    assert tok(text, add_special_tokens=False)["input_ids"] == tiny_model.tokenizer.encode(text)
    assert tok.eos_token_id == tiny_model.tokenizer.eos_id


def test_logits_and_experts_match_the_engine(
    hf_model: torch.nn.Module, tiny_model: TinyModel
) -> None:
    ids = tiny_model.tokenizer.apply_chat_template(MESSAGES, TOOLS)
    assert len(ids) > 100
    logits, experts, _ = tiny_model.prefill(ids)
    chosen: dict[int, torch.Tensor] = {}
    hooks = []
    for i, layer in enumerate(hf_model.model.layers):
        gate = layer.mlp.gate if hasattr(layer, "mlp") else layer.block_sparse_moe.gate

        def keep(_m: object, _inp: object, out: object, i: int = i) -> None:
            # transformers 5: (router_logits, top_k_weights, top_k_index); 4.x: router logits
            if isinstance(out, tuple):
                chosen[i] = next(t for t in out if not t.is_floating_point())
            else:
                chosen[i] = torch.topk(out, 2, dim=-1).indices  # type: ignore[call-overload]

        hooks.append(gate.register_forward_hook(keep))
    try:
        with torch.no_grad():
            out = hf_model(torch.tensor([ids]))
    finally:
        for h in hooks:
            h.remove()
    hf_logits = out.logits[0].numpy()
    assert np.abs(hf_logits - logits).max() < 1e-4
    hf_lp = torch.log_softmax(out.logits[0], -1).numpy()
    lp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
    lp -= logits.max(-1, keepdims=True)
    assert np.abs(hf_lp - lp).max() < 1e-4
    for i in range(tiny_model.config.n_layers):
        assert np.array_equal(chosen[i].reshape(len(ids), -1).numpy(), experts[:, i]), i


def test_cli_writes_the_folder(tmp_path: Path, model_dir: Path) -> None:
    out = tmp_path / "cli-model"
    proc = subprocess.run(
        [
            str(Path(sys.executable).with_name("rollwire")),
            "engine",
            "save-model",
            str(out),
            "--format",
            "hf",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert (out / "model.safetensors").read_bytes() == (
        model_dir / "model.safetensors"
    ).read_bytes()
    assert json.loads((out / "config.json").read_text()) == json.loads(
        (model_dir / "config.json").read_text()
    )
