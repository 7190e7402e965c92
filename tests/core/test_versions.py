"""Weight versions on the data: per-token spans on calls, through JSON, the stores' codec and rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from rollwire.data.protocol import ModelCall, Rollout, VersionSpan, version_spans_from_wire
from rollwire.data.trajectory import build_rows
from rollwire.store import SessionRecord, SQLiteStore
from rollwire.store.codec import SessionDeltas, decode_calls, encode_call
from rollwire.testing.samples import merged_rollout, versioned_rollout


def _call(**kw: object) -> ModelCall:
    return ModelCall(
        call_id="c",
        session_id="s",
        index=0,
        prompt_ids=np.arange(3, dtype=np.int32),
        completion_ids=np.arange(10, 15, dtype=np.int32),
        logprobs=np.full(5, -0.5, np.float32),
        **kw,  # type: ignore[arg-type]
    )


def test_a_call_without_labels_is_one_span_of_its_policy_version() -> None:
    assert _call(policy_version="7").version_spans() == [VersionSpan(version="7", start=0, end=5)]
    assert _call().version_spans() == []
    spans = [VersionSpan(version="1", start=0, end=0), VersionSpan(version="2", start=0, end=5)]
    assert _call(policy_version="2", weight_versions=spans).version_spans() == spans[1:]


@pytest.mark.parametrize(
    "spans",
    [
        [("1", 0, 2), ("2", 3, 5)],  # a gap
        [("1", 0, 3), ("2", 2, 5)],  # an overlap
        [("1", 0, 4)],  # short of the completion
        [("1", 1, 5)],  # not from 0
        [],
    ],
)
def test_spans_that_do_not_tile_the_completion_are_refused(spans: list[tuple]) -> None:
    call = _call(weight_versions=[VersionSpan(version=v, start=s, end=e) for v, s, e in spans])
    with pytest.raises(ValueError, match="do not tile its 5 completion tokens"):
        call.validate_lengths()


def test_spans_round_trip_through_rollout_json() -> None:
    rollout = versioned_rollout()
    back = Rollout.from_json(rollout.to_json())
    assert [c.weight_versions for c in back.calls] == [c.weight_versions for c in rollout.calls]
    assert back.calls[0].weight_versions is None
    assert back.weight_versions() == ["1", "2", "3"]
    # a record written before the field existed has no key at all and still loads
    old = orjson.loads(merged_rollout().to_json())
    assert all("weight_versions" not in c or c["weight_versions"] is None for c in old["calls"])
    for c in old["calls"]:
        c.pop("weight_versions", None)
    assert all(c.weight_versions is None for c in Rollout.from_json(orjson.dumps(old)).calls)


def test_codec_writes_spans_only_when_there_are_some() -> None:
    rollout = versioned_rollout()
    deltas = SessionDeltas(0)
    encoded = []
    for i, call in enumerate(rollout.calls):
        enc = encode_call(call, deltas, index=i)
        deltas.remember(call.call_id, i, call.prompt_ids, call.completion_ids, None)
        encoded.append(enc)
    # an unlabelled call's meta is what it was before spans existed: old records decode the same
    assert "weight_versions" not in encoded[0].meta
    assert encoded[1].meta["weight_versions"] == [
        {"version": "1", "start": 0, "end": 2},
        {"version": "2", "start": 2, "end": 5},
    ]
    rows = [
        (
            e.index,
            e.call_id,
            e.parent_call_id,
            e.shared_prefix_len,
            e.new_prompt,
            e.completion,
            e.logprobs,
            e.experts,
            e.shared_messages,
            e.new_messages,
            e.meta_bytes(),
        )
        for e in encoded
    ]
    got = decode_calls(rollout.rollout_id, rows, lambda _k: None)
    assert [c.weight_versions for c in got] == [c.weight_versions for c in rollout.calls]
    assert all(isinstance(s, VersionSpan) for s in got[2].weight_versions or [])


async def test_sqlite_store_keeps_the_spans(tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "v.db"))
    try:
        rollout = versioned_rollout()
        await store.create_session(SessionRecord(session_id=rollout.rollout_id))
        for call in rollout.calls:
            await store.append_call(call.model_copy(deep=True))
        got = await store.calls(rollout.rollout_id)
    finally:
        await store.close()
    assert [c.weight_versions for c in got] == [c.weight_versions for c in rollout.calls]
    assert [c.policy_version for c in got] == ["1", "2", "3"]


def test_rows_label_every_response_token_with_its_version() -> None:
    (row,) = build_rows([versioned_rollout()])
    assert row.weight_versions == ["1", "2", "3"]
    # c0: 4 sampled (v1) | 3 context | c1: 2 v1 + 3 v2 | 2 context | c2: 1 v2 + 2 v3
    expected = [0] * 4 + [-1] * 3 + [0, 0, 1, 1, 1] + [-1] * 2 + [1, 2, 2]
    np.testing.assert_array_equal(row.version_ids, expected)
    assert row.version_spans() == [
        ("1", 0, 4),
        ("1", 7, 9),
        ("2", 9, 12),
        ("2", 14, 15),
        ("3", 15, 17),
    ]
    assert row.policy_version == "3"  # the last call's, as before


def test_rows_of_a_forked_rollout_each_list_their_own_versions() -> None:
    rollout = versioned_rollout()
    p2 = rollout.calls[2].prompt_ids.copy()
    p2[9] = 4242  # edit history inside call 0's completion: call 2 starts a new row
    rollout.calls[2] = rollout.calls[2].model_copy(update={"prompt_ids": p2})
    first, second = build_rows([rollout])
    assert first.weight_versions == ["1", "2"]
    assert second.weight_versions == ["2", "3"]
    np.testing.assert_array_equal(second.version_ids, [0, 1, 1])


def test_rows_without_known_versions_carry_none() -> None:
    (row,) = build_rows([merged_rollout()])
    assert row.weight_versions == []
    assert row.version_ids is not None and (row.version_ids == -1).all()
    assert row.version_spans() == []


def test_row_refuses_version_ids_out_of_range() -> None:
    (row,) = build_rows([versioned_rollout()])
    data = row.model_dump()
    data["weight_versions"] = ["1"]
    with pytest.raises(ValueError, match="version_ids range over"):
        type(row).model_validate(data)
    data = row.model_dump()
    data["version_ids"] = data["version_ids"][:-1]
    with pytest.raises(ValueError, match=r"version_ids \(16\) must cover the 17 response tokens"):
        type(row).model_validate(data)


def test_backend_spans_are_read_as_vllm_sends_them() -> None:
    raw = [{"version": "1", "start": 0, "end": 2}, {"version": 2, "start": 2, "end": 5}]
    assert version_spans_from_wire(raw, 5) == [
        VersionSpan(version="1", start=0, end=2),
        VersionSpan(version="2", start=2, end=5),
    ]
    # one version (or none) is the call's policy_version: nothing to keep per token
    assert version_spans_from_wire([{"version": "1", "start": 0, "end": 5}], 5) is None
    assert version_spans_from_wire(None, 5) is None and version_spans_from_wire([], 0) is None
    # empty spans dropped, neighbours of one version merged
    raw = [
        {"version": "1", "start": 0, "end": 0},
        {"version": "2", "start": 0, "end": 2},
        {"version": "2", "start": 2, "end": 3},
        {"version": "3", "start": 3, "end": 5},
    ]
    assert [(s.version, s.start, s.end) for s in version_spans_from_wire(raw, 5) or []] == [
        ("2", 0, 3),
        ("3", 3, 5),
    ]


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ([{"version": "1", "start": 0, "end": 2}, {"version": "2", "start": 2, "end": 4}], "tile"),
        ([{"version": "1", "begin": 0, "end": 5}], "must be"),
        ("v1", "must be"),
    ],
)
def test_backend_spans_that_do_not_fit_are_refused(raw: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        version_spans_from_wire(raw, 5)
