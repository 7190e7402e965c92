"""Reading a non-streamed answer with the session's prompt memo (gateway.dataplane.answer): the
same capture and the same answer to the agent as the plain parse, the remembered ids reused."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollwire.gateway.dataplane.answer import (
    PromptMemo,
    PromptMemos,
    read_answer,
    read_session_answer,
)
from rollwire.gateway.dataplane.capture import Asked, extract, strip_response


def vllm_answer(prompt: Any, completion: list[int], *, sglang: bool = False) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": 'say "prompt_token_ids":[1] ]'},
        "logprobs": {
            "content": [
                {"token": f"token_id:{t}", "logprob": -0.5, "bytes": None, "top_logprobs": []}
                for t in completion
            ]
        },
        "finish_reason": "stop",
    }
    body: dict[str, Any] = {"id": "x", "object": "chat.completion", "choices": [choice]}
    if sglang:
        choice["prompt_token_ids"] = prompt
        choice["response_token_ids"] = completion
    else:
        choice["token_ids"] = completion
        body["usage"] = {"prompt_tokens": 3}
        body["prompt_token_ids"] = prompt
    return body


def plain(payload: bytes) -> tuple[dict[str, Any], Any]:
    data = orjson.loads(payload)
    return data, extract(data)


def same_capture(payload: bytes, memo: PromptMemo | None) -> PromptMemo | None:
    """read_answer + extract against orjson + extract: equal capture, equal stripped answer."""
    want_data, want = plain(payload)
    data, ids, new_memo = read_answer(payload, memo)
    got = extract(data, ids)
    assert got.has_ids == want.has_ids
    assert got.prompt_ids.dtype == np.int32
    assert np.array_equal(got.prompt_ids, want.prompt_ids)
    assert np.array_equal(got.completion_ids, want.completion_ids)
    assert np.array_equal(got.logprobs, want.logprobs)
    strip_response(data, Asked())
    strip_response(want_data, Asked())
    assert data == want_data
    return new_memo


def dumps(obj: Any, spaced: bool) -> bytes:
    return json.dumps(obj).encode() if spaced else orjson.dumps(obj)


@settings(max_examples=150, deadline=None)
@given(
    turns=st.lists(
        st.tuples(
            st.lists(st.integers(0, 2**31 - 1), max_size=40),  # the turn's new prompt ids
            st.lists(st.integers(0, 50_000), min_size=1, max_size=6),  # its completion
        ),
        min_size=1,
        max_size=6,
    ),
    sglang=st.booleans(),
    spaced=st.booleans(),
    restart=st.integers(0, 6),
)
def test_a_growing_conversation_captures_what_the_plain_parse_does(
    turns: list[tuple[list[int], list[int]]], sglang: bool, spaced: bool, restart: int
) -> None:
    memo = None
    prompt: list[int] = []
    for i, (new, completion) in enumerate(turns):
        prompt = prompt + new if i != restart else new  # a turn that starts over
        memo = same_capture(dumps(vllm_answer(prompt, completion, sglang=sglang), spaced), memo)
        if spaced:  # not the compact JSON vLLM and SGLang send: read the plain way
            assert memo is None
        else:
            assert memo is not None and np.array_equal(memo.ids, prompt)
        prompt = prompt + completion


def test_an_unchanged_prompt_reuses_the_remembered_ids() -> None:
    payload = orjson.dumps(vllm_answer(list(range(1000, 1600)), [5, 6]))
    _, first, memo = read_answer(payload, None)
    _, again, memo2 = read_answer(payload, memo)
    assert first is not None and again is memo.ids and memo2 is memo  # nothing parsed twice
    longer = orjson.dumps(vllm_answer([*range(1000, 1600), 7, 8], [5]))
    _, grown, memo3 = read_answer(longer, memo)
    assert grown is not None and grown.tolist() == [*range(1000, 1600), 7, 8]
    assert memo3 is not None and memo3.ids is grown
    _, same, _ = read_answer(longer, memo3)  # the grown memo's digest covers all of its text
    assert same is grown
    # Same length, other text: the digest tells them apart.
    other = orjson.dumps(vllm_answer(list(range(2000, 2600)), [5, 6]))
    _, ids, _ = read_answer(other, memo)
    assert ids is not None and ids.tolist() == list(range(2000, 2600))
    # A prefix that ends inside a number is not a prefix of ids: 12 is not 1 then 2.
    m = read_answer(orjson.dumps(vllm_answer([1], [5])), None)[2]
    _, ids, _ = read_answer(orjson.dumps(vllm_answer([12, 3], [5])), m)
    assert ids is not None and ids.tolist() == [12, 3]


@pytest.mark.parametrize(
    "payload",
    [
        # no ids at all; ids null; empty
        b'{"choices":[{"message":{"content":"hi"},"token_ids":[1]}]}',
        b'{"choices":[{"token_ids":[1]}],"prompt_token_ids":null}',
        b'{"choices":[{"token_ids":[1]}],"prompt_token_ids":[]}',
        # not ints, out of int32, nested: numpy's reading, as before
        b'{"choices":[{"token_ids":[1]}],"prompt_token_ids":[1.5,true,7]}',
        b'{"choices":[{"token_ids":[1]}],"prompt_token_ids":[[1,2],[3,4]]}',
        # the key inside a string (its quote escaped), and as the last one
        b'{"choices":[{"token_ids":[1],"message":{"content":"a\\"prompt_token_ids\\":[9]"}}],'
        b'"prompt_token_ids":[4,5]}',
        b'{"choices":[{"token_ids":[1],"message":{"content":"\\"prompt_token_ids\\":[9]"}}]}',
        # both places: the top level wins, whichever comes last
        b'{"prompt_token_ids":[1,2],"choices":[{"token_ids":[1],"prompt_token_ids":[7]}]}',
        b'{"choices":[{"token_ids":[1],"prompt_token_ids":[7]}],"prompt_token_ids":[1,2]}',
        # in a second choice only, or somewhere the capture does not read
        b'{"choices":[{"token_ids":[1]},{"prompt_token_ids":[3]}]}',
        b'{"choices":[{"token_ids":[1],"message":{"prompt_token_ids":[3]}}]}',
        b'[{"prompt_token_ids":[3]}]',
    ],
)
def test_odd_answers_capture_what_the_plain_parse_does(payload: bytes) -> None:
    memo = read_answer(b'{"prompt_token_ids":[1],"choices":[{"token_ids":[1]}]}', None)[2]
    for m in (None, memo):
        if payload.startswith(b"["):
            assert read_answer(payload, m)[0] == orjson.loads(payload)
        else:
            same_capture(payload, m)


def test_the_capture_of_out_of_range_ids_fails_as_before() -> None:
    payload = b'{"choices":[{"token_ids":[1]}],"prompt_token_ids":[1,2147483648]}'
    data, ids, _ = read_answer(payload, None)
    assert ids is None
    with pytest.raises(OverflowError):
        extract(data)


@pytest.mark.parametrize(
    "payload", [b"", b"not json", b'{"prompt_token_ids":[1,2', b'{"prompt_token_ids":[1,2]']
)
def test_a_body_that_is_not_json_raises_as_the_plain_parse(payload: bytes) -> None:
    with pytest.raises(orjson.JSONDecodeError):
        read_answer(payload, None)


def test_the_memos_keep_the_latest_sessions_within_their_id_bound() -> None:
    memos = PromptMemos(max_ids=1000)
    for i in range(5):
        payload = orjson.dumps(vllm_answer(list(range(i, i + 400)), [1]))
        _, ids = read_session_answer(payload, f"s{i}", memos)
        assert ids is not None and ids.tolist() == list(range(i, i + 400))
    assert len(memos) == 2 and memos.ids == 800  # s3 and s4; the others went first
    assert memos.get("s0") is None and memos.get("s4") is not None
    # An evicted session reads its next answer whole, and correctly.
    grown = orjson.dumps(vllm_answer([*range(400), 5], [1]))
    _, ids = read_session_answer(grown, "s0", memos)
    assert ids is not None and ids.tolist() == [*range(400), 5]
