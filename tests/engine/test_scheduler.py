"""The worker: chunked prefill interleaved with decode, prefix reuse, scripted stop handling."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from rollwire.engine import SamplingParams, TinyModel
from rollwire.engine.scheduler import Completion, GenerationRequest, Scheduler


@pytest.fixture(scope="module")
def model() -> TinyModel:
    return TinyModel()


@pytest.fixture
def scheduler(model: TinyModel) -> Iterator[Scheduler]:
    s = Scheduler(model, version=lambda: "0", prefill_chunk_tokens=128)
    s.start()
    yield s
    s.stop()


class _Sink:
    def __init__(self, order: list[str] | None = None, name: str = "") -> None:
        self.done = threading.Event()
        self.result: Any = None
        self.order, self.name = order, name

    def __call__(self, ev: Any) -> None:
        if isinstance(ev, (Completion, Exception)):
            self.result = ev
            if self.order is not None:
                self.order.append(self.name)
            self.done.set()


def _run(s: Scheduler, prompt: list[int], params: SamplingParams, **kw: Any) -> Completion:
    sink = _Sink()
    s.submit(GenerationRequest(prompt, params, sink, **kw))
    assert sink.done.wait(60)
    assert isinstance(sink.result, Completion), sink.result
    return sink.result


def test_long_prefill_does_not_stall_other_streams(scheduler: Scheduler, model: TinyModel) -> None:
    rng = np.random.default_rng(0)
    long_prompt = rng.integers(10, 1300, 2000).tolist()
    order: list[str] = []
    scheduler.pause()  # queue both before the worker looks
    long_sink, short_sink = _Sink(order, "long"), _Sink(order, "short")
    scheduler.submit(
        GenerationRequest(long_prompt, SamplingParams(max_tokens=1, ignore_eos=True), long_sink)
    )
    scheduler.submit(
        GenerationRequest([5, 6, 7], SamplingParams(max_tokens=4, ignore_eos=True), short_sink)
    )
    chunks = scheduler.prefill_chunks
    scheduler.resume()
    assert long_sink.done.wait(60) and short_sink.done.wait(60)
    # 2,000 tokens in 128-token chunks: the short request decodes between them and ends first.
    assert order == ["short", "long"]
    assert scheduler.prefill_chunks - chunks == 16 + 1


def test_prefix_cache_reuse_keeps_logprobs(scheduler: Scheduler, model: TinyModel) -> None:
    prompt = model.tokenizer.encode("A long shared system prompt about tools and weather. " * 8)
    p = SamplingParams(max_tokens=8, temperature=0.7, seed=3, ignore_eos=True, logprobs=0)
    first = _run(scheduler, prompt, p)
    hits = scheduler.prefix_cache.hit_tokens
    again = _run(scheduler, prompt, p)
    assert again.cached_tokens == len(prompt) - 1 and first.cached_tokens < again.cached_tokens
    assert scheduler.prefix_cache.hit_tokens - hits == len(prompt) - 1
    assert again.output_ids == first.output_ids
    np.testing.assert_allclose(again.logprobs, first.logprobs, atol=1e-4)
    # Continue the conversation: the prompt extends the finished sequence.
    follow = [*prompt, *first.output_ids, *model.tokenizer.encode(" and more")]
    forced = model.tokenizer.encode("Forced reply.")
    cont = _run(scheduler, follow, SamplingParams(temperature=0.7), forced_ids=forced)
    assert cont.cached_tokens >= len(prompt) + len(first.output_ids) - 1
    # Teacher-forced full pass without the cache (prompt log-probs bypass it).
    full = _run(
        scheduler,
        [*follow, *forced],
        SamplingParams(max_tokens=0, temperature=0.7, prompt_logprobs=0),
    )
    assert full.cached_tokens == 0 and full.prompt_logprobs is not None
    ref = [full.prompt_logprobs[len(follow) + i] for i in range(len(forced))]
    np.testing.assert_allclose(cont.logprobs, [r[1] for r in ref if r is not None], atol=1e-4)


@pytest.mark.parametrize(
    ("kw", "n", "reason", "stop_reason"),
    [
        ({"max_tokens": 3}, 3, "length", None),
        ({"max_tokens": 0}, 0, "length", None),
        ({"stop": ["world"]}, None, "stop", "world"),
        ({}, None, "stop", None),
    ],
)
def test_scripted_honours_max_tokens_and_stop(
    scheduler: Scheduler,
    model: TinyModel,
    kw: dict[str, Any],
    n: int | None,
    reason: str,
    stop_reason: str | None,
) -> None:
    tok = model.tokenizer
    forced = [*tok.encode("Hello world, this is scripted."), tok.eos_id]
    c = _run(scheduler, tok.encode("hi"), SamplingParams(**kw), forced_ids=forced)
    assert c.finish_reason == reason and c.stop_reason == stop_reason
    if n is not None:
        assert c.output_ids == forced[:n]
    if kw.get("stop"):
        assert c.text == "Hello " and tok.decode(c.output_ids).endswith("world")
    if not kw:
        assert c.output_ids == forced and c.text == "Hello world, this is scripted."
    stop_id = forced[2]
    c2 = _run(
        scheduler, tok.encode("hi"), SamplingParams(stop_token_ids=[stop_id]), forced_ids=forced
    )
    assert c2.output_ids == forced[:3] and c2.stop_reason == stop_id
