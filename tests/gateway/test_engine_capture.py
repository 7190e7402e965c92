"""Passthrough capture checked against the embedded engine from the outside.

Captured completion ids are compared with the scripted text tokenized independently, captured
log-probs with what the engine recomputes for the same tokens (``prompt_logprobs``), and tool
calls merged from a stream with the non-streamed ones — sync and async, streamed and not.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from rollwire.data.protocol import ModelCall
from rollwire.engine import EmbeddedEngine, EngineConfig
from rollwire.gateway import RunningGateway, serve_in_thread

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {"type": "object", "properties": {"a": {}, "b": {}}},
        },
    }
]
TOOL_TEXT = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
FINAL_TEXT = "The sum is 5."


def script(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    if tools and not any(m.get("role") == "tool" for m in messages):
        return TOOL_TEXT
    return FINAL_TEXT


@pytest.fixture(scope="module")
def engine_gateway() -> Iterator[tuple[EmbeddedEngine, RunningGateway]]:
    cfg = EngineConfig(scripted=script, default_max_tokens=64)
    with EmbeddedEngine(cfg) as eng, serve_in_thread(backends=[(eng.url, "vllm")]) as gw:
        yield eng, gw


def _merge_stream(chunks: list[Any]) -> tuple[str, list[dict[str, str]]]:
    text = ""
    calls: dict[int, dict[str, str]] = {}
    for ch in chunks:
        for choice in ch.choices:
            text += choice.delta.content or ""
            for tc in choice.delta.tool_calls or ():
                cur = calls.setdefault(tc.index, {"name": "", "arguments": ""})
                if tc.function is not None:
                    cur["name"] += tc.function.name or ""
                    cur["arguments"] += tc.function.arguments or ""
    return text, [calls[i] for i in sorted(calls)]


def _from_message(r: Any) -> tuple[str, list[dict[str, str]]]:
    msg = r.choices[0].message
    return msg.content or "", [
        {"name": t.function.name, "arguments": t.function.arguments} for t in msg.tool_calls or ()
    ]


async def _turn(
    oai: openai.OpenAI | openai.AsyncOpenAI, messages: list[Any], stream: bool
) -> tuple[str, list[dict[str, str]]]:
    kw: dict[str, Any] = {"model": "policy", "messages": messages, "tools": TOOLS}
    if isinstance(oai, openai.AsyncOpenAI):
        if stream:
            return _merge_stream(
                [ch async for ch in await oai.chat.completions.create(**kw, stream=True)]
            )
        return _from_message(await oai.chat.completions.create(**kw))
    if stream:
        return _merge_stream(list(oai.chat.completions.create(**kw, stream=True)))
    return _from_message(oai.chat.completions.create(**kw))


async def _agent(base_url: str, use_async: bool, stream: bool) -> list[list[dict[str, str]]]:
    """Two turns: a tool call, then the final answer. Returns each turn's tool calls."""
    oai: openai.OpenAI | openai.AsyncOpenAI
    if use_async:
        oai = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0)
    else:
        oai = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "add 2 and 3"}]
    seen = []
    try:
        for _ in range(2):
            text, tool_calls = await _turn(oai, messages, stream)
            seen.append(tool_calls)
            if not tool_calls:
                assert text == FINAL_TEXT
                break
            messages += [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "call_1", "type": "function", "function": tool_calls[0]}],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "5"},
            ]
    finally:
        if isinstance(oai, openai.AsyncOpenAI):
            await oai.close()
        else:
            oai.close()
    return seen


def _recomputed_logprobs(eng: EmbeddedEngine, call: ModelCall) -> np.ndarray:
    prompt = call.prompt_ids.tolist()
    ids = prompt + call.completion_ids.tolist()
    r = httpx.post(
        eng.url + "/v1/completions",
        json={"model": "rollwire-tiny", "prompt": ids, "max_tokens": 1, "prompt_logprobs": 0},
        timeout=120,
    )
    r.raise_for_status()
    plp = r.json()["choices"][0]["prompt_logprobs"]
    n = len(prompt)
    return np.asarray(
        [plp[n + j][str(ids[n + j])]["logprob"] for j in range(len(ids) - n)], np.float32
    )


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_capture_matches_the_engine(
    engine_gateway: tuple[EmbeddedEngine, RunningGateway], use_async: bool, stream: bool
) -> None:
    eng, gw = engine_gateway
    with gw.client() as c:
        h = c.create_session(sampling={"temperature": 1.0})
        seen = asyncio.run(_agent(h.base_url, use_async, stream))
        calls = c.calls(h.session_id)
        assert len(calls) == 2 == len(seen)
        expected_texts = [TOOL_TEXT, FINAL_TEXT]
        for call, text in zip(calls, expected_texts):
            assert call.status == "ok" and call.trainable and call.stream is stream
            # Independent of the gateway: the script's text as the engine's tokenizer encodes it.
            expected = [*eng.tokenizer.encode(text), eng.tokenizer.eos_id]
            assert call.completion_ids.tolist() == expected
            assert call.prompt_ids.shape[0] > 0
            recomputed = _recomputed_logprobs(eng, call)
            np.testing.assert_allclose(call.logprobs, recomputed, atol=1e-4)
        assert calls[1].parent_call_id == calls[0].call_id
        # The tool call the agent saw: streamed deltas merged by index equal the plain answer.
        assert [t["name"] for t in seen[0]] == ["add"]
        assert json.loads(seen[0][0]["arguments"]) == {"a": 2, "b": 3}
        if stream:
            plain = c.create_session(sampling={"temperature": 1.0})
            reference = asyncio.run(_agent(plain.base_url, use_async, stream=False))
            assert [(t["name"], json.loads(t["arguments"])) for turn in seen for t in turn] == [
                (t["name"], json.loads(t["arguments"])) for turn in reference for t in turn
            ]
            c.complete(plain.session_id, reward=0.0)
        c.complete(h.session_id, reward=1.0)


