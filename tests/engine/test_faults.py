"""Each fault flag produces its fault; draws are seeded and reproducible."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest

from rollwire.engine import EmbeddedEngine, EngineConfig, FaultConfig
from rollwire.engine.faults import FaultInjector

MSGS = [{"role": "user", "content": "hi"}]
BODY = {"messages": MSGS, "max_tokens": 6, "ignore_eos": True, "return_token_ids": True}


@pytest.fixture(scope="module")
def faulty() -> Iterator[EmbeddedEngine]:
    # One server; each test swaps the injector (faults are drawn per request).
    with EmbeddedEngine(EngineConfig()) as eng:
        yield eng


def _set(eng: EmbeddedEngine, **kw: float) -> None:
    eng.engine.faults = FaultInjector(FaultConfig(**kw))  # type: ignore[arg-type]


def test_error(faulty: EmbeddedEngine) -> None:
    _set(faulty, error_rate=1.0)
    r = httpx.post(faulty.base_url + "/chat/completions", json=BODY, timeout=10)
    assert r.status_code == 500 and r.json()["error"]["code"] == 500
    assert httpx.get(faulty.url + "/health").status_code == 200  # only generation routes fail


def test_throttle(faulty: EmbeddedEngine) -> None:
    _set(faulty, throttle_rate=1.0)
    r = httpx.post(faulty.url + "/generate", json={"text": "x"}, timeout=10)
    assert r.status_code == 429 and r.headers["retry-after"] == "1"


def test_latency(faulty: EmbeddedEngine) -> None:
    _set(faulty, latency_ms=300)
    t0 = time.monotonic()
    assert (
        httpx.post(faulty.base_url + "/chat/completions", json=BODY, timeout=10).status_code == 200
    )
    assert time.monotonic() - t0 >= 0.3


def test_truncated_stream(faulty: EmbeddedEngine) -> None:
    _set(faulty, truncate_stream_rate=1.0)
    with httpx.stream(
        "POST", faulty.base_url + "/chat/completions", json={**BODY, "stream": True}, timeout=10
    ) as r:
        lines = [line for line in r.iter_lines() if line]
    assert lines and "data: [DONE]" not in lines


def test_dropped_token_ids(faulty: EmbeddedEngine) -> None:
    _set(faulty, drop_token_ids_rate=1.0)
    d = httpx.post(faulty.base_url + "/chat/completions", json=BODY, timeout=10).json()
    assert "prompt_token_ids" not in d and "token_ids" not in d["choices"][0]
    assert d["choices"][0]["message"]["role"] == "assistant"
    with httpx.stream(
        "POST", faulty.base_url + "/chat/completions", json={**BODY, "stream": True}, timeout=10
    ) as r:
        chunks = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
    assert all(
        "prompt_token_ids" not in c and all("token_ids" not in ch for ch in c["choices"])
        for c in chunks
    )


def test_seeded_reproducible() -> None:
    cfg = FaultConfig(error_rate=0.5, throttle_rate=0.3, seed=42)
    a = [FaultInjector(cfg).draw() for _ in range(1)]
    inj1, inj2 = FaultInjector(cfg), FaultInjector(cfg)
    seq1 = [inj1.draw() for _ in range(50)]
    seq2 = [inj2.draw() for _ in range(50)]
    assert seq1 == seq2 and a[0] == seq1[0]
    assert 10 < sum(d.error for d in seq1) < 40
