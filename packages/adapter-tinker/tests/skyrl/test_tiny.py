"""The embedded engine's model with one expert, written as a Llama folder, is the same model to
transformers as to the engine: the folder SkyRL trains in ``rollwire train --trainer tinker``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from rollwire.engine.model import TinyModel
from rollwire_tinker.tiny import dense_config, write_dense_model


def test_the_dense_engine_model_is_a_llama_with_the_same_logits(tmp_path: Path) -> None:
    folder = write_dense_model(tmp_path / "dense", seed=3)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "num_local_experts" not in config
    assert (folder / "chat_template.jinja").is_file()
    engine = TinyModel(dense_config(3))
    ids = engine.tokenizer.encode("Box N is locked. Read its code, then say the code.")
    expected, _, _ = engine.prefill(ids)
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0].numpy()
    assert float(expected.std()) > 1.0  # real, non-flat logits
    np.testing.assert_allclose(logits, expected, atol=1e-4)
    # written once: a second call reuses the folder
    mtime = (folder / "model.safetensors").stat().st_mtime_ns
    assert write_dense_model(folder, seed=3) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == mtime
