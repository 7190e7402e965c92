"""Gateway capture in front of real vLLM: what is stored is what vLLM sampled, number for number.

For each capture mode and stream setting a plain OpenAI client runs the 3-turn arithmetic task
(scripted replies) and a free greedy reply through the gateway; then every captured call is
checked against vLLM itself: the same prompt ids sent straight to ``/inference/v1/generate`` give
the same completion ids and log-probs, and re-scoring prompt + completion with
``prompt_logprobs`` gives the captured log-probs back.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from rollwire import ModelCall
from rollwire.gateway import RunningGateway, serve_in_thread
from rollwire.testing.agent import arithmetic_task

from ._server import VLLMServer
from .conftest import NAME, TOOLS
from .vllm_scripts import ARITHMETIC_PROMPT

TOL = 1e-5


@pytest.fixture(scope="module")
def gateway(vllm: VLLMServer) -> Iterator[RunningGateway]:
    with serve_in_thread(backends=[(vllm.url, "vllm")]) as gw:
        yield gw


def _assistant(oai: openai.OpenAI, messages: list[Any], stream: bool, **kw: Any) -> dict[str, Any]:
    if not stream:
        r = oai.chat.completions.create(model="policy", messages=messages, **kw)
        return r.choices[0].message.model_dump(exclude_none=True)
    text, calls = "", {}
    for chunk in oai.chat.completions.create(model="policy", messages=messages, stream=True, **kw):
        for ch in chunk.choices:
            text += ch.delta.content or ""
            for tc in ch.delta.tool_calls or []:
                cur = calls.setdefault(
                    tc.index,
                    {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                )
                cur["id"] = tc.id or cur["id"]
                if tc.function is not None:
                    cur["function"]["name"] += tc.function.name or ""
                    cur["function"]["arguments"] += tc.function.arguments or ""
    msg: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        msg["tool_calls"] = [calls[i] for i in sorted(calls)]
    return msg


def _run_arithmetic(base_url: str, stream: bool) -> str:
    task = arithmetic_task()
    tools = {fn.__name__: fn for fn in task.tools}
    oai = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": ARITHMETIC_PROMPT}]
    for _ in range(5):
        msg = _assistant(oai, messages, stream, tools=TOOLS)
        messages.append(msg)
        if not msg.get("tool_calls"):
            return str(msg.get("content"))
        for call in msg["tool_calls"]:
            out = tools[call["function"]["name"]](**json.loads(call["function"]["arguments"]))
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": out})
    raise AssertionError("no answer in 5 turns")


def _direct(vllm: VLLMServer, call: ModelCall) -> tuple[list[int], list[float]]:
    body = {
        "model": NAME,
        "token_ids": call.prompt_ids.tolist(),
        "sampling_params": {
            "temperature": 0,
            "max_tokens": max(len(call.completion_ids), 1),
            "logprobs": 0,
            "skip_special_tokens": False,
        },
    }
    r = httpx.post(vllm.url + "/inference/v1/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    return ch["token_ids"], [e["logprob"] for e in ch["logprobs"]["content"]]


def _rescore(vllm: VLLMServer, call: ModelCall) -> np.ndarray:
    ids = call.full_tokens().tolist()
    body = {"model": NAME, "prompt": ids, "max_tokens": 1, "prompt_logprobs": 0, "temperature": 0}
    r = httpx.post(vllm.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    entries = r.json()["choices"][0]["prompt_logprobs"]
    n = len(call.prompt_ids)
    return np.array([entries[i][str(ids[i])]["logprob"] for i in range(n, len(ids))], np.float32)


@pytest.mark.parametrize("capture", ["passthrough", "tokens"])
@pytest.mark.parametrize("stream", [False, True], ids=["nonstream", "stream"])
def test_captured_calls_are_what_vllm_samples(
    gateway: RunningGateway, vllm: VLLMServer, capture: str, stream: bool
) -> None:
    client = gateway.client()
    sampling = {"temperature": 1.0, "max_tokens": 96}
    s = client.create_session(capture=capture, sampling=sampling)
    assert _run_arithmetic(s.base_url, stream) == "The answer is 20."
    # and a reply the model samples itself (greedy), nothing scripted, in a session of its own
    free = client.create_session(capture=capture, sampling={"temperature": 0.0, "max_tokens": 16})
    oai = openai.OpenAI(base_url=free.base_url, api_key="unused", max_retries=0)
    _assistant(oai, [{"role": "user", "content": "Tell me about the weather."}], stream)
    calls = client.calls(s.session_id) + client.calls(free.session_id)
    assert len(calls) == 4
    assert all(c.status == "ok" and c.trainable and not c.off_policy for c in calls), [
        (c.status, c.flags, c.error) for c in calls
    ]
    assert [c.capture for c in calls] == [capture] * 4
    assert [c.stream for c in calls] == [stream] * 4
    for c in calls:
        ids, lps = _direct(vllm, c)
        assert ids == c.completion_ids.tolist(), c.index
        np.testing.assert_allclose(c.logprobs, lps, atol=TOL, rtol=0)
        np.testing.assert_allclose(_rescore(vllm, c), c.logprobs, atol=TOL, rtol=0)
    assert all(c.completion_ids[-1] == 2 for c in calls[:3])  # <|im_end|>: vLLM stopped there
    client.complete(s.session_id, reward=1.0)
    rows = client.trajectory(s.session_id)
    if capture == "tokens":  # token-faithful: the 3-turn rollout is one training row
        assert len(rows) == 1, [r.fork for r in rows]
    masked = np.concatenate([r.response_ids[r.loss_mask == 1] for r in rows])
    np.testing.assert_array_equal(masked, np.concatenate([c.completion_ids for c in calls[:3]]))


def test_vllms_growing_prompt_is_read_through_the_sessions_memo(
    gateway: RunningGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM sends each turn's whole prompt back in ``prompt_token_ids``; the gateway parses only
    the ids past the session's previous prompt (``dataplane/answer.py``). This checks that fast
    path is what real vLLM's answers take, not the whole-parse fallback: each read is also tried
    with a memo whose ids are a marker, and the marker shows up wherever the memo's ids are
    reused."""
    from rollwire.gateway.dataplane import answer

    real = answer._prompt_ids
    reads: list[tuple[int, bool]] = []  # (remembered ids, whether the marker came back)

    def probe(span: bytes, memo: answer.PromptMemo | None) -> Any:
        if memo is not None:
            marker = answer.PromptMemo(memo.size, memo.digest, np.full_like(memo.ids, -7))
            tried, _ = real(span, marker)
            n = memo.ids.shape[0]
            reads.append((n, bool((tried[:n] == -7).all())))
        else:
            reads.append((0, False))
        return real(span, memo)

    monkeypatch.setattr(answer, "_prompt_ids", probe)
    client = gateway.client()
    s = client.create_session(
        capture="passthrough", sampling={"temperature": 1.0, "max_tokens": 96}
    )
    assert _run_arithmetic(s.base_url, stream=False) == "The answer is 20."
    calls = client.calls(s.session_id)
    assert len(calls) == 3 and all(c.status == "ok" and c.trainable for c in calls)
    # the first call has no memo; the next two reuse the previous prompt's ids whole
    assert reads == [(0, False), (len(calls[0].prompt_ids), True), (len(calls[1].prompt_ids), True)]
    memo = answer.MEMOS.get(s.session_id)
    assert memo is not None and memo.ids.tolist() == calls[2].prompt_ids.tolist()
    for a, b in itertools.pairwise(calls):  # each prompt extends the one before
        assert b.prompt_ids[: len(a.prompt_ids)].tolist() == a.prompt_ids.tolist()
    client.complete(s.session_id, reward=1.0)
    assert answer.MEMOS.get(s.session_id) is None  # the session ended: its memo went with it
