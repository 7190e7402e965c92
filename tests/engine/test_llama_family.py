"""Dense Llama-family folders (Llama, Mistral, Qwen2, Qwen3) in the engine, without torch: each
option (grouped-query attention, tied embeddings, attention biases, q/k norm, a head width apart
from ``hidden_size``, scaled RoPE) against a plain float64 reference written the way
transformers computes it, the HF round trip, what a config the engine cannot run is refused for,
and a served dense model: chat template, tool calls, no routed experts, weight reload.

Log-probs against transformers itself (SmolLM2-135M and small random models of each family) are
checked in ``packages/adapter-trl/tests/test_engine_parity.py``, which runs where torch is.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from rollwire.engine import EmbeddedEngine, EngineConfig, ModelConfig, TinyModel
from rollwire.engine.hf_export import hf_config, hf_tensors, save_hf, write_safetensors
from rollwire.engine.hf_import import hf_model_config, load_hf, read_tensors
from rollwire.engine.model import WeightsError, rope_frequencies
from rollwire.engine.sampling import log_softmax

#: SmolLM2-135M-Instruct's chat template: no tools, and ``content`` concatenated as a string.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)

#: One small model per family and option; ``vocab_size`` follows the shipped tokenizer.
SHAPES: dict[str, ModelConfig] = {
    # SmolLM2's options: grouped KV heads, tied embeddings
    "llama-gqa-tied": ModelConfig(
        model_type="llama", n_experts=0, top_k=0, n_layers=2, d_model=96, n_heads=6,
        n_kv_heads=2, expert_hidden=160, tie_embeddings=True, rope_theta=100000.0,
        norm_eps=1e-5,
    ),
    # Llama 3.x: attention_bias (q/k/v and o) and llama3 RoPE scaling
    "llama3-bias": ModelConfig(
        model_type="llama", n_experts=0, top_k=0, n_layers=2, d_model=64, n_heads=4,
        n_kv_heads=1, expert_hidden=96, qkv_bias=True, o_bias=True, rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
        },
    ),
    "mistral": ModelConfig(
        model_type="mistral", n_experts=0, top_k=0, n_layers=2, d_model=64, n_heads=4,
        n_kv_heads=2, expert_hidden=96, rope_scaling={"rope_type": "linear", "factor": 2.0},
    ),
    # Qwen2: q/k/v biases, no o_proj bias
    "qwen2": ModelConfig(
        model_type="qwen2", n_experts=0, top_k=0, n_layers=2, d_model=64, n_heads=4,
        n_kv_heads=2, expert_hidden=96, qkv_bias=True, tie_embeddings=True, rope_theta=1e6,
    ),
    # Qwen3: per-head q/k norm, head_dim apart from hidden_size / heads, YaRN
    "qwen3-yarn": ModelConfig(
        model_type="qwen3", n_experts=0, top_k=0, n_layers=2, d_model=64, n_heads=4,
        n_kv_heads=2, head_size=32, expert_hidden=96, qk_norm=True, rope_theta=1e6,
        rope_scaling={
            "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
        },
    ),
}  # fmt: skip


def _model(name: str, seed: int = 0) -> TinyModel:
    model = TinyModel(replace(SHAPES[name], seed=seed))
    if model.w.q_norm is not None and model.w.k_norm is not None:  # ones would test nothing
        rng = np.random.default_rng(seed + 100)
        model.w.q_norm[:] = rng.uniform(0.5, 1.5, model.w.q_norm.shape)
        model.w.k_norm[:] = rng.uniform(0.5, 1.5, model.w.k_norm.shape)
    return model


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {name: save_hf(_model(name), root / name) for name in SHAPES}


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)  # rotate_half
    return x * cos + rotated * sin


def reference_logits(folder: Path, ids: list[int]) -> np.ndarray:
    """Logits of a Hugging Face folder in float64, written after transformers' Llama/Qwen
    modelling code (``repeat_kv``, ``rotate_half``, full causal softmax). The RoPE frequencies
    come from the engine; transformers checks them in the adapter-trl parity test."""
    raw = json.loads((folder / "config.json").read_text())
    cfg = hf_model_config(raw)
    t = {k: v.astype(np.float64) for k, v in read_tensors(folder).items()}
    H, KV, hd, eps = cfg.n_heads, cfg.kv_heads, cfg.head_dim, cfg.norm_eps
    T = len(ids)
    inv, scale = rope_frequencies(cfg)
    ang = np.arange(T)[:, None] * inv.astype(np.float64)[None, :]
    cos = np.concatenate([np.cos(ang)] * 2, axis=-1)[:, None, :] * scale
    sin = np.concatenate([np.sin(ang)] * 2, axis=-1)[:, None, :] * scale
    x = t["model.embed_tokens.weight"][ids]
    mask = np.triu(np.full((T, T), -np.inf), k=1)
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        h = _rms(x, t[p + "input_layernorm.weight"], eps)

        def proj(name: str, h: np.ndarray = h, p: str = p) -> np.ndarray:
            y = h @ t[f"{p}self_attn.{name}.weight"].T
            return y + t.get(f"{p}self_attn.{name}.bias", 0.0)

        q = proj("q_proj").reshape(T, H, hd)
        k = proj("k_proj").reshape(T, KV, hd)
        v = proj("v_proj").reshape(T, KV, hd)
        if cfg.qk_norm:
            q = _rms(q, t[p + "self_attn.q_norm.weight"], eps)
            k = _rms(k, t[p + "self_attn.k_norm.weight"], eps)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        k, v = np.repeat(k, H // KV, axis=1), np.repeat(v, H // KV, axis=1)  # repeat_kv
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + mask
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", a, v).reshape(T, H * hd)
        x = x + o @ t[p + "self_attn.o_proj.weight"].T + t.get(p + "self_attn.o_proj.bias", 0.0)
        h = _rms(x, t[p + "post_attention_layernorm.weight"], eps)
        gate = h @ t[p + "mlp.gate_proj.weight"].T
        up = h @ t[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ t[p + "mlp.down_proj.weight"].T
    head = t["model.embed_tokens.weight"] if cfg.tie_embeddings else t["lm_head.weight"]
    return np.asarray(_rms(x, t["model.norm.weight"], eps) @ head.T)


@pytest.mark.parametrize("name", list(SHAPES))
def test_matches_the_reference(folders: dict[str, Path], name: str) -> None:
    """Engine log-probs over the whole vocabulary against the float64 reference, on a prompt
    past the llama3/YaRN original context (64), where the scaling matters."""
    model = load_hf(folders[name])
    assert model.config == replace(
        SHAPES[name], vocab_size=model.config.vocab_size, head_size=model.config.head_dim
    )
    ids = np.random.default_rng(3).integers(10, model.config.vocab_size, 300).tolist()
    got = log_softmax(model.prefill(ids)[0])
    want = log_softmax(reference_logits(folders[name], ids))
    assert np.abs(got - want).max() < 1e-4


@pytest.mark.parametrize("name", list(SHAPES))
def test_round_trip_and_decode(folders: dict[str, Path], name: str) -> None:
    """engine -> HF -> engine is bit-exact; decode steps (batched) and chunked prefill agree
    with one pass; a dense model routes no experts."""
    model = _model(name)
    back = load_hf(folders[name])
    for key, arr in hf_tensors(model).items():
        assert hf_tensors(back)[key].tobytes() == arr.tobytes(), key
    ids = np.random.default_rng(1).integers(10, model.config.vocab_size, 40).tolist()
    full, experts, _ = model.prefill(ids)
    assert experts.shape == (len(ids), model.config.n_layers, 0)
    _, _, c1 = model.prefill(ids[:-1])
    _, _, c2 = model.prefill(ids[:-1])
    step, _ = model.decode_batch([ids[-1], ids[-1]], [c1, c2])
    np.testing.assert_allclose(log_softmax(step[0]), log_softmax(full[-1]), atol=1e-4)
    np.testing.assert_allclose(step[0], step[1], atol=1e-5)
    long = np.random.default_rng(2).integers(10, model.config.vocab_size, 600).tolist()
    one, _, _ = model.prefill(long)
    cache = model.new_cache()
    parts = [model.forward(long[a : a + 250], cache)[0] for a in range(0, 600, 250)]
    np.testing.assert_allclose(log_softmax(np.concatenate(parts)), log_softmax(one), atol=1e-4)


def test_engine_format_round_trip(tmp_path: Path) -> None:
    """``save``/``load`` (weights.npz) keeps a dense model's options, tied head included."""
    model = _model("qwen3-yarn")
    model.save(tmp_path / "m")
    back = TinyModel.load(tmp_path / "m")
    assert back.config == model.config
    ids = [5, 6, 7, 8]
    np.testing.assert_array_equal(model.prefill(ids)[0], back.prefill(ids)[0])
    tied = _model("llama-gqa-tied")
    assert "lm_head" not in tied.w.arrays()
    tied.save(tmp_path / "t")
    np.testing.assert_array_equal(
        TinyModel.load(tmp_path / "t").prefill(ids)[0], tied.prefill(ids)[0]
    )


