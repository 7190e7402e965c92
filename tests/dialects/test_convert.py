"""The dialect converters: round trips through the chat shape, the real SDKs' own types, refusals."""

from __future__ import annotations

from typing import Any

import anthropic.types as at
import openai.types.responses as ot
import orjson
import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollwire.gateway.dialects import DialectError
from rollwire.gateway.dialects import anthropic as A
from rollwire.gateway.dialects import responses as R
from rollwire.gateway.dialects.anthropic_stream import message_events
from rollwire.gateway.dialects.responses_stream import response_events

TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
    },
}
text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=20)
ids = st.from_regex(r"call_[a-z0-9]{1,8}", fullmatch=True)
args = st.dictionaries(st.sampled_from("abc"), st.integers(-5, 5) | st.text(max_size=5), max_size=3)


@st.composite
def tool_calls(draw: Any) -> list[dict[str, Any]]:
    n = draw(st.integers(0, 3))
    return [
        {
            "id": draw(ids) + str(i),
            "type": "function",
            "function": {
                "name": draw(st.sampled_from(["add", "mul"])),
                "arguments": orjson.dumps(draw(args)).decode(),
            },
        }
        for i in range(n)
    ]


@st.composite
def conversations(draw: Any) -> list[dict[str, Any]]:
    """Canonical chat histories: user turns, assistant turns (text / reasoning / tool calls),
    each tool call answered by a tool message."""
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(text)})
    for _ in range(draw(st.integers(1, 4))):
        messages.append({"role": "user", "content": draw(text)})
        calls = draw(tool_calls())
        msg: dict[str, Any] = {"role": "assistant", "content": draw(st.none() | text)}
        if draw(st.booleans()):
            msg["reasoning_content"] = draw(text)
        if calls:
            msg["tool_calls"] = calls
        if msg["content"] is None and not calls and "reasoning_content" not in msg:
            msg["content"] = draw(text)
        messages.append(msg)
        messages += [
            {"role": "tool", "tool_call_id": c["id"], "content": draw(text)} for c in calls
        ]
    return messages


# --------------------------------------------------------------------------- Responses requests
@settings(max_examples=60, deadline=None)
@given(conversations(), st.booleans(), st.sampled_from([None, "auto", "required", "none"]))
def test_responses_request_round_trip(
    messages: list[dict[str, Any]], tools: bool, choice: Any
) -> None:
    chat: dict[str, Any] = {"model": "policy", "messages": messages, "max_tokens": 64}
    if tools:
        chat["tools"] = [TOOL]
    if choice is not None:
        chat["tool_choice"] = choice
    body = R.request_from_chat(chat)
    assert R.request_to_chat(orjson.loads(orjson.dumps(body))) == chat
    # What request_from_chat writes is a request the openai SDK's own types accept.
    pydantic.TypeAdapter(list[ot.ResponseInputItemParam]).validate_python(body["input"])


