"""TrajectoryBuilder: DESIGN §6 invariants (Hypothesis) and each fork class by hand."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollwire.data.protocol import ModelCall, Rollout
from rollwire.data.trajectory import TrajectoryBuilder, build_rows, classify_fork
from rollwire.testing.chat_samples import CharTokenizer

# --------------------------------------------------------------------------- property tests


@st.composite
def sessions(draw: st.DrawFn, *, kinds: tuple[str, ...] = ("continue", "fork", "fresh")) -> Rollout:
    """A session whose calls continue, fork from, or ignore the earlier ones.

    Calls may be non-trainable, off-policy, failed or superseded by a retry, and carry routed
    experts covering their prompt + completion, as the gateway records them.
    """
    n_calls = draw(st.integers(1, 8))
    tok = st.integers(0, 50)
    calls: list[ModelCall] = []
    histories: list[np.ndarray] = []
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    for i in range(n_calls):
        how = draw(st.sampled_from(kinds)) if histories else "fresh"
        extra = np.asarray(draw(st.lists(tok, min_size=0, max_size=6)), np.int32)
        if how == "continue":
            pick = draw(st.integers(0, len(histories) - 1)) if len(kinds) > 1 else -1
            prompt = np.concatenate([histories[pick], extra])
        elif how == "fork":
            base = histories[-1].copy()
            pos = draw(st.integers(0, base.shape[0] - 1))
            base[pos] = 99  # never produced by `tok`
            prompt = np.concatenate([base[: draw(st.integers(pos + 1, base.shape[0]))], extra])
        else:
            prompt = np.asarray(draw(st.lists(tok, min_size=1, max_size=8)), np.int32)
        if prompt.shape[0] == 0:
            prompt = np.asarray([1], np.int32)
        completion = np.asarray(draw(st.lists(tok, min_size=0, max_size=6)), np.int32)
        logprobs = -np.arange(1, completion.shape[0] + 1, dtype=np.float32) / (i + 2)
        odd = draw(
            st.sampled_from(["plain"] * 6 + ["untrainable", "off_policy", "failed", "superseded"])
        )
        if len(kinds) == 1:
            odd = "plain"
        full = prompt.shape[0] + completion.shape[0]
        call = ModelCall(
            call_id=f"c{i}",
            session_id="s",
            index=i,
            prompt_ids=prompt,
            completion_ids=completion,
            logprobs=logprobs,
            trainable=odd not in ("untrainable", "off_policy", "superseded"),
            off_policy=odd == "off_policy",
            status="failed" if odd == "failed" else "ok",
            flags=["superseded_by_retry"] if odd == "superseded" else [],
            routed_experts=rng.integers(0, 8, (full - 1, 2, 2)).astype(np.int16),
        )
        calls.append(call)
        if odd not in ("failed", "superseded"):
            histories.append(np.concatenate([prompt, completion]))
        elif not histories:
            histories.append(prompt)
    return Rollout(rollout_id="s", group_id="g", status="completed", reward=1.0, calls=calls)


def _used(call: ModelCall) -> bool:
    return call.status == "ok" and "superseded_by_retry" not in call.flags


def _trained(call: ModelCall) -> bool:
    return _used(call) and call.trainable and not call.off_policy


PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPS
@given(sessions(), st.sampled_from(["merge", "per_call"]))
def test_lengths_agree(rollout: Rollout, mode: str) -> None:
    for row in TrajectoryBuilder(mode).build(rollout):  # type: ignore[arg-type]
        n = len(row.input_ids) - row.prompt_len
        assert len(row.loss_mask) == len(row.logprobs) == len(row.turn_ids) == n
        assert np.all(row.logprobs[row.loss_mask == 0] == 0.0)


@PROPS
@given(sessions(), st.sampled_from(["merge", "per_call"]))
def test_every_sampled_token_in_exactly_one_row(rollout: Rollout, mode: str) -> None:
    rows = TrajectoryBuilder(mode).build(rollout)  # type: ignore[arg-type]
    for call in rollout.calls:
        trained = sum(int(((r.turn_ids == call.index) & (r.loss_mask == 1)).sum()) for r in rows)
        expected = call.completion_ids.shape[0] if _trained(call) else 0
        assert trained == expected
        present = sum(int((r.turn_ids == call.index).sum()) for r in rows)
        assert present == (call.completion_ids.shape[0] if _used(call) else 0)


@PROPS
@given(sessions())
def test_masked_in_tokens_are_the_completions_in_order(rollout: Rollout) -> None:
    rows = build_rows([rollout])
    by_id = {c.call_id: c for c in rollout.calls}
    for row in rows:
        resp = row.response_ids
        got = resp[row.loss_mask == 1]
        want = [by_id[cid].completion_ids for cid in row.call_ids if _trained(by_id[cid])]
        np.testing.assert_array_equal(got, np.concatenate([np.zeros(0, np.int32), *want]))
        got_lp = row.logprobs[row.loss_mask == 1]
        want_lp = [by_id[cid].logprobs for cid in row.call_ids if _trained(by_id[cid])]
        np.testing.assert_array_equal(got_lp, np.concatenate([np.zeros(0, np.float32), *want_lp]))
    # every usable call lands in exactly one row, in call order within it
    seen = [cid for row in rows for cid in row.call_ids]
    assert sorted(seen) == sorted(c.call_id for c in rollout.calls if _used(c))
    for row in rows:
        indices = [by_id[cid].index for cid in row.call_ids]
        assert indices == sorted(indices)


@PROPS
@given(sessions())
def test_rows_replay_the_prompts(rollout: Rollout) -> None:
    """Each call's prompt+completion is a prefix of its row: the row is what the model saw."""
    by_id = {c.call_id: c for c in rollout.calls}
    for row in build_rows([rollout]):
        for cid in row.call_ids:
            full = by_id[cid].full_tokens()
            np.testing.assert_array_equal(row.input_ids[: full.shape[0]], full)