@pytest.fixture(scope="module", params=["vllm", "sglang"], ids=["vllm-ids", "sglang-ids"])
def sglang_kind_gateway(
    request: pytest.FixtureRequest,
) -> Iterator[tuple[EmbeddedEngine, RunningGateway]]:
    """The engine behind a ``kind=sglang`` backend, serving ids in either style (the gateway
    asks for ``return_output_ids_in_sglext`` on streams, ``return_token_ids`` otherwise)."""
    cfg = EngineConfig(scripted=script, default_max_tokens=64, openai_ids_style=request.param)
    with EmbeddedEngine(cfg) as eng, serve_in_thread(backends=[(eng.url, "sglang")]) as gw:
        yield eng, gw


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_sglang_kind_chat_captures_the_engine_ids(
    sglang_kind_gateway: tuple[EmbeddedEngine, RunningGateway], stream: bool
) -> None:
    eng, gw = sglang_kind_gateway
    messages = [{"role": "user", "content": "what is 2 + 3?"}]
    with gw.client() as c:
        h = c.create_session(sampling={"temperature": 1.0})
        oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
        if stream:
            chunks = list(
                oai.chat.completions.create(model="policy", messages=messages, stream=True)  # type: ignore[arg-type]
            )
            assert all("sglext" not in (ch.model_extra or {}) for ch in chunks)
            text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        else:
            r = oai.chat.completions.create(model="policy", messages=messages)  # type: ignore[arg-type]
            extra = r.choices[0].model_extra or {}
            assert "response_token_ids" not in extra and "token_ids" not in extra
            text = r.choices[0].message.content or ""
        oai.close()
        assert text == FINAL_TEXT
        (call,) = c.calls(h.session_id)
        assert call.status == "ok" and call.trainable and call.stream is stream
        assert call.flags == [] and call.logprobs_mode == "processed"
        # What the engine generated, independently of the gateway: the script's text and the
        # engine's own rendering of the prompt.
        tok = eng.tokenizer
        assert call.completion_ids.tolist() == [*tok.encode(FINAL_TEXT), tok.eos_id]
        assert call.prompt_ids.tolist() == tok.encode(tok.render_chat(messages, None))
        assert call.logprobs.shape == call.completion_ids.shape
        np.testing.assert_allclose(call.logprobs, _recomputed_logprobs(eng, call), atol=1e-4)
        c.complete(h.session_id, reward=1.0)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_sglang_kind_sampled_ids_match_the_text(
    sglang_kind_gateway: tuple[EmbeddedEngine, RunningGateway], stream: bool
) -> None:
    """Unscripted (sampled) text: the captured ids decode to what the agent was sent."""
    eng, gw = sglang_kind_gateway
    with gw.client() as c:
        h = c.create_session(sampling={"max_tokens": 8})
        body = {"model": "policy", "prompt": "once upon a time", "stream": stream}
        r = httpx.post(h.base_url + "/completions", json=body, timeout=60)
        assert r.status_code == 200
        if stream:
            events = [e[6:] for e in r.text.split("\n\n") if e.startswith("data: ")]
            text = "".join(
                ch["choices"][0]["text"] for ch in map(json.loads, events[:-1]) if ch.get("choices")
            )
        else:
            text = r.json()["choices"][0]["text"]
        (call,) = c.calls(h.session_id)
        assert call.status == "ok" and call.trainable
        n = call.completion_ids.shape[0]
        assert 0 < n <= 8 and call.logprobs.shape == (n,)
        decoded = eng.tokenizer.decode(call.completion_ids.tolist(), skip_special_tokens=True)
        assert decoded == text
        assert call.prompt_ids.tolist() == eng.tokenizer.encode("once upon a time")
