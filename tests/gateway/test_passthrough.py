"""Passthrough capture through plain openai-python (sync/async, streaming or not)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import numpy as np
import openai

from rollwire.agent.serving import ServerThread
from rollwire.gateway import RunningGateway
from rollwire.testing.null_backend import END_ID, NullBackend, render_ids
from rollwire.trainer.gateway_client import GatewayClient

MSGS = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is 6*7?"}]
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


def _expected(messages: list[dict], text: str) -> tuple[np.ndarray, np.ndarray]:
    return np.array(render_ids(messages)), np.array([*text.encode(), END_ID])


def _converse(client: GatewayClient, turns: int, follow_up: str) -> tuple[Any, list[dict]]:
    """A new session's conversation of ``turns`` calls, each answered and followed up."""
    h = client.create_session()
    oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
    history = list(MSGS)
    for i in range(turns):
        r = oai.chat.completions.create(model="policy", messages=history)
        history += [
            {"role": "assistant", "content": r.choices[0].message.content},
            {"role": "user", "content": follow_up.format(i)},
        ]
    return h, history


def test_sync_non_streaming_capture(
    client: GatewayClient, backend: tuple[NullBackend, ServerThread]
) -> None:
    nb, _ = backend
    h = client.create_session(sampling={"temperature": 0.6, "top_p": 0.9})
    oai = openai.OpenAI(base_url=h.base_url, api_key="unused", max_retries=0)
    r = oai.chat.completions.create(model="policy", messages=MSGS, tools=[], temperature=1.3)
    text = r.choices[0].message.content
    assert text == "reply 2: the answer is 42."
    raw = r.model_dump()
    assert "prompt_token_ids" not in raw and "token_ids" not in raw["choices"][0]
    assert raw["choices"][0]["logprobs"] is None and "routed_experts" not in raw["choices"][0]
    sent, headers = nb.requests[-1]
    assert sent["return_token_ids"] is True and sent["logprobs"] is True
    assert "tools" not in sent  # the empty list was dropped
    assert sent["temperature"] == 0.6 and sent["top_p"] == 0.9  # the session's values win
    assert headers["x-session-id"] == h.session_id
    (call,) = client.calls(h.session_id)
    prompt, completion = _expected(MSGS, text)
    np.testing.assert_array_equal(call.prompt_ids, prompt)
    np.testing.assert_array_equal(call.completion_ids, completion)
    expected_lp = [-((t * 7919) % 1000) / 1000.0 - 0.001 for t in completion]
    np.testing.assert_allclose(call.logprobs, expected_lp, rtol=1e-6)
    assert call.routed_experts is not None
    assert call.routed_experts.shape == (len(prompt) + len(completion) - 1, 2, 2)
    assert call.sampling == {"temperature": 0.6, "top_p": 0.9}
    assert call.trainable and call.status == "ok" and call.finish_reason == "stop"
    assert call.request["temperature"] == 1.3  # the request as the agent sent it
    assert call.logprobs_mode == "raw" and call.backend is not None


def test_agent_asking_for_vendor_fields_gets_them(client: GatewayClient) -> None:
    h = client.create_session()
    oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
    r = oai.chat.completions.create(
        model="policy", messages=MSGS, logprobs=True, extra_body={"return_token_ids": True}
    )
    raw = r.model_dump()
    assert raw["prompt_token_ids"] == render_ids(MSGS)
    assert raw["choices"][0]["token_ids"][-1] == END_ID
    assert raw["choices"][0]["logprobs"]["content"]


def test_multi_turn_prompt_delta_and_trajectory(client: GatewayClient) -> None:
    h, _ = _converse(client, 3, "and {}?")
    calls = client.calls(h.session_id)
    assert [c.index for c in calls] == [0, 1, 2]
    assert calls[1].parent_call_id == calls[0].call_id
    assert calls[1].shared_prefix_len == calls[0].full_tokens().shape[0]
    rows = client.trajectory(h.session_id)
    assert len(rows) == 1 and int(rows[0].loss_mask.sum()) == sum(
        c.completion_ids.shape[0] for c in calls
    )
    rollout = client.rollout(h.session_id)
    assert [c.call_id for c in rollout.calls] == [c.call_id for c in calls]
    assert rollout.calls[2].request["messages"] == calls[2].request["messages"]


