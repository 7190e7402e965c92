"""Golden multi-turn tests: embedded engine (scripted) → real gateway → openai-python agents.

Tokens mode must give one row per rollout with every sampled token trained once with its logprob;
passthrough mode on the same conversation must show the classified forks peers suffer from.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from rollwire.data.protocol import ModelCall, Rollout
from rollwire.data.trajectory import TrajectoryBuilder
from rollwire.engine import EmbeddedEngine, EngineConfig
from rollwire.gateway import RunningGateway, serve_in_thread
from rollwire.gateway.tokens.render import ChatRenderer
from rollwire.trainer.gateway_client import GatewayAPIError

from .conftest import TOOLS

TOOLS_6 = [
    *TOOLS,
    {
        "type": "function",
        "function": {
            "name": "details",
            "parameters": {"type": "object", "properties": {"item": {"type": "integer"}}},
        },
    },
]

# What the policy "samples" at each turn (teacher-forced by the engine), and what comes back after.
SCRIPT: list[str] = [
    '<think>\nI need to search the catalogue.\n</think>\n\n<tool_call>\n{"name": "search", "arguments": {"query": "red shoes", "filters": {"size": [42, 43], "brand": {"in": ["Acme"]}}}}\n</tool_call>',
    '<think>\nTwo results; check the first.\n</think>\n\n<tool_call>\n{"name":"details","arguments":{"item":7}}\n</tool_call>',
    '<think>\nIn stock. Book it.\n</think>\n\nBooking now.\n<tool_call>\n{"name": "book", "arguments": {"item": 7}}\n</tool_call>',
    "<think>\nBooked. Tell the user.\n</think>\n\nI booked the Runner (item 7) in size 42.",
    '<think>\nNow socks.\n</think>\n\n<tool_call>\n{"name": "search", "arguments": {"query": "wool socks"}}\n</tool_call>',
    "<think>\nDone.\n</think>\n\nI also found wool socks (item 12).",
]
TOOL_RESULTS = [
    '[{"id": 7, "name": "Runner"}, {"id": 9}]',
    '{"stock": 3}',
    '{"ok": true}',
    None,
    '[{"id": 12}]',
]
FOLLOW_UP = "Great, can you also find wool socks?"
SYSTEM = "You are a shop assistant. Use tools."
TASK = "Find red shoes in size 42 or 43 and book one."
BROKEN = "Reply with a broken tool call."
BROKEN_REPLY = '<tool_call>\n{"name": "search", "arguments": {"query": "x"\n</tool_call>'


def script(messages: list[dict[str, Any]], tools: Any) -> str | None:
    """Turn k of the conversation gets SCRIPT[k] (k = assistant turns so far)."""
    first_user = next((m for m in messages if m.get("role") == "user"), None)
    if first_user is not None and BROKEN in str(first_user.get("content")):
        return BROKEN_REPLY
    if first_user is None or TASK not in str(first_user.get("content")):
        return None
    k = sum(1 for m in messages if m.get("role") == "assistant")
    return SCRIPT[k] if k < len(SCRIPT) else None


@pytest.fixture(scope="module")
def engine() -> Iterator[EmbeddedEngine]:
    with EmbeddedEngine(EngineConfig(scripted=script, return_routed_experts=True)) as eng:
        yield eng


@pytest.fixture(scope="module")
def gateway(engine: EmbeddedEngine) -> Iterator[RunningGateway]:
    with serve_in_thread(backends=[(engine.url, "vllm")]) as gw:
        yield gw


@pytest.fixture(scope="module")
def sglang_gateway(engine: EmbeddedEngine) -> Iterator[RunningGateway]:
    with serve_in_thread(backends=[(engine.url, "sglang")]) as gw:
        yield gw


def _plain_reply(msg: Any) -> dict[str, Any]:
    """The plain openai-python pattern: append the returned message as it came."""
    return dict(msg.model_dump(exclude_none=True))


def _reserializing_reply(msg: Any) -> dict[str, Any]:
    """A framework that drops reasoning and re-serializes arguments with other JSON spacing."""
    out: dict[str, Any] = {"role": "assistant", "content": msg.content or ""}
    if msg.tool_calls:
        out["tool_calls"] = [
            {
                "id": tc.id,
                "type": "function",
                "function": {
                    "name": tc.function.name,
                    "arguments": json.dumps(
                        json.loads(tc.function.arguments), separators=(",", ":"), sort_keys=True
                    ),
                },
            }
            for tc in msg.tool_calls
        ]
    return out


def _run_agent(base_url: str, reply: Any, *, stream: bool = False) -> list[dict[str, Any]]:
    """Six model calls: tool loop, a final answer, a user follow-up, another tool loop."""
    oai = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": [{"type": "text", "text": TASK}]},
    ]
    for k in range(len(SCRIPT)):
        if stream:
            msg = _collect_stream(oai, messages)
        else:
            r = oai.chat.completions.create(model="policy", messages=messages, tools=TOOLS_6)  # type: ignore[arg-type]
            msg = r.choices[0].message
            assert r.choices[0].finish_reason == ("tool_calls" if msg.tool_calls else "stop")
        messages.append(reply(msg))
        if msg.tool_calls:
            assert TOOL_RESULTS[k] is not None
            messages.append(
                {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": TOOL_RESULTS[k]}
            )
        elif k < len(SCRIPT) - 1:
            messages.append({"role": "user", "content": FOLLOW_UP})
    return messages


class _Msg:
    def __init__(self, content: str | None, tool_calls: list[Any]) -> None:
        self.content = content
        self.tool_calls = tool_calls

    def model_dump(self, exclude_none: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [tc.model_dump() for tc in self.tool_calls]
        return out


def _collect_stream(oai: openai.OpenAI, messages: list[dict[str, Any]]) -> Any:
    from openai.types.chat.chat_completion_message_tool_call import ChatCompletionMessageToolCall

    content, finish, usage = "", None, None
    calls: dict[int, dict[str, Any]] = {}
    stream = oai.chat.completions.create(  # type: ignore[call-overload]
        model="policy",
        messages=messages,
        tools=TOOLS_6,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            if ch.delta.content:
                content += ch.delta.content
            for d in ch.delta.tool_calls or []:
                slot = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                slot["id"] = d.id or slot["id"]
                if d.function is not None:
                    slot["name"] += d.function.name or ""
                    slot["arguments"] += d.function.arguments or ""
            finish = ch.finish_reason or finish
    assert usage is not None and usage.completion_tokens > 0
    tool_calls = [
        ChatCompletionMessageToolCall.model_validate(
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
        )
        for _, c in sorted(calls.items())
    ]
    assert finish == ("tool_calls" if tool_calls else "stop")
    return _Msg(content or None, tool_calls)


def _suffix_text(message: dict[str, Any]) -> str:
    if message["role"] == "tool":
        return f"\n<|im_start|>user\n<tool_response>\n{message['content']}\n</tool_response><|im_end|>\n"
    return f"\n<|im_start|>user\n{message['content']}<|im_end|>\n"


def _check_tokens_rollout(
    renderer: ChatRenderer, calls: list[ModelCall], messages: list[dict[str, Any]], rollout: Rollout
) -> None:
    assert len(calls) == 6
    assert all(c.capture == "tokens" and c.branch == 0 and c.fork_reason is None for c in calls)
    assert all(c.status == "ok" and "ill_formed" not in c.flags for c in calls)
    generated = [
        np.asarray([*renderer.encode(t).tolist(), renderer.eos_id], np.int32) for t in SCRIPT
    ]
    for call, ids in zip(calls, generated, strict=True):
        np.testing.assert_array_equal(call.completion_ids, ids)  # the engine's own sampled ids
    # Expected row: the first prompt, then each generation followed by the healed suffix the
    # template puts after it (written out independently here).
    first = renderer.render(messages[:2], TOOLS_6)
    expected = [first]
    after_assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    for k, ids in enumerate(generated):
        expected.append(ids)
        if k + 1 < len(generated):
            new = messages[after_assistant[k] + 1 : after_assistant[k + 1]]
            text = "".join(_suffix_text(m) for m in new) + "<|im_start|>assistant\n"
            expected.append(renderer.encode(text))
    rows = TrajectoryBuilder(tokenizer=renderer).build(rollout)
    assert len(rows) == 1 and rows[0].fork is None
    row = rows[0]
    np.testing.assert_array_equal(row.input_ids, np.concatenate(expected))
    mask = row.loss_mask.astype(bool)
    assert int(mask.sum()) == sum(len(g) for g in generated)  # every sampled token, once
    np.testing.assert_array_equal(row.response_ids[mask], np.concatenate(generated))
    np.testing.assert_array_equal(row.logprobs[mask], np.concatenate([c.logprobs for c in calls]))
    assert np.all(row.logprobs[mask] < 0) and np.all(row.logprobs[~mask] == 0)
    assert renderer.decode(row.input_ids).count("<think>") == 6  # no reasoning lost
    assert (
        row.routed_experts is not None and row.routed_experts.shape[0] == row.input_ids.shape[0] - 1
    )


@pytest.mark.parametrize(
    "reply", [_plain_reply, _reserializing_reply], ids=["plain", "reserializing"]
)
def test_tokens_mode_one_row_zero_forks(
    gateway: RunningGateway, renderer: ChatRenderer, reply: Any
) -> None:
    with gateway.client() as client:
        h = client.create_session(capture="tokens")
        messages = _run_agent(h.base_url, reply)
        calls = client.calls(h.session_id)
        client.complete(h.session_id, reward=1.0)
        rollout = client.rollout(h.session_id)
    _check_tokens_rollout(renderer, calls, messages, rollout)
    assert calls[0].routed_experts is not None and calls[0].routed_experts.shape[1:] == (4, 2)
    assert calls[0].logprobs_mode == "raw" and calls[0].finish_reason == "tool_calls"
    assert calls[3].finish_reason == "stop"
    assert calls[2].response["choices"][0]["message"]["content"] == "Booking now.\n"


def test_tokens_mode_streaming(gateway: RunningGateway, renderer: ChatRenderer) -> None:
    with gateway.client() as client:
        h = client.create_session(capture="tokens")
        messages = _run_agent(h.base_url, _reserializing_reply, stream=True)
        calls = client.calls(h.session_id)
        rollout = client.rollout(h.session_id)
    assert all(c.stream for c in calls)
    _check_tokens_rollout(renderer, calls, messages, rollout)


def test_tokens_mode_sglang_backend(sglang_gateway: RunningGateway, renderer: ChatRenderer) -> None:
    with sglang_gateway.client() as client:
        h = client.create_session(capture="tokens")
        messages = _run_agent(h.base_url, _reserializing_reply)
        calls = client.calls(h.session_id)
        rollout = client.rollout(h.session_id)
    _check_tokens_rollout(renderer, calls, messages, rollout)
    assert calls[0].logprobs_mode == "processed"
    assert calls[0].routed_experts is not None and calls[0].routed_experts.shape[1:] == (4, 2)


@pytest.mark.parametrize(
    "reply", [_plain_reply, _reserializing_reply], ids=["plain", "reserializing"]
)
def test_passthrough_same_conversation_forks(
    gateway: RunningGateway, renderer: ChatRenderer, reply: Any
) -> None:
    with gateway.client() as client:
        h = client.create_session(capture="passthrough")
        _run_agent(h.base_url, reply)
        client.complete(h.session_id, reward=1.0)
        rollout = client.rollout(h.session_id)
    rows = TrajectoryBuilder(tokenizer=renderer).build(rollout)
    kinds = {r.fork.kind for r in rows if r.fork is not None}
    assert len(rows) > 1 and "think_stripped" in kinds
    if reply is _plain_reply:  # reasoning sent back: the compact tool-call JSON is what breaks
        assert "retokenized" in kinds
    trained = sum(int(r.loss_mask.sum()) for r in rows)
    assert trained == sum(c.completion_ids.shape[0] for c in rollout.calls)


def test_engine_recomputed_logprobs_match(gateway: RunningGateway, engine: EmbeddedEngine) -> None:
    with gateway.client() as client:
        h = client.create_session(capture="tokens")
        _run_agent(h.base_url, _reserializing_reply)
        rollout = client.rollout(h.session_id)
    rows = TrajectoryBuilder().build(rollout)
    assert len(rows) == 1
    for row in rows:
        r = httpx.post(
            engine.url + "/v1/completions",
            json={
                "model": "rollwire-tiny",
                "prompt": row.input_ids.tolist(),
                "max_tokens": 1,
                "prompt_logprobs": 0,
                "temperature": 0,
            },
            timeout=120,
        )
        r.raise_for_status()
        plp = r.json()["choices"][0]["prompt_logprobs"]
        ids = row.input_ids.tolist()
        recomputed = np.asarray(
            [
                plp[row.prompt_len + j][str(ids[row.prompt_len + j])]["logprob"]
                for j in range(len(ids) - row.prompt_len)
            ],
            np.float32,
        )
        mask = row.loss_mask.astype(bool)
        np.testing.assert_allclose(recomputed[mask], row.logprobs[mask], atol=1e-4)


def test_tokens_mode_refuses_openai_backend(renderer: ChatRenderer, engine: EmbeddedEngine) -> None:
    with serve_in_thread(backends=[(engine.url, "openai")]) as gw, gw.client() as client:
        h = client.create_session(capture="tokens")
        oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="token-in backend"):
            oai.chat.completions.create(model="p", messages=[{"role": "user", "content": "hi"}])


def test_tokens_mode_refuses_constraints_it_cannot_apply(gateway: RunningGateway) -> None:
    with gateway.client() as client:
        h = client.create_session(capture="tokens")
        oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="response_format"):
            oai.chat.completions.create(
                model="p",
                messages=[{"role": "user", "content": "hi"}],
                response_format={"type": "json_object"},
            )
        with pytest.raises(openai.BadRequestError, match="logit_bias"):
            oai.chat.completions.create(
                model="p", messages=[{"role": "user", "content": "hi"}], logit_bias={"42": 3}
            )
        assert client.calls(h.session_id) == []


def test_edited_history_starts_a_branch(gateway: RunningGateway) -> None:
    with gateway.client() as client:
        h = client.create_session(capture="tokens")
        oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
        msgs: list[Any] = [{"role": "user", "content": "Say hi."}]
        r = oai.chat.completions.create(model="p", messages=msgs, max_tokens=5, seed=1)
        msgs += [
            {"role": "assistant", "content": "something else entirely"},
            {"role": "user", "content": "Again."},
        ]
        oai.chat.completions.create(model="p", messages=msgs, max_tokens=5, seed=1)
        calls = client.calls(h.session_id)
    assert r.choices[0].message.role == "assistant"
    assert [c.branch for c in calls] == [0, 1]
    assert calls[1].fork_reason is not None and "messages[1]" in calls[1].fork_reason


def test_ill_formed_completion_is_text_and_flagged(
    gateway: RunningGateway, renderer: ChatRenderer
) -> None:
    with gateway.client() as client:
        h = client.create_session(capture="tokens")
        oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
        r = oai.chat.completions.create(
            model="p",
            messages=[{"role": "user", "content": BROKEN}],
            tools=TOOLS_6,  # type: ignore[arg-type]
            logprobs=True,
            extra_body={"return_token_ids": True},
        )
        (call,) = client.calls(h.session_id)
    choice = r.choices[0]
    assert choice.message.content == BROKEN_REPLY and not choice.message.tool_calls
    assert choice.finish_reason == "stop" and "ill_formed" in call.flags and call.trainable
    raw = r.model_dump()
    assert raw["prompt_token_ids"] == call.prompt_ids.tolist()
    assert raw["choices"][0]["token_ids"] == call.completion_ids.tolist()
    assert choice.logprobs is not None and choice.logprobs.content is not None
    lps = [c.logprob for c in choice.logprobs.content]
    np.testing.assert_allclose(lps, call.logprobs, rtol=1e-6)


def test_tools_refused_when_no_parser_matches(
    gateway: RunningGateway, tokenizer_path: Any, tmp_path: Any
) -> None:
    from .conftest import tokenizer_with_template

    folder = tokenizer_with_template(
        tokenizer_path,
        tmp_path / "plain",
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    )
    with gateway.client() as client, pytest.raises(GatewayAPIError, match="no tool-call parser"):
        # Refused when the session is created (tokens.check_session); the request-time refusal
        # for sessions that were not checked is in test_handler.
        client.create_session(capture="tokens", metadata={"tokenizer": str(folder)})
