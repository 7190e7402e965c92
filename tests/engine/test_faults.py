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
    # Only generation routes fail.
    assert httpx.get(faulty.url + "/health", timeout=30).status_code == 200


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


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {**BODY, "stream": True}),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 6, "ignore_eos": True, "stream": True}),
    ],
)
def test_truncated_stream_drops_the_connection(
    faulty: EmbeddedEngine, path: str, body: dict[str, object]
) -> None:
    _set(faulty, truncate_stream_rate=1.0)
    lines: list[str] = []
    # A real truncation: the chunked body never completes, as when a server dies mid-stream.
    with (
        pytest.raises(httpx.RemoteProtocolError, match="incomplete chunked read"),
        httpx.stream("POST", faulty.url + path, json=body, timeout=10) as r,
    ):
        assert r.status_code == 200
        lines.extend(line for line in r.iter_lines() if line)
    assert lines and all(line.startswith("data: {") for line in lines)
    assert "data: [DONE]" not in lines
    _set(faulty)
    # The server is fine afterwards.
    assert httpx.post(faulty.url + path, json={**body, "stream": False}, timeout=10).is_success


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "hi", "max_tokens": 3, "return_token_ids": True}),
        ("/inference/v1/generate", {"token_ids": [5, 6, 7], "sampling_params": {"max_tokens": 3}}),
    ],
)
def test_faults_on_token_routes(faulty: EmbeddedEngine, path: str, body: dict[str, object]) -> None:
    _set(faulty, error_rate=1.0)
    r = httpx.post(faulty.url + path, json=body, timeout=10)
    assert r.status_code == 500 and r.json()["error"]["type"] == "InternalServerError"
    _set(faulty, throttle_rate=1.0)
    r = httpx.post(faulty.url + path, json=body, timeout=10)
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    _set(faulty, drop_token_ids_rate=1.0)
    d = httpx.post(faulty.url + path, json=body, timeout=10).json()
    [ch] = d["choices"]
    assert "token_ids" not in ch and "prompt_token_ids" not in ch
    _set(faulty)
    d = httpx.post(faulty.url + path, json=body, timeout=10).json()
    assert len(d["choices"][0]["token_ids"]) >= 1


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