@PROPS
@given(sessions(), st.randoms())
def test_merging_is_deterministic(rollout: Rollout, rnd: object) -> None:
    """Same rows after a JSON round trip of the rollout and with its calls in any stored order."""
    a = [r.model_dump_json() for r in build_rows([rollout])]
    again = Rollout.from_json(rollout.to_json())
    rnd.shuffle(again.calls)  # type: ignore[attr-defined]
    b = [r.model_dump_json() for r in build_rows([again])]
    assert a == b


@PROPS
@given(sessions())
def test_jsonl_round_trip_property(rollout: Rollout) -> None:
    back = Rollout.from_json(rollout.to_json())
    assert back.model_dump_json() == rollout.model_dump_json()


@PROPS
@given(sessions(kinds=("continue",)))
def test_no_spurious_forks(rollout: Rollout) -> None:
    """A session whose every prompt extends the previous call's tokens is one row."""
    rows = build_rows([rollout])
    assert len(rows) == 1 and rows[0].fork is None


@PROPS
@given(sessions())
def test_fork_position_is_the_longest_common_prefix(rollout: Rollout) -> None:
    from rollwire.data.arrays import common_prefix_len

    by_id = {c.call_id: c for c in rollout.calls}
    for row in build_rows([rollout])[1:]:
        assert row.fork is not None
        call = by_id[row.fork.call_id]  # type: ignore[index]
        earlier = [c for c in rollout.calls if c.index < call.index and _used(c)]
        best = max(common_prefix_len(c.full_tokens(), call.prompt_ids) for c in earlier)
        assert row.fork.position == best


@PROPS
@given(sessions())
def test_routed_experts_follow_the_row(rollout: Rollout) -> None:
    for row in build_rows([rollout]):
        assert row.routed_experts is not None
        assert row.routed_experts.shape == (len(row.input_ids) - 1, 2, 2)


@PROPS
@given(sessions())
def test_per_call_gives_one_row_per_call(rollout: Rollout) -> None:
    rows = TrajectoryBuilder("per_call").build(rollout)
    assert len(rows) == sum(1 for c in rollout.calls if _used(c))
    assert all(r.fork is None for r in rows)


# --------------------------------------------------------------------------- fork classes


# CharTokenizer (one id per character, ChatML controls >= 1000) is rollwire.testing's.


TOK = CharTokenizer()


def _rollout(turns: list[tuple[str, str]]) -> Rollout:
    calls = []
    for i, (prompt, completion) in enumerate(turns):
        c = np.asarray(TOK.encode(completion), np.int32)
        calls.append(
            ModelCall(
                call_id=f"c{i}",
                session_id="s",
                index=i,
                prompt_ids=np.asarray(TOK.encode(prompt), np.int32),
                completion_ids=c,
                logprobs=np.full(c.shape[0], -0.5, np.float32),
            )
        )
    return Rollout(rollout_id="s", status="completed", reward=1.0, calls=calls)


def _fork_of(turns: list[tuple[str, str]], tokenizer: object = TOK) -> tuple[int, object]:
    rows = TrajectoryBuilder(tokenizer=tokenizer).build(_rollout(turns))  # type: ignore[arg-type]
    assert len(rows) == 2
    return len(rows), rows[1].fork


def test_continuation_is_one_row() -> None:
    rows = build_rows(
        [
            _rollout(
                [
                    ("<|im_start|>u:hi", "hello<|im_end|>"),
                    ("<|im_start|>u:hihello<|im_end|><|im_start|>u:more", "ok"),
                ]
            )
        ]
    )
    assert len(rows) == 1
    assert rows[0].fork is None
    assert int(rows[0].loss_mask.sum()) == len(TOK.encode("hello<|im_end|>ok"))


def test_fork_think_stripped() -> None:
    first = "<|im_start|>u:q"
    sampled = "<think>plan</think>answer<|im_end|>"
    _, fork = _fork_of([(first, sampled), (first + "answer<|im_end|>" + "u:next", "x")])
    assert fork.kind == "think_stripped"  # type: ignore[attr-defined]
    assert fork.position == len(TOK.encode(first))  # type: ignore[attr-defined]
    assert fork.tokens_lost == len(TOK.encode(sampled))  # type: ignore[attr-defined]


