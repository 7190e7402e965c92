from __future__ import annotations

from pathlib import Path

import numpy as np

from rollwire.engine import ModelConfig, TinyModel
from rollwire.engine.sampling import SamplingParams, choose_token, log_softmax


def test_seeded_and_not_degenerate() -> None:
    a, b = TinyModel(), TinyModel()
    ids = a.tokenizer.encode("The weather in Paris is sunny.")
    la, ea, _ = a.prefill(ids)
    lb, eb, _ = b.prefill(ids)
    np.testing.assert_array_equal(la, lb)
    np.testing.assert_array_equal(ea, eb)
    assert 1.0 < float(la.std()) < 8.0
    assert ea.shape == (len(ids), 4, 2) and ea.dtype == np.int32
    assert ea.min() >= 0 and ea.max() < 8
    assert len(np.unique(ea)) > 4  # routing really varies
    other = TinyModel(ModelConfig(seed=1))
    assert not np.allclose(other.prefill(ids)[0], la)


def test_decode_matches_prefill_and_batch() -> None:
    m = TinyModel()
    ids = m.tokenizer.encode("Hello there, how are you?")
    _, _, cache = m.prefill(ids[:-1])
    _, _, cache2 = m.prefill(ids[:-1])
    full_logits, full_experts, _ = m.prefill(ids)
    step, step_experts = m.decode_batch([ids[-1], ids[-1]], [cache, cache2])
    np.testing.assert_allclose(log_softmax(step[0]), log_softmax(full_logits[-1]), atol=1e-4)
    np.testing.assert_allclose(step[0], step[1], atol=1e-5)
    np.testing.assert_array_equal(step_experts[0], full_experts[-1])


def test_save_load_roundtrip(tmp_path: Path) -> None:
    m = TinyModel()
    m.save(tmp_path / "m")
    assert (tmp_path / "m" / "tokenizer" / "tokenizer.json").exists()
    m2 = TinyModel.load(tmp_path / "m")
    ids = m.tokenizer.encode("abc def")
    np.testing.assert_array_equal(m.prefill(ids)[0], m2.prefill(ids)[0])


def test_sampling_controls() -> None:
    rng = np.random.default_rng(0)
    logits = np.array([0.0, 5.0, 4.9, -3.0], np.float32)
    assert choose_token(logits, SamplingParams(temperature=0.0), rng) == 1
    picks = {choose_token(logits, SamplingParams(top_k=1), rng) for _ in range(50)}
    assert picks == {1}
    picks = {choose_token(logits, SamplingParams(top_p=0.5), rng) for _ in range(50)}
    assert picks == {1}
    picks = {choose_token(logits, SamplingParams(temperature=1.0), rng) for _ in range(200)}
    assert {1, 2} <= picks
