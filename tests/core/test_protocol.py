"""Data model: compact array serialization, delta-encoded prompts, JSONL round trips."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rollwire.data.arrays import common_prefix_len, decode_array, encode_array
from rollwire.data.dataset import read_jsonl, write_jsonl
from rollwire.data.protocol import (
    Group,
    ModelCall,
    Rollout,
    decode_calls,
    encode_calls,
    group_rollouts,
)
from rollwire.testing.samples import forked_rollout, merged_rollout, moe_rollout, sample_batch


def test_arrays_are_packed_not_lists() -> None:
    call = merged_rollout().calls[2]
    data = json.loads(call.model_dump_json())
    assert set(data["prompt_ids"]) == {"dtype", "shape", "b64"}
    assert data["prompt_ids"]["dtype"] == "<i4"
    assert data["logprobs"]["dtype"] == "<f4"
    back = ModelCall.model_validate_json(call.model_dump_json())
    np.testing.assert_array_equal(back.prompt_ids, call.prompt_ids)
    np.testing.assert_array_equal(back.logprobs, call.logprobs)


def test_routed_experts_int16_round_trip() -> None:
    call = moe_rollout().calls[1]
    assert call.routed_experts is not None
    data = json.loads(call.model_dump_json())
    assert data["routed_experts"]["dtype"] == "<i2"
    back = ModelCall.model_validate_json(call.model_dump_json())
    assert back.routed_experts is not None
    np.testing.assert_array_equal(back.routed_experts, call.routed_experts)
    assert back.routed_experts.shape == call.routed_experts.shape


def test_encode_array_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="not a packed array"):
        decode_array({"dtype": "<i4"})
    arr = np.arange(7, dtype=np.int32)
    np.testing.assert_array_equal(decode_array(encode_array(arr)), arr)


def test_common_prefix_len() -> None:
    a = np.asarray([1, 2, 3, 4], np.int32)
    assert common_prefix_len(a, a) == 4
    assert common_prefix_len(a, a[:2]) == 2
    assert common_prefix_len(a, np.asarray([1, 9], np.int32)) == 1
    assert common_prefix_len(a, np.zeros(0, np.int32)) == 0


def test_prompts_are_stored_as_deltas() -> None:
    rollout = merged_rollout()
    encoded = encode_calls(rollout.calls)
    assert encoded[0]["delta"]["parent"] is None
    assert encoded[1]["delta"]["parent"] == rollout.calls[0].call_id
    assert encoded[1]["delta"]["shared"] == 12  # 8 prompt + 4 completion
    assert encoded[2]["delta"]["shared"] == 20
    assert decode_array(encoded[2]["delta"]["new_prompt_ids"]).tolist() == [900, 901]
    assert "prompt_ids" not in encoded[2]
    decoded = decode_calls(encoded)
    for a, b in zip(decoded, rollout.calls):
        np.testing.assert_array_equal(a.prompt_ids, b.prompt_ids)


def test_forked_prompt_delta_uses_longest_prefix() -> None:
    rollout = forked_rollout()
    encoded = encode_calls(rollout.calls)
    assert encoded[2]["delta"]["shared"] == 9
    decoded = decode_calls(encoded)
    np.testing.assert_array_equal(decoded[2].prompt_ids, rollout.calls[2].prompt_ids)


def test_messages_are_stored_as_deltas() -> None:
    rollout = merged_rollout()
    msgs: list[dict[str, str]] = []
    for i, call in enumerate(rollout.calls):
        msgs = [*msgs, {"role": "user", "content": f"m{i}" * 100}]
        call.request = {"model": "policy", "messages": list(msgs)}
    encoded = encode_calls(rollout.calls)
    assert [len(e["new_messages"]) for e in encoded] == [1, 1, 1]
    decoded = decode_calls(encoded)
    assert decoded[2].request["messages"] == msgs
    assert decoded[2].request["model"] == "policy"


def test_unknown_parent_is_an_error() -> None:
    encoded = encode_calls(merged_rollout().calls)
    with pytest.raises(ValueError, match="unknown parent"):
        decode_calls(encoded[1:])


def test_jsonl_round_trip_is_exact(tmp_path: Path) -> None:
    batch = sample_batch()
    path = tmp_path / "rollouts.jsonl"
    assert write_jsonl(path, batch) == 6
    back = read_jsonl(path)
    original = [r for g in batch for r in g.rollouts]
    assert [r.to_json() for r in back] == [r.to_json() for r in original]
    assert [r.model_dump_json() for r in back] == [r.model_dump_json() for r in original]
    text = path.read_text()
    assert "[100, 101" not in text and "[100,101" not in text  # no JSON lists of token ids


def test_jsonl_bad_line_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(merged_rollout().to_json().decode() + '\n{"nope": 1}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        read_jsonl(path)


def test_group_rollouts_accepts_groups_and_flat() -> None:
    batch = sample_batch()
    flat = [r for g in batch for r in g.rollouts]
    regrouped = group_rollouts(flat)
    assert [g.group_id for g in regrouped] == ["g0", "g1"]
    assert [len(g.rollouts) for g in regrouped] == [3, 3]
    assert group_rollouts(batch) == batch
    with pytest.raises(TypeError, match="expected rollwire Group or Rollout"):
        group_rollouts([{"rollout_id": "x"}])  # type: ignore[list-item]


def test_group_complete_and_rollout_terminal() -> None:
    r = merged_rollout()
    g = Group(group_id="g", rollouts=[r, Rollout(rollout_id="x", status="running")])
    assert r.terminal and not g.complete
