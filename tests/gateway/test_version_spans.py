"""Per-token weight versions through the gateway (issues 23.4, 25.2): a ``keep`` pause that swaps
the embedded engine's weight version in the middle of a call gives the tokens-mode call two version
spans — in the store, in its rows and in the trainer exports — while a passthrough call records
one version."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest

from rollwire.data.protocol import Rollout, VersionSpan
from rollwire.data.trajectory import build_rows
from rollwire.engine import EmbeddedEngine, EngineConfig
from rollwire.gateway import RunningGateway, serve_in_thread
from rollwire.gateway.dataplane.capture import VERSIONS_INVALID_FLAG, capture_spans
from rollwire_rllm import to_episode_dicts
from rollwire_slime import to_sample_dicts

pytest.importorskip("transformers", reason="tokens mode needs rollwire[tokens]")

MSGS = [{"role": "user", "content": "count"}]
N = 400  # sampled tokens per call: long enough to pause it after a few decode steps


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[EmbeddedEngine, RunningGateway]]:
    with (
        EmbeddedEngine(EngineConfig(default_max_tokens=16)) as eng,
        serve_in_thread(backends=[(eng.url, "vllm")]) as gw,
    ):
        yield eng, gw


def _engine(eng: EmbeddedEngine, path: str, body: dict[str, Any] | None = None) -> None:
    r = httpx.post(eng.url + path, json=body or {}, timeout=30)
    assert r.status_code == 200, r.text


def _swap_mid_call(eng: EmbeddedEngine, steps_before: int, version: str) -> None:
    """Once the engine has decoded a few steps of the call: pause (keep), relabel, resume."""
    deadline = time.monotonic() + 60
    while eng.engine.scheduler.steps < steps_before + 5:
        assert time.monotonic() < deadline, "the engine never started decoding the call"
        time.sleep(0.002)
    _engine(eng, "/pause?mode=keep")
    _engine(eng, "/update_weight_version", {"new_version": version})
    _engine(eng, "/resume")


def _call_across_a_sync(
    eng: EmbeddedEngine, gw: RunningGateway, capture: str, stream: bool = False
) -> Any:
    _engine(eng, "/update_weight_version", {"new_version": "1"})
    with gw.client() as c:
        h = c.create_session(capture=capture)
        oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
        steps = eng.engine.scheduler.steps
        with ThreadPoolExecutor(1) as pool:
            # the engine's own chat route honours ignore_eos; tokens mode, min_tokens
            extra = {"min_tokens": N, "ignore_eos": True} if capture == "passthrough" else {}
            kw: dict[str, Any] = {
                "model": "policy",
                "messages": MSGS,
                "max_tokens": N,
                "extra_body": extra or {"min_tokens": N},
            }
            if stream:
                answer = pool.submit(lambda: list(oai.chat.completions.create(**kw, stream=True)))
            else:
                answer = pool.submit(lambda: oai.chat.completions.create(**kw))
            _swap_mid_call(eng, steps, "2")
            answer.result(timeout=120)
        (call,) = c.calls(h.session_id)
    return call


def test_a_keep_pause_mid_call_gives_two_spans_in_tokens_mode(
    stack: tuple[EmbeddedEngine, RunningGateway],
) -> None:
    eng, gw = stack
    call = _call_across_a_sync(eng, gw, "tokens")
    assert call.completion_ids.shape[0] == N
    first, second = call.weight_versions
    assert (first.version, first.start) == ("1", 0) and (second.version, second.end) == ("2", N)
    assert 0 < first.end == second.start < N
    assert call.policy_version == "2" and "weight_versions_invalid" not in call.flags
    cut = first.end

    rollout = Rollout(rollout_id=call.session_id, status="completed", reward=1.0, calls=[call])
    (row,) = build_rows([rollout])
    assert row.weight_versions == ["1", "2"]
    assert row.version_spans() == [("1", 0, cut), ("2", cut, N)]
    ((sample,),) = to_sample_dicts([rollout])
    assert sample["weight_versions"] == ["1", "2"]
    assert sample["metadata"]["rollwire"]["weight_version_spans"] == [["1", 0, cut], ["2", cut, N]]
    (episode,) = to_episode_dicts([rollout])
    (step,) = episode["trajectories"][0]["steps"]
    assert step["weight_version"] == 1
    assert step["info"]["rollwire"]["weight_versions"] == [["1", 0, cut], ["2", cut, N]]


@pytest.mark.parametrize("stream", [False, True])
def test_a_passthrough_call_records_the_spans_the_engine_reports(
    stack: tuple[EmbeddedEngine, RunningGateway], stream: bool
) -> None:
    eng, gw = stack
    call = _call_across_a_sync(eng, gw, "passthrough", stream)
    assert call.stream is stream
    spans = call.weight_versions
    assert call.completion_ids.shape[0] == N
    assert spans is not None and [s.version for s in spans] == ["1", "2"]
    assert spans[-1] == VersionSpan(version="2", start=spans[0].end, end=N)
    assert call.policy_version == "2" and call.capture == "passthrough"


def test_one_version_is_just_the_policy_version(
    stack: tuple[EmbeddedEngine, RunningGateway],
) -> None:
    eng, gw = stack
    _engine(eng, "/update_weight_version", {"new_version": "5"})
    with gw.client() as c:
        h = c.create_session(capture="tokens")
        oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
        oai.chat.completions.create(model="policy", messages=MSGS, max_tokens=4)  # type: ignore[arg-type]
        (call,) = c.calls(h.session_id)
    assert call.weight_versions is None and call.policy_version == "5"


def test_labels_that_do_not_fit_the_tokens_are_flagged_not_kept() -> None:
    good = [{"version": "1", "start": 0, "end": 1}, {"version": "2", "start": 1, "end": 3}]
    assert capture_spans(good, 3) == (
        [VersionSpan(version="1", start=0, end=1), VersionSpan(version="2", start=1, end=3)],
        None,
    )
    assert capture_spans(good, 4) == (None, VERSIONS_INVALID_FLAG)
    assert capture_spans(None, 4) == (None, None)