def _config_of(name: str) -> dict[str, Any]:
    return hf_config(_model(name).config, eos_token_id=1, pad_token_id=0)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"model_type": "gemma", "architectures": ["GemmaForCausalLM"]}, "GemmaForCausalLM"),
        ({"sliding_window": 32}, "sliding_window"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
        ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, "longrope"),
        ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0}}, "low_freq_factor"),
        ({"layer_types": ["sliding_attention", "full_attention"]}, "layer_types"),
    ],
)
def test_refuses_what_it_cannot_run(change: dict[str, Any], named: str) -> None:
    cfg = {**_config_of("mistral"), **change}
    with pytest.raises(WeightsError, match=named):
        hf_model_config(cfg)


def test_qwen_sliding_window_flag_and_legacy_rope_keys() -> None:
    """Qwen configs carry a ``sliding_window`` size that only ``use_sliding_window`` turns on;
    older configs write ``rope_theta`` at the top and ``rope_scaling`` with ``type``."""
    cfg = {**_config_of("qwen2"), "sliding_window": 32768}
    assert hf_model_config(cfg).model_type == "qwen2"
    with pytest.raises(WeightsError, match="use_sliding_window"):
        hf_model_config({**cfg, "use_sliding_window": True})
    legacy = {**_config_of("mistral"), "rope_theta": 5e5}
    del legacy["rope_parameters"]
    legacy["rope_scaling"] = {"type": "linear", "factor": 4.0}
    got = hf_model_config(legacy)
    assert (got.rope_theta, got.rope_scaling) == (5e5, {"rope_type": "linear", "factor": 4.0})