def test_sync_streaming_with_tool_calls(
    client: GatewayClient, backend: tuple[NullBackend, ServerThread]
) -> None:
    h = client.create_session()
    oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
    stream = oai.chat.completions.create(
        model="policy",
        messages=MSGS,
        tools=TOOLS,
        stream=True,
        stream_options={"include_usage": True},
    )
    parts: dict[int, dict] = {}
    usage = None
    for chunk in stream:
        d = chunk.model_dump()
        assert "prompt_token_ids" not in d
        for ch in d["choices"]:
            assert "token_ids" not in ch and ch.get("logprobs") is None
            for tc in ch["delta"].get("tool_calls") or ():
                p = parts.setdefault(tc["index"], {"name": "", "arguments": ""})
                p["name"] += (tc.get("function") or {}).get("name") or ""
                p["arguments"] += (tc.get("function") or {}).get("arguments") or ""
        usage = d.get("usage") or usage
    assert usage is not None
    # Committed before [DONE]: visible as soon as the stream ended.
    (call,) = client.calls(h.session_id)
    tcs = call.response["choices"][0]["message"]["tool_calls"]
    assert [t["function"]["name"] for t in tcs] == ["add", "mul"]
    assert json.loads(tcs[1]["function"]["arguments"]) == {"x": [3, 4], "y": "z"}
    assert [t["id"] for t in tcs] == ["call_a", "call_b"]
    assert call.finish_reason == "tool_calls" and call.stream and call.trainable
    np.testing.assert_array_equal(call.prompt_ids, render_ids(MSGS))
    assert call.completion_ids.shape == call.logprobs.shape
    assert call.completion_ids[-1] == END_ID


