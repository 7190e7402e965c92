"""Malformed dialect requests are refused with a DialectError (a 400), never another exception."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollwire.gateway.dialects import DialectError
from rollwire.gateway.dialects import anthropic as A
from rollwire.gateway.dialects import responses as R

scalars = st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=5)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
TYPES = st.sampled_from(
    [
        "message",
        "function_call",
        "function_call_output",
        "reasoning",
        "text",
        "image",
        "tool_use",
        "tool_result",
        "thinking",
        "input_text",
        "output_text",
        "input_image",
        "function",
        "auto",
    ]
)


@st.composite
def shaped(draw: Any, keys: list[str]) -> dict[str, Any]:
    """Objects with the dialect's own keys (and types), holding anything."""
    out = draw(st.dictionaries(st.sampled_from(keys), json_values, max_size=5))
    if draw(st.booleans()):
        out["type"] = draw(TYPES)
    return out


ITEM_KEYS = [
    "role",
    "content",
    "call_id",
    "name",
    "arguments",
    "output",
    "summary",
    "text",
    "id",
    "encrypted_content",
    "input",
    "tool_use_id",
    "thinking",
    "source",
    "image_url",
]
objects = shaped(ITEM_KEYS)
lists_of_objects = st.lists(objects | json_values, max_size=4)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "input",
                "instructions",
                "tools",
                "tool_choice",
                "text",
                "reasoning",
                "max_output_tokens",
                "include",
                "store",
                "conversation",
            ]
        ),
        lists_of_objects | objects | json_values,
        max_size=5,
    )
)
def test_responses_requests_raise_only_dialect_errors(body: dict[str, Any]) -> None:
    try:
        R.request_to_chat(body)
    except DialectError:
        pass


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            ["system", "tools", "tool_choice", "stop_sequences", "thinking", "max_tokens"]
        ),
        lists_of_objects | objects | json_values,
        max_size=4,
    ),
    st.lists(
        st.fixed_dictionaries(
            {
                "role": st.sampled_from(["user", "assistant", "system"]) | json_values,
                "content": st.lists(objects, max_size=3) | json_values,
            }
        ),
        max_size=3,
    ),
)
def test_messages_requests_raise_only_dialect_errors(body: dict[str, Any], messages: Any) -> None:
    body = {**body, "messages": messages}
    for convert in (A.request_to_chat, A.count_request):
        try:
            convert(body)
        except DialectError:
            pass


@pytest.mark.parametrize(
    ("convert", "body"),
    [
        (R.request_to_chat, {"input": [{"type": "reasoning", "summary": 5}]}),
        (R.request_to_chat, {"input": [{"type": "reasoning", "content": "abc"}]}),
        (
            A.request_to_chat,
            {
                "max_tokens": 5,
                "messages": [{"role": "user", "content": [{"type": "image", "source": 5}]}],
            },
        ),
    ],
)
def test_found_by_fuzzing(convert: Any, body: dict[str, Any]) -> None:
    try:
        convert(body)
    except DialectError:
        pass


def test_response_echo_tolerates_odd_request_fields() -> None:
    chat = {
        "choices": [{"message": {"role": "assistant", "content": "a"}, "finish_reason": "stop"}]
    }
    out = R.response_from_chat(
        chat, {"include": 5, "metadata": 3}, response_id="resp_1", created_at=0
    )
    assert out["metadata"] == {} and "encrypted_content" not in str(out["output"])
