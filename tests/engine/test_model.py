from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from rollwire.engine import ModelConfig, TinyModel
from rollwire.engine._blas import blas_threads
from rollwire.engine.prefix_cache import PrefixCache
from rollwire.engine.sampling import SamplingParams, choose_token, log_softmax
from rollwire.engine.scheduler import Scheduler


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


def test_chunked_prefill_matches_one_pass() -> None:
    m = TinyModel()
    rng = np.random.default_rng(1)
    ids = rng.integers(10, m.config.vocab_size, 700).tolist()
    full, full_experts, _ = m.prefill(ids)
    cache = m.new_cache()
    parts = []
    for a in range(0, len(ids), 300):  # chunks that straddle the attention query blocks
        logits, experts = m.forward(ids[a : a + 300], cache)
        parts.append((logits, experts))
    np.testing.assert_allclose(
        log_softmax(np.concatenate([p[0] for p in parts])), log_softmax(full), atol=1e-4
    )
    np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]), full_experts)
    # logits_from skips the output projection of rows nobody reads.
    tail, _ = m.forward(ids[:10], m.new_cache(), logits_from=7)
    np.testing.assert_allclose(log_softmax(tail), log_softmax(full[7:10]), atol=1e-4)


def test_prefill_memory_is_bounded_by_query_blocks() -> None:
    m = TinyModel()
    ids = np.random.default_rng(2).integers(10, m.config.vocab_size, 2048).tolist()
    cache = m.new_cache(len(ids) + 1)
    tracemalloc.start()
    try:
        m.forward(ids, cache, logits_from=len(ids) - 1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # A full [heads, 2048, 2048] float32 score matrix alone is 64 MiB; one 256-query block is 8.
    assert peak < 40 * 2**20, peak


def test_prefix_cache_reuses_the_longest_prefix() -> None:
    m = TinyModel()
    pc = PrefixCache(max_tokens=1000)
    ids = m.tokenizer.encode("The weather in Paris is sunny today, and tomorrow too.")
    cache = m.new_cache()
    _, experts = m.forward(ids, cache)
    pc.insert(ids, cache, experts)
    other = [*ids[:5], 1]  # shares 5 tokens
    restored, got = pc.restore(m, other + ids[6:], limit=100)
    assert restored.length == 5 and got is not None and got.shape[0] == 5
    np.testing.assert_array_equal(got, experts[:5])
    np.testing.assert_array_equal(restored.k[:, :, :5], cache.k[:, :, :5])
    assert pc.restore(m, ids, limit=3)[0].length == 3  # capped (the last prompt token is re-run)
    assert pc.restore(m, [7, 7, 7], limit=3)[1] is None
    # A longer sequence extending an entry replaces it; the budget evicts the oldest.
    longer = m.new_cache()
    _, e2 = m.forward([*ids, 5, 6], longer)
    pc.insert([*ids, 5, 6], longer, e2)
    assert len(pc) == 1 and pc.tokens == len(ids) + 2
    small = PrefixCache(max_tokens=len(ids) + 1)
    small.insert(ids, cache, experts)
    small.insert([*ids, 5, 6], longer, e2)  # over budget alone: not stored
    c3 = m.new_cache()
    _, e3 = m.forward([3, 4], c3)
    small.insert([3, 4], c3, e3)
    assert len(small) == 1 and small.tokens == 2  # the older entry made room


def test_scheduler_restores_blas_threads() -> None:
    before = blas_threads()
    if not before:
        pytest.skip("no BLAS thread control found in this NumPy build")
    a = Scheduler(TinyModel(), version=lambda: "0")
    b = Scheduler(a.model, version=lambda: "0")
    a.start()
    b.start()
    try:
        assert set(blas_threads()) == {1}
        a.stop()
        assert set(blas_threads()) == {1}  # b still runs
    finally:
        a.stop()
        b.stop()
    assert blas_threads() == before