def test_responses_input_string_and_instructions() -> None:
    chat = R.request_to_chat(
        {"model": "m", "input": "hi", "instructions": "be brief", "store": False}
    )
    assert chat["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]


def test_responses_items_fold_into_one_assistant_turn() -> None:
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "add"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "sum"}]},
        {
            "type": "message",
            "role": "assistant",
            "id": "m",
            "status": "completed",
            "content": [{"type": "output_text", "text": "on it", "annotations": []}],
        },
        {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a":1}'},
        {"type": "function_call", "call_id": "c2", "name": "add", "arguments": '{"a":2}'},
        {"type": "function_call_output", "call_id": "c1", "output": "1"},
        {
            "type": "function_call_output",
            "call_id": "c2",
            "output": [{"type": "input_text", "text": "2"}],
        },
    ]
    msgs = R.request_to_chat({"input": items})["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "tool"]
    assert msgs[1]["reasoning_content"] == "sum" and msgs[1]["content"] == "on it"
    assert [c["id"] for c in msgs[1]["tool_calls"]] == ["c1", "c2"]
    assert msgs[3] == {"role": "tool", "tool_call_id": "c2", "content": "2"}


def test_unknown_keys_go_on_to_the_backend() -> None:
    assert R.request_to_chat({"input": "x", "min_p": 0.1})["min_p"] == 0.1
    assert (
        A.request_to_chat(
            {"max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "min_p": 0.1}
        )["min_p"]
        == 0.1
    )


def test_responses_history_goes_after_the_new_instructions() -> None:
    history = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    chat = R.request_to_chat({"input": "c", "instructions": "sys"}, history)
    assert [m["content"] for m in chat["messages"]] == ["sys", "a", "b", "c"]


def test_encrypted_reasoning_round_trips_only_when_issued_here() -> None:
    chat = {
        "choices": [
            {
                "message": {"role": "assistant", "content": "x", "reasoning_content": "why"},
                "finish_reason": "stop",
            }
        ]
    }
    out = R.response_from_chat(
        chat, {"include": [R.ENCRYPTED_REASONING]}, response_id="resp_1", created_at=0
    )
    replay = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [],
        "encrypted_content": out["output"][0]["encrypted_content"],
    }
    assert R.request_to_chat({"input": [replay]})["messages"][0]["reasoning_content"] == "why"
    replay["encrypted_content"] = "gAAAA-openai-sealed"
    with pytest.raises(DialectError, match="did not issue"):
        R.request_to_chat({"input": [replay]})


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x", "conversation": "conv_1"}, "conversation"),
        ({"input": "x", "background": True}, "background"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": "x", "tool_choice": {"type": "allowed_tools"}}, "tool_choice"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0].type",
        ),
        ({}, "input"),
    ],
)
def test_responses_refusals_name_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(DialectError) as info:
        R.request_to_chat(body)
    assert info.value.param == param and info.value.status == 400


# -------------------------------------------------------------------------- Responses responses
@settings(max_examples=60, deadline=None)
@given(conversations(), st.sampled_from(["stop", "length"]), st.booleans())
def test_responses_response_round_trip(
    messages: list[dict[str, Any]], finish: str, sealed: bool
) -> None:
    reply = next(m for m in reversed(messages) if m["role"] == "assistant")
    if "reasoning_content" in reply:
        reply = {**reply, "reasoning": reply["reasoning_content"]}
    if reply.get("tool_calls") and finish == "stop":
        finish = "tool_calls"
    chat = {
        "id": "resp_abc",
        "object": "chat.completion",
        "created": 7,
        "model": "policy",
        "choices": [{"index": 0, "message": reply, "finish_reason": finish, "logprobs": None}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
    }
    request = {
        "model": "policy",
        "input": "x",
        "include": [R.ENCRYPTED_REASONING] if sealed else [],
    }
    out = R.response_from_chat(chat, request, response_id="resp_abc", created_at=7)
    assert R.response_to_chat(out) == chat
    parsed = ot.Response.model_validate(out)  # the SDK's own model, validated strictly
    assert parsed.status == ("incomplete" if finish == "length" else "completed")
    events = [orjson.loads(e.split(b"\ndata: ", 1)[1]) for e in response_events(out)]
    adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ot.ResponseStreamEvent)
    for event in events:
        adapter.validate_python(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] == (
        "response.incomplete" if finish == "length" else "response.completed"
    )


# ---------------------------------------------------------------------------------- Anthropic
@settings(max_examples=60, deadline=None)
@given(conversations(), st.booleans(), st.sampled_from([None, "auto", "required", "none"]))
def test_anthropic_request_round_trip(
    messages: list[dict[str, Any]], tools: bool, choice: Any
) -> None:
    chat: dict[str, Any] = {"model": "policy", "messages": messages, "max_tokens": 64}
    if tools:
        chat["tools"] = [TOOL]
    if choice is not None:
        chat["tool_choice"] = choice
    body = A.request_from_chat(chat)
    assert A.request_to_chat(orjson.loads(orjson.dumps(body))) == chat
    pydantic.TypeAdapter(list[at.MessageParam]).validate_python(body["messages"])