async def test_async_streaming_and_non_streaming(client: GatewayClient) -> None:
    h = client.create_session()
    oai = openai.AsyncOpenAI(base_url=h.base_url, api_key="x", max_retries=0)
    r = await oai.chat.completions.create(model="policy", messages=MSGS)
    stream = await oai.chat.completions.create(model="policy", messages=MSGS, stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == r.choices[0].message.content
    await oai.close()
    a, b = client.calls(h.session_id)
    np.testing.assert_array_equal(a.completion_ids, b.completion_ids)
    np.testing.assert_allclose(a.logprobs, b.logprobs)
    np.testing.assert_array_equal(a.prompt_ids, b.prompt_ids)
    assert b.response["choices"][0]["message"]["content"] == text


def test_completions_endpoint(client: GatewayClient) -> None:
    h = client.create_session()
    oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
    r = oai.completions.create(model="policy", prompt="hello")
    assert r.choices[0].text and r.choices[0].logprobs is None
    s = oai.completions.create(model="policy", prompt="hello", stream=True)
    assert "".join(c.choices[0].text for c in s) == r.choices[0].text
    a, b = client.calls(h.session_id)
    np.testing.assert_array_equal(a.prompt_ids, list(b"hello"))
    np.testing.assert_array_equal(a.completion_ids, b.completion_ids)
    assert a.completion_ids.shape == a.logprobs.shape and b.trainable


def test_bearer_token_on_v1_and_models(gateway: RunningGateway, client: GatewayClient) -> None:
    h = client.create_session()
    oai = openai.OpenAI(base_url=gateway.url + "/v1", api_key=h.token, max_retries=0)
    r = oai.chat.completions.create(model="policy", messages=MSGS)
    assert r.choices[0].message.content
    assert [m.id for m in oai.models.list()] == ["null"]
    assert len(client.calls(h.session_id)) == 1
    models = httpx.get(h.base_url + "/models", timeout=30)
    assert models.status_code == 200


def test_retry_marks_earlier_attempt(client: GatewayClient) -> None:
    h = client.create_session()
    body = {"model": "policy", "messages": MSGS}
    url = h.base_url + "/chat/completions"
    with httpx.Client(timeout=30) as http:
        assert http.post(url, json=body).status_code == 200
        r = http.post(url, json=body, headers={"x-stainless-retry-count": "1"})
        assert r.status_code == 200
    first, second = client.calls(h.session_id)
    assert second.retry_of == first.call_id and second.retry_count == 1
    assert not first.trainable and "superseded_by_retry" in first.flags
    assert second.trainable


def test_sampling_policy_and_off_policy_flags(
    client: GatewayClient, backend: tuple[NullBackend, ServerThread]
) -> None:
    nb, _ = backend
    h = client.create_session(
        sampling={"temperature": 1.0, "max_tokens": 100, "top_p": 1.0},
        sampling_policy={"max_tokens": "min", "top_p": "agent"},
    )
    oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
    oai.chat.completions.create(
        model="p", messages=MSGS, temperature=0.1, max_completion_tokens=20, top_p=0.5
    )
    sent = nb.requests[-1][0]
    assert (sent["temperature"], sent["max_tokens"], sent["top_p"]) == (1.0, 20, 0.5)
    oai.chat.completions.create(model="p", messages=MSGS, logit_bias={"5": 10})
    oai.chat.completions.create(
        model="p",
        messages=MSGS,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {}}},
    )
    plain, biased, guided = client.calls(h.session_id)
    assert plain.sampling == {"temperature": 1.0, "max_tokens": 20, "top_p": 0.5}
    assert plain.trainable and not plain.off_policy
    assert biased.flags == ["logit_bias"] and biased.off_policy and not biased.trainable
    assert guided.flags == ["guided_decoding"] and not guided.trainable
    allowed = client.create_session(allow_off_policy=True)
    oai = openai.OpenAI(base_url=allowed.base_url, api_key="x", max_retries=0)
    oai.chat.completions.create(model="p", messages=MSGS, logit_bias={"5": 10})
    (call,) = client.calls(allowed.session_id)
    assert call.off_policy and call.trainable and call.flags == ["logit_bias"]
    # n > 1: only the first choice is captured and the agent's pick is unknown, so such a call
    # never trains, even where off-policy calls may
    oai.chat.completions.create(model="p", messages=MSGS, n=2)
    _, many = client.calls(allowed.session_id)
    assert many.flags == ["n>1"] and many.off_policy and not many.trainable


def test_policy_version_is_stamped(client: GatewayClient) -> None:
    h = client.create_session()
    oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
    assert client.set_policy_version("step-7") == "step-7"
    oai.chat.completions.create(model="p", messages=MSGS)
    assert client.calls(h.session_id)[0].policy_version == "step-7"


def test_metrics_and_health(gateway: RunningGateway) -> None:
    text = httpx.get(gateway.url + "/metrics", timeout=30).text
    assert "rollwire_calls_total" in text and "rollwire_store_commit_seconds_count" in text
    assert "rollwire_call_latency_seconds_bucket" in text
    assert httpx.get(gateway.url + "/health", timeout=30).json()["status"] == "ok"


def test_a_growing_conversation_is_captured_exactly_and_its_memo_goes_with_the_session(
    client: GatewayClient,
) -> None:
    """Turn after turn the prompt extends the last one: the gateway parses only the new ids
    (dataplane.answer's memo), captures the same ids as a plain parse would, and forgets the
    memo when the session completes."""
    from rollwire.gateway.dataplane.answer import MEMOS

    h, messages = _converse(client, 4, "and then {}?")
    memo = MEMOS.get(h.session_id)
    calls = client.calls(h.session_id)
    assert memo is not None and np.array_equal(memo.ids, calls[-1].prompt_ids)
    for i, call in enumerate(calls):
        prompt, _ = _expected(messages[: 2 + 2 * i], "")
        np.testing.assert_array_equal(call.prompt_ids, prompt)
        assert call.trainable
    client.complete(h.session_id, reward=1.0)
    assert MEMOS.get(h.session_id) is None
