"""Streamed passthrough calls of a session that wants routed experts (issue 14, item 8).

vLLM and SGLang put routed experts on a whole response only, never on stream chunks, so a streamed
call was captured without routing. A session created with ``routed_experts=True`` has such a call
asked non-streamed and re-streamed to the agent; one that still comes back without routing is
flagged ``routed_experts_missing`` and counted in ``/metrics``. Since issue 25.6 the same holds by
default once the backend has returned routing (``routed_experts=False`` opts out).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from rollwire.cli.summary import routing_notes, summarize
from rollwire.engine import EmbeddedEngine, EngineConfig
from rollwire.gateway import RunningGateway, serve_in_thread

MSGS = [{"role": "user", "content": "hello"}]


def _script(messages: list[dict[str, Any]], tools: Any) -> str:
    return "Hello there, friend."


@pytest.fixture(scope="module")
def moe() -> Iterator[tuple[EmbeddedEngine, RunningGateway]]:
    cfg = EngineConfig(scripted=_script, return_routed_experts=True, default_max_tokens=32)
    with EmbeddedEngine(cfg) as eng, serve_in_thread(backends=[(eng.url, "vllm")]) as gw:
        yield eng, gw


def _stream_text(oai: openai.OpenAI, **kw: Any) -> tuple[str, list[Any]]:
    chunks = list(oai.chat.completions.create(model="policy", messages=MSGS, stream=True, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks


def test_streamed_call_carries_routing_when_the_session_wants_it(
    moe: tuple[EmbeddedEngine, RunningGateway],
) -> None:
    eng, gw = moe
    layers, top_k = eng.engine.model.config.n_layers, eng.engine.model.config.top_k
    with gw.client() as c:
        h = c.create_session(routed_experts=True)
        oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
        text, chunks = _stream_text(oai, stream_options={"include_usage": True})
        plain = oai.chat.completions.create(model="policy", messages=MSGS)
        assert text == plain.choices[0].message.content == "Hello there, friend."
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
        assert chunks[-2].choices[0].finish_reason == "stop"
        streamed, whole = c.calls(h.session_id)
        assert streamed.stream and not whole.stream
        for call in (streamed, whole):
            assert call.routed_experts is not None
            n = call.prompt_ids.shape[0] + call.completion_ids.shape[0] - 1
            assert call.routed_experts.shape == (n, layers, top_k)
            assert "routed_experts_missing" not in call.flags and call.trainable
        # the agent sees no vendor fields it did not ask for
        assert "routed_experts" not in chunks[-2].choices[0].model_dump()


def test_a_stream_carries_routing_by_default_once_the_backend_has_returned_it() -> None:
    # issue 25.6: a streaming agent on an MoE backend trains with routing without asking for it
    cfg = EngineConfig(scripted=_script, return_routed_experts=True, default_max_tokens=32)
    engine = EmbeddedEngine(cfg)
    with engine as eng, serve_in_thread(backends=[(eng.url, "vllm")]) as gw, gw.client() as c:
        assert [b["returns_routing"] for b in c.backends()] == [False]
        h = c.create_session()
        oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
        _stream_text(oai)  # the gateway has not seen this backend return routing yet
        oai.chat.completions.create(model="policy", messages=MSGS)  # a whole answer has it
        assert [b["returns_routing"] for b in c.backends()] == [True]
        text, chunks = _stream_text(oai, stream_options={"include_usage": True})
        assert text == "Hello there, friend." and chunks[-1].usage is not None
        assert "routed_experts" not in chunks[-2].choices[0].model_dump()
        before, whole, streamed = c.calls(h.session_id)
        assert before.stream and before.routed_experts is None
        assert "routed_experts_missing" not in before.flags
        assert whole.routed_experts is not None
        assert streamed.stream and streamed.routed_experts is not None and streamed.trainable
        # a session can still opt out: its stream is relayed as it comes, without routing
        out = c.create_session(routed_experts=False)
        _stream_text(openai.OpenAI(base_url=out.base_url, api_key="x", max_retries=0))
        (plain,) = c.calls(out.session_id)
        assert plain.stream and plain.routed_experts is None
        assert "routed_experts_missing" not in plain.flags
        # the run's summary says which MoE backend's calls carry none
        s = summarize([c.rollout(h.session_id), c.rollout(out.session_id)], [], 0.0)
        assert s["routed_calls"] == 2 and s["routing_gaps"] == {"b0": [2, 4]}
        (note,) = routing_notes(s)
        assert "backend b0" in note and "2 of its 4 calls carry none" in note


def test_a_call_without_routing_is_flagged_and_counted() -> None:
    cfg = EngineConfig(scripted=_script, return_routed_experts=False, default_max_tokens=32)
    with EmbeddedEngine(cfg) as eng, serve_in_thread(backends=[(eng.url, "vllm")]) as gw:
        with gw.client() as c:
            h = c.create_session(routed_experts=True)
            oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
            _stream_text(oai)
            oai.chat.completions.create(model="policy", messages=MSGS)
            calls = c.calls(h.session_id)
            assert [("routed_experts_missing" in call.flags) for call in calls] == [True, True]
            # a server that returns no routing to a session that asks: the summary says so
            s = summarize([c.rollout(h.session_id)], [], 0.0)
            assert s["routing_gaps"] == {"b0": [2, 2]}
            with pytest.raises(Exception, match="routed_experts must be true or false"):
                c.create_session(routed_experts="yes")
        metrics = httpx.get(gw.url + "/metrics").text
        assert "rollwire_routed_experts_missing_total 2" in metrics


# -- issue 14, item 9: the trajectory endpoint classifies forks with the backend's tokenizer ------


def _forked_session(gw: RunningGateway) -> list[Any]:
    with gw.client() as c:
        h = c.create_session()
        oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
        oai.chat.completions.create(model="policy", messages=MSGS)
        summary = [{"role": "system", "content": "summary: said hello"}, *MSGS]
        oai.chat.completions.create(model="policy", messages=summary)
        return c.trajectory(h.session_id)


def test_trajectory_forks_are_classified_with_the_backends_tokenizer(
    moe: tuple[EmbeddedEngine, RunningGateway],
) -> None:
    pytest.importorskip("transformers", reason="loading the tokenizer needs rollwire[tokens]")
    _, gw = moe  # the engine names its tokenizer folder (/get_model_info tokenizer_path)
    first, second = _forked_session(gw)
    assert first.fork is None and second.fork is not None
    assert second.fork.kind == "other"  # an edited history, told apart by the tokenizer


def test_trajectory_forks_are_unknown_without_a_tokenizer(gateway: RunningGateway) -> None:
    _, second = _forked_session(gateway)  # the null backend names no tokenizer folder
    assert second.fork is not None and second.fork.kind == "unknown"