def test_anthropic_blocks() -> None:
    body = {
        "model": "claude",
        "max_tokens": 100,
        "system": [
            {"type": "text", "text": "one", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "two"},
        ],
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                    {"type": "text", "text": "let me add"},
                    {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": [{"type": "text", "text": "1"}],
                    },
                    {"type": "text", "text": "thanks"},
                ],
            },
            {"role": "system", "content": [{"type": "text", "text": "late"}]},
        ],
        "tools": [{"name": "add", "description": "Add.", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "stop_sequences": ["END"],
        "thinking": {"type": "enabled", "budget_tokens": 50},
    }
    chat = A.request_to_chat(body)
    assert chat["messages"][0] == {"role": "system", "content": "one\n\ntwo"}
    assert chat["messages"][2]["reasoning_content"] == "hmm"
    assert chat["messages"][2]["tool_calls"][0]["function"] == {
        "name": "add",
        "arguments": '{"a":1}',
    }
    assert chat["messages"][3] == {"role": "tool", "tool_call_id": "toolu_1", "content": "1"}
    assert chat["messages"][4] == {"role": "user", "content": "thanks"}
    assert chat["messages"][5] == {"role": "system", "content": "late"}
    assert A.request_from_chat(chat)["messages"][-1] == {"role": "system", "content": "late"}
    assert chat["tool_choice"] == "required" and chat["parallel_tool_calls"] is False
    assert chat["stop"] == ["END"] and chat["max_tokens"] == 100
    assert chat["chat_template_kwargs"] == {"enable_thinking": True}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"max_tokens": 5, "messages": []}, "messages"),
        (
            {
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "web_search_20250305", "name": "web_search"}],
            },
            "tools[0].type",
        ),
        (
            {
                "max_tokens": 5,
                "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}],
            },
            "messages[0].content[0].type",
        ),
        ({"max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "mcp_servers": [{}]},
            "mcp_servers",
        ),
        (
            {
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x"}],
                "tool_choice": {"type": "sometimes"},
            },
            "tool_choice",
        ),
    ],
)
def test_anthropic_refusals_name_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(DialectError) as info:
        A.request_to_chat(body)
    assert info.value.param == param and info.value.status == 400


@settings(max_examples=60, deadline=None)
@given(conversations(), st.sampled_from(["stop", "length"]))
def test_anthropic_message_round_trip(messages: list[dict[str, Any]], finish: str) -> None:
    reply = dict(next(m for m in reversed(messages) if m["role"] == "assistant"))
    if "reasoning_content" in reply:
        reply["reasoning"] = reply["reasoning_content"]
    if reply.get("tool_calls") and finish == "stop":
        finish = "tool_calls"
    chat = {
        "id": "msg_1",
        "object": "chat.completion",
        "model": "policy",
        "choices": [{"index": 0, "message": reply, "finish_reason": finish, "logprobs": None}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
    }
    out = A.message_from_chat(chat, {"model": "policy"}, message_id="msg_1")
    assert A.message_to_chat(out) == chat
    parsed = at.Message.model_validate(out)
    assert (
        parsed.stop_reason
        == {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}[finish]
    )
    adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(at.RawMessageStreamEvent)
    events = [orjson.loads(e.split(b"\ndata: ", 1)[1]) for e in message_events(out)]
    for event in events:
        adapter.validate_python(event)
    assert [e["type"] for e in events][:: len(events) - 1] == ["message_start", "message_stop"]


def test_anthropic_stop_sequence_reported_when_the_backend_names_it() -> None:
    chat = {
        "choices": [
            {
                "message": {"role": "assistant", "content": "a"},
                "finish_reason": "stop",
                "stop_reason": "END",
            }
        ]
    }
    out = A.message_from_chat(chat, {"stop_sequences": ["END"]}, message_id="m")
    assert (out["stop_reason"], out["stop_sequence"]) == ("stop_sequence", "END")


@given(
    st.lists(st.tuples(st.sampled_from(["user", "assistant"]), st.text(max_size=12)), min_size=1)
)
def test_plain_text_turns_convert_as_their_single_text_block(turns: list[tuple[str, str]]) -> None:
    """A string ``content`` (the fast path) gives what one text block gives, in either dialect."""
    as_str = [{"role": r, "content": t} for r, t in turns]
    as_blocks = [{"role": r, "content": [{"type": "text", "text": t}]} for r, t in turns]
    assert A.request_to_chat({"max_tokens": 8, "messages": as_str}) == A.request_to_chat(
        {"max_tokens": 8, "messages": as_blocks}
    )
    parts = [
        {
            "role": r,
            "content": [{"type": "input_text" if r == "user" else "output_text", "text": t}],
        }
        for r, t in turns
    ]
    assert R.request_to_chat({"input": as_str}) == R.request_to_chat({"input": parts})