def test_missing_or_extra_tensor_is_named(tmp_path: Path) -> None:
    model = _model("qwen2")
    tensors = hf_tensors(model)
    folder = save_hf(model, tmp_path / "bad")
    del tensors["model.layers.1.self_attn.k_proj.bias"]
    write_safetensors(folder / "model.safetensors", tensors)
    with pytest.raises(WeightsError, match=r"model\.layers\.1\.self_attn\.k_proj\.bias"):
        load_hf(folder)
    # a tied checkpoint may still carry lm_head.weight: it is ignored
    tensors = hf_tensors(model)
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"] * 2
    write_safetensors(folder / "model.safetensors", tensors)
    np.testing.assert_array_equal(load_hf(folder).prefill([5, 6])[0], model.prefill([5, 6])[0])


# ---------------------------------------------------------------- served
@pytest.fixture(scope="module")
def smol_like(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GQA + tied Llama folder with SmolLM2's chat template and stop settings."""
    folder = save_hf(_model("llama-gqa-tied"), tmp_path_factory.mktemp("smol") / "m")
    (folder / "chat_template.jinja").write_text(SMOLLM2_TEMPLATE)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config |= {"bos_token": "<|im_start|>", "pad_token": "<|im_end|>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    return folder


def test_serves_a_dense_folder(smol_like: Path, tmp_path: Path) -> None:
    reply = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    config = EngineConfig(
        model_dir=smol_like,
        return_routed_experts=True,
        scripted={"rules": [{"match": "add", "reply": reply}]},
    )
    with EmbeddedEngine(config) as eng:
        tok = eng.tokenizer
        assert tok.stop_ids == {tok.eos_id} and tok.pad_id == tok.eos_id
        assert tok.all_special_ids[:2] == [tok.encode("<|im_start|>")[0], tok.eos_id]
        tools = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
        messages: list[dict[str, Any]] = [{"role": "user", "content": "add 2 and 3"}]
        body = {"messages": messages, "tools": tools, "return_token_ids": True, "logprobs": True}
        r = httpx.post(eng.base_url + "/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        # the template is SmolLM2's (its system line), the tool call is parsed
        assert tok.decode(r.json()["prompt_token_ids"]).startswith(
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM"
        )
        assert choice["finish_reason"] == "tool_calls"
        call = choice["message"]["tool_calls"][0]["function"]
        assert (call["name"], json.loads(call["arguments"])) == ("add", {"a": 2, "b": 3})
        assert "routed_experts" not in choice  # a dense model routes nothing
        # the call goes back as OpenAI sends it: content null, arguments a JSON string
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [choice["message"]["tool_calls"][0]]},
            {"role": "tool", "tool_call_id": "x", "content": "5"},
        ]  # fmt: skip
        body = {"messages": messages, "max_tokens": 4, "temperature": 0, "logprobs": True}
        r = httpx.post(eng.base_url + "/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        before = r.json()["choices"][0]["logprobs"]["content"]

        # reload: another dense folder of the same shape serves; another family is refused
        other = save_hf(_model("llama-gqa-tied", seed=7), tmp_path / "other")
        rpc = {"method": "reload_weights", "kwargs": {"weights_path": str(other)}}
        assert httpx.post(eng.url + "/collective_rpc", json=rpc, timeout=60).status_code == 200
        r = httpx.post(eng.base_url + "/chat/completions", json=body, timeout=60)
        assert r.json()["choices"][0]["logprobs"]["content"] != before
        qwen = save_hf(_model("qwen2"), tmp_path / "qwen")
        rpc["kwargs"]["weights_path"] = str(qwen)
        r = httpx.post(eng.url + "/collective_rpc", json=rpc, timeout=60)
        assert r.status_code == 400 and "model_type" in r.text


def test_sentencepiece_style_tokenizer_folder(tmp_path: Path) -> None:
    """A Llama-2-style folder (Metaspace pieces, byte fallback, ``</s>``, no chat template):
    token bytes are the text they stand for, eos and stops come from its configs, and a chat
    is refused with the reason rather than rendered in a template it never had."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    from rollwire.engine import EngineTokenizer

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<0x0A>": 3, "<0xC3>": 4, "<0xA9>": 5, "\u2581": 6}
    vocab |= {"h": 7, "i": 8, "hi": 9, "\u2581hi": 10}
    tok = Tokenizer(
        models.BPE(vocab=vocab, merges=[("h", "i"), ("\u2581", "hi")], byte_fallback=True)
    )
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<unk>", "<s>", "</s>")])
    tok.save(str(tmp_path / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 1]}))
    engine_tok = EngineTokenizer(tmp_path)
    ids = engine_tok.encode("hi\nhi \u00e9")
    assert b"".join(engine_tok.token_bytes(i) for i in ids) == " hi\nhi \u00e9".encode()
    assert engine_tok.decode(ids) == " hi\nhi \u00e9"
    assert (engine_tok.eos_id, engine_tok.pad_id, engine_tok.stop_ids) == (2, 2, {1, 2})
    assert engine_tok.all_special_ids == [1, 2, 0] and engine_tok.special_ids == {0, 1, 2}
    with pytest.raises(ValueError, match="has no chat template"):
        engine_tok.render_chat([{"role": "user", "content": "hi"}])