def test_fork_retokenized() -> None:
    first = "<|im_start|>u:q"
    sampled = '{"a": 1}<|im_end|>'
    _, fork = _fork_of([(first, sampled), (first + '{"a":1}<|im_end|>' + "u:next", "x")])
    assert fork.kind == "retokenized"  # type: ignore[attr-defined]


def test_fork_template() -> None:
    first = "<|im_start|>u:q"
    sampled = "answer<|im_end|>"
    _, fork = _fork_of([(first, sampled), (first + "answer\n<|im_end|>" + "u:next", "x")])
    assert fork.kind == "template"  # type: ignore[attr-defined]


def test_fork_truncated() -> None:
    first = "<|im_start|>sys<|im_end|><|im_start|>u:a long first question"
    second = first + "a long answer<|im_end|><|im_start|>u:more"
    third_prompt = "<|im_start|>sys<|im_end|><|im_start|>u:summary"
    rows = TrajectoryBuilder(tokenizer=TOK).build(
        _rollout(
            [(first, "a long answer<|im_end|>"), (second, "ok<|im_end|>"), (third_prompt, "y")]
        )
    )
    assert len(rows) == 2
    assert rows[1].fork is not None and rows[1].fork.kind == "truncated"


def test_fork_think_stripped_with_json_respacing() -> None:
    first = "<|im_start|>u:q"
    sampled = '<think>plan</think>{"a": 1}<|im_end|>'
    _, fork = _fork_of([(first, sampled), (first + '{"a":1}<|im_end|>' + "u:next", "x")])
    assert fork.kind == "think_stripped"  # type: ignore[attr-defined]


def test_fork_sliding_window_cut_is_truncated_not_think_stripped() -> None:
    sys_ = "<|im_start|>sys<|im_end|>"
    u1, a1 = "<|im_start|>u:first question", "<think>hmm</think>first answer<|im_end|>"
    u2, a2 = "<|im_start|>u:second question", "second answer<|im_end|>"
    calls = [
        (sys_ + u1, a1),
        (sys_ + u1 + a1 + u2, a2),
        # the conversation manager dropped the first exchange; the prompt still grew
        (sys_ + u2 + a2 + "<|im_start|>u:third question, rather longer than the others", "z"),
    ]
    rows = TrajectoryBuilder(tokenizer=TOK).build(_rollout(calls))
    assert len(rows) == 2
    assert rows[1].fork is not None and rows[1].fork.kind == "truncated"


def test_fork_content_change_is_not_retokenized() -> None:
    first = "<|im_start|>u:q"
    _, fork = _fork_of([(first, "x: a b<|im_end|>"), (first + "x: ab more<|im_end|>u:n", "y")])
    assert fork.kind == "other"  # type: ignore[attr-defined]


def test_fork_unknown_without_tokenizer() -> None:
    first = "<|im_start|>u:q"
    _, fork = _fork_of([(first, "<think>a</think>b"), (first + "b" + "u:n", "x")], tokenizer=None)
    assert fork.kind == "unknown"  # type: ignore[attr-defined]


def test_classify_fork_direct_other() -> None:
    old = np.asarray(TOK.encode("abcdef"), np.int32)
    new = np.asarray(TOK.encode("abcXYZuvw"), np.int32)
    assert classify_fork(old, new, 3, TOK) == "other"


def test_non_trainable_call_is_context() -> None:
    r = _rollout([("p", "abc"), ("pabc" + "q", "de")])
    r.calls[0].trainable = False
    (row,) = build_rows([r])
    assert row.loss_mask.tolist() == [0, 0, 0, 0, 1, 1]
    assert row.logprobs[:4].tolist() == [0.0] * 4


def test_failed_calls_are_skipped() -> None:
    r = _rollout([("p", "abc"), ("pabc", "")])
    r.calls[1].status = "failed"
    rows = build_rows([r])
    assert [row.call_ids for row in rows] == [["c0"]]


def test_superseded_retry_is_left_out() -> None:
    r = _rollout([("p", "abc"), ("p", "xyz"), ("pxyz" + "q", "de")])
    r.calls[0].flags.append("superseded_by_retry")
    r.calls[0].trainable = False
    r.calls[1].retry_of = "c0"
    rows = build_rows([r])
    assert len(rows) == 1 and rows[0].fork is None
    assert rows[0].call_ids == ["c1", "c2"]


def test_inconsistent_call_is_a_clear_error() -> None:
    r = _rollout([("p", "abc")])
    r.calls[0].logprobs = np.zeros(1, np.float32)
    with pytest.raises(ValueError, match="1 logprobs for 3 completion tokens"):
        build_rows([r])


def test_unknown_mode() -> None:
    with pytest.raises(ValueError, match="unknown trajectory mode"):
        TrajectoryBuilder("flat")  # type: ignore[arg-type]


def test_routed_experts_of_last_call_cover_the_row() -> None:
    from rollwire.testing.samples import moe_rollout

    (row,) = build_rows([moe_rollout()])
    assert row.routed_experts is not None
    assert row.routed_experts.shape == (len(row.input_ids) - 1, 2, 2)
    assert row.routed_experts.dtype == np.int16
