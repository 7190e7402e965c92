"""to_dataproto against real verl: layout, exact tensors, verl's own operations and GRPO."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

pytest.importorskip("verl")
torch = pytest.importorskip("torch")

from verl import DataProto  # noqa: E402
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage  # noqa: E402

import rollwire_verl  # noqa: E402
from rollwire.data.protocol import Group, ModelCall, Rollout  # noqa: E402
from rollwire.data.trajectory import build_rows  # noqa: E402
from rollwire.plugins.protocols import TrainerAdapter  # noqa: E402
from rollwire.testing import TrainerAdapterConformance, sample_batch  # noqa: E402
from rollwire_verl import (  # noqa: E402
    ConversionReport,
    flatten_dataproto,
    grpo_advantages,
    normalize_rewards,
    to_dataproto,
)

PAD = 99


class TestVerlConformance(TrainerAdapterConformance):
    convert_options: ClassVar[dict[str, Any]] = {"pad_token_id": 0}

    @pytest.fixture
    def adapter(self) -> TrainerAdapter:
        return rollwire_verl.adapter


def _call(
    rid: str,
    i: int,
    prompt: list[int],
    completion: list[int],
    lps: list[float],
    experts: np.ndarray | None = None,
) -> ModelCall:
    return ModelCall(
        call_id=f"{rid}-{i}",
        session_id=rid,
        index=i,
        prompt_ids=np.array(prompt, np.int32),
        completion_ids=np.array(completion, np.int32),
        logprobs=np.array(lps, np.float32),
        routed_experts=experts,
    )


def two_turn(
    rid: str = "two", group: str = "g", reward: float = 1.0, experts: bool = False
) -> Rollout:
    """Prompt [11,12,13]; sampled [21,22]; tool [31]; sampled [41,42,43]."""
    e0 = e1 = None
    if experts:
        full = np.arange(8 * 2 * 3, dtype=np.int16).reshape(8, 2, 3)  # 9 tokens - 1
        e0, e1 = full[:4], full
    calls = [
        _call(rid, 0, [11, 12, 13], [21, 22], [-0.1, -0.2], e0),
        _call(rid, 1, [11, 12, 13, 21, 22, 31], [41, 42, 43], [-0.3, -0.4, -0.5], e1),
    ]
    return Rollout(
        rollout_id=rid,
        group_id=group,
        status="completed",
        reward=reward,
        metrics={"acc": 1.0},
        calls=calls,
    )


def one_turn(rid: str = "one", group: str = "g", reward: float = 0.0) -> Rollout:
    calls = [_call(rid, 0, [11, 12, 13, 14, 15], [51], [-0.6])]
    return Rollout(rollout_id=rid, group_id=group, status="completed", reward=reward, calls=calls)


def test_exact_tensors_for_a_two_turn_rollout() -> None:
    dp = to_dataproto([two_turn(), one_turn()], pad_token_id=PAD)
    b = dp.batch
    assert b["prompts"].dtype == torch.int64 and b["rm_scores"].dtype == torch.float32
    assert b["prompts"].tolist() == [[PAD, PAD, 11, 12, 13], [11, 12, 13, 14, 15]]
    assert b["responses"].tolist() == [[21, 22, 31, 41, 42, 43], [51, PAD, PAD, PAD, PAD, PAD]]
    assert torch.equal(b["input_ids"], torch.cat([b["prompts"], b["responses"]], dim=1))
    assert b["attention_mask"].tolist() == [
        [0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0],
    ]
    # clip(cumsum(mask) - 1, 0): left pads 0, right pads repeat the last real position
    assert b["position_ids"].tolist() == [
        [0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8],
        [0, 1, 2, 3, 4, 5, 5, 5, 5, 5, 5],
    ]
    assert b["response_mask"].dtype == torch.int64
    assert b["response_mask"].tolist() == [[1, 1, 0, 1, 1, 1], [1, 0, 0, 0, 0, 0]]
    np.testing.assert_allclose(
        b["rollout_log_probs"].numpy(),
        [[-0.1, -0.2, 0.0, -0.3, -0.4, -0.5], [-0.6, 0, 0, 0, 0, 0]],
        rtol=1e-6,
    )
    assert b["rm_scores"].tolist() == [[0, 0, 0, 0, 0, 1.0], [0, 0, 0, 0, 0, 0]]
    assert "routed_experts" not in b
    nt = dp.non_tensor_batch
    assert list(nt["uid"]) == ["g", "g"] and list(nt["rollout_id"]) == ["two", "one"]
    # verl's count: prompt + assistant turns + tool turns between them (one call = 2)
    assert list(nt["__num_turns__"]) == [4, 2] and list(nt["row_index"]) == [0, 0]
    assert list(nt["multi_modal_inputs"]) == [{}, {}]
    assert nt["multi_modal_inputs"][0] is not nt["multi_modal_inputs"][1]
    assert list(nt["status"]) == ["completed", "completed"]
    assert list(nt["acc"]) == [1.0, 0.0]
    # nothing batch-specific in meta_info: verl's DataProto.concat asserts it agrees
    assert dp.meta_info == {"reward_extra_keys": ["acc"]}
    _, report = to_dataproto([two_turn(), one_turn()], return_report=True)
    assert report == ConversionReport(rows=2)


def test_reward_sits_at_last_response_token_like_verl() -> None:
    dp = to_dataproto(sample_batch(), pad_token_id=0, failure_reward=-3.0)
    p = dp.batch["prompts"].shape[1]
    last = dp.batch["attention_mask"][:, p:].sum(dim=1) - 1  # verl's own rule
    rewards = {"a0": 1.0, "a1": 0.5, "a2": -0.5, "b0": 2.0, "b1": 0.0, "b2": -3.0}
    for i, rid in enumerate(dp.non_tensor_batch["rollout_id"]):
        expected = torch.zeros(dp.batch["rm_scores"].shape[1])
        expected[int(last[i])] = rewards[rid]
        assert torch.equal(dp.batch["rm_scores"][i], expected), rid


def test_passes_check_consistency_and_survives_concat_repeat_chunk(tmp_path: Path) -> None:
    dp = to_dataproto(sample_batch(), pad_token_id=0)
    dp.check_consistency()
    n = len(dp)
    both = DataProto.concat([dp, dp])
    both.check_consistency()
    assert len(both) == 2 * n and list(both.non_tensor_batch["rollout_id"][n:]) == list(
        dp.non_tensor_batch["rollout_id"]
    )
    rep = dp.repeat(repeat_times=3, interleave=True)
    rep.check_consistency()
    assert len(rep) == 3 * n and torch.equal(
        rep.batch["input_ids"][:3], dp.batch["input_ids"][:1].repeat(3, 1)
    )
    parts = DataProto.concat([dp, dp]).chunk(2)
    assert [len(x) for x in parts] == [n, n]
    for part in parts:
        part.check_consistency()
        assert torch.equal(part.batch["responses"], dp.batch["responses"])
    path = rollwire_verl.adapter.export(sample_batch(), tmp_path / "b.pkl", pad_token_id=0)
    back = DataProto.load_from_disk(str(path))
    assert torch.equal(back.batch["input_ids"], dp.batch["input_ids"])
    assert list(back.non_tensor_batch["uid"]) == list(dp.non_tensor_batch["uid"])


def test_separate_conversions_concat() -> None:
    """Batches converted one at a time (one per step, per worker) concatenate in verl."""
    g0, g1 = sample_batch()
    opts: dict[str, Any] = {"max_prompt_length": 16, "max_response_length": 24}
    a = to_dataproto([g0], **opts, routed_experts=False)
    b, report = to_dataproto([g1], **opts, routed_experts=False, return_report=True)
    assert report == ConversionReport(rows=3, failed=1)
    both = DataProto.concat([a, b])
    both.check_consistency()
    assert list(both.non_tensor_batch["rollout_id"]) == ["a0", "a1", "a2", "a2", "b0", "b1", "b2"]
    assert both.meta_info == {"reward_extra_keys": ["turns"]}
    # batches whose rollouts report different metrics: fix the columns with reward_extra_keys
    keys = ["acc"]
    fixed: dict[str, Any] = {"max_prompt_length": 8, "max_response_length": 8}
    x = to_dataproto([two_turn()], **fixed, reward_extra_keys=keys)
    y = to_dataproto([one_turn()], **fixed, reward_extra_keys=keys)
    xy = DataProto.concat([x, y])
    assert list(xy.non_tensor_batch["acc"]) == [1.0, 0.0]


def test_verl_grpo_groups_by_uid_and_zeroes_masked_tokens() -> None:
    batch = [
        two_turn("a", "g1", 1.0),
        one_turn("b", "g1", 0.0),
        two_turn("c", "g2", 3.0),
        one_turn("d", "g2", 5.0),
    ]
    dp = to_dataproto(batch, pad_token_id=PAD)
    adv, _ = compute_grpo_outcome_advantage(
        token_level_rewards=dp.batch["rm_scores"],
        response_mask=dp.batch["response_mask"],
        index=dp.non_tensor_batch["uid"],
    )
    mask = dp.batch["response_mask"].bool()
    assert torch.all(adv[~mask] == 0)
    per_row = [float(adv[i][mask[i]][0]) for i in range(4)]
    # two rollouts per group, one above and one below the mean: ±1/sqrt(2) with torch.std
    s = 1 / np.sqrt(2)
    np.testing.assert_allclose(per_row, [s, -s, -s, s], rtol=1e-4)
    # rollwire's rollout-level version agrees when no rollout forked
    ours, _ = grpo_advantages(dp, store=False)
    np.testing.assert_allclose(ours.numpy(), adv.numpy(), atol=1e-5)


def test_forked_rollout_counts_once_in_its_group() -> None:
    dp = to_dataproto(sample_batch(), pad_token_id=0)
    per_row = normalize_rewards(dp)
    # by hand, (r - mean) / std(ddof=1) over rollouts: g0 = [1.0, 0.5, -0.5] (a2 forked into
    # 2 rows, counted once); g1 = [2.0, 0.0, 0.0] (b2 failed: failure_reward 0.0)
    expected = {
        "a0": 0.872872,
        "a1": 0.218218,
        "a2": -1.091088,
        "b0": 1.154700,
        "b1": -0.577350,
        "b2": -0.577350,
    }
    rids = list(dp.non_tensor_batch["rollout_id"])
    assert rids == ["a0", "a1", "a2", "a2", "b0", "b1", "b2"]
    np.testing.assert_allclose(per_row, [expected[r] for r in rids], atol=1e-5)
    advantages, returns = grpo_advantages(dp)
    assert advantages.data_ptr() != returns.data_ptr()  # two tensors, not one twice
    assert torch.equal(returns, advantages)
    assert dp.batch["advantages"].data_ptr() == advantages.data_ptr()
    assert dp.batch["returns"].data_ptr() == returns.data_ptr()
    assert torch.all(advantages[dp.batch["response_mask"] == 0] == 0)
    # verl's row-level GRPO counts a2 twice: a different (biased) group mean
    verl_adv, _ = compute_grpo_outcome_advantage(
        dp.batch["rm_scores"], dp.batch["response_mask"], dp.non_tensor_batch["uid"]
    )
    i0 = 0  # a0: single-turn, reward 1.0 in group g0
    assert float(verl_adv[i0].abs().max()) != pytest.approx(float(advantages[i0].abs().max()))


def test_overlong_truncate_keeps_prompt_tail_and_response_head() -> None:
    dp = to_dataproto(
        [two_turn(), one_turn()],
        pad_token_id=PAD,
        max_prompt_length=2,
        max_response_length=4,
        overlong="truncate",
    )
    b = dp.batch
    assert b["prompts"].tolist() == [[12, 13], [14, 15]]
    assert b["responses"].tolist() == [[21, 22, 31, 41], [51, PAD, PAD, PAD]]
    assert b["response_mask"].tolist() == [[1, 1, 0, 1], [1, 0, 0, 0]]
    assert b["rm_scores"].tolist() == [[0, 0, 0, 1.0], [0, 0, 0, 0]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]]
    assert list(dp.non_tensor_batch["truncated"]) == [True, True]
    _, report = to_dataproto(
        [two_turn(), one_turn()], max_prompt_length=2, max_response_length=4, return_report=True
    )
    assert report == ConversionReport(rows=2, truncated=2)


def test_fixed_lengths_pad_to_the_limits() -> None:
    dp = to_dataproto([one_turn()], pad_token_id=PAD, max_prompt_length=8, max_response_length=3)
    assert dp.batch["prompts"].shape == (1, 8) and dp.batch["responses"].shape == (1, 3)
    assert dp.batch["prompts"].tolist() == [[PAD, PAD, PAD, 11, 12, 13, 14, 15]]


def test_overlong_drop_skips_and_counts() -> None:
    dp, report = to_dataproto(
        [two_turn(), one_turn()],
        pad_token_id=PAD,
        max_response_length=4,
        overlong="drop",
        return_report=True,
    )
    assert len(dp) == 1 and list(dp.non_tensor_batch["rollout_id"]) == ["one"]
    assert dp.batch["responses"].shape == (1, 4)
    assert report == ConversionReport(rows=2, dropped=1)
    with pytest.raises(ValueError, match="1 dropped as over-long"):
        to_dataproto([two_turn()], max_response_length=2, overlong="drop")
    with pytest.raises(ValueError, match="overlong"):
        to_dataproto([two_turn()], overlong="cut")  # type: ignore[arg-type]


def test_routed_experts_placement_and_dtype() -> None:
    r = two_turn(experts=True)
    dp = to_dataproto([r, one_turn()], pad_token_id=PAD)
    re = dp.batch["routed_experts"]
    assert re.dtype == torch.int16 and re.shape == (2, 5 + 6, 2, 3)
    full = r.calls[1].routed_experts
    # row 0: prompt of 3 left-padded to 5, so token j's routing is at column 2 + j
    assert torch.equal(re[0, 2 : 2 + 8], torch.from_numpy(full))
    assert torch.all(re[0, :2] == 0) and torch.all(re[0, 10:] == 0)
    assert torch.all(re[1] == 0)  # the rollout without routing
    # truncated prompt: routing shifts with the dropped prompt tokens
    dp = to_dataproto([r], pad_token_id=PAD, max_prompt_length=2, max_response_length=4)
    assert torch.equal(dp.batch["routed_experts"][0], torch.from_numpy(full[1:7]))


def test_failed_rollouts_policy() -> None:
    groups = sample_batch()
    dp = to_dataproto(groups, pad_token_id=0, failure_reward=-1.0)
    i = list(dp.non_tensor_batch["rollout_id"]).index("b2")
    assert dp.non_tensor_batch["status"][i] == "failed"
    assert int(dp.batch["response_mask"][i].sum()) == 0
    assert torch.all(dp.batch["rollout_log_probs"][i] == 0)
    assert float(dp.batch["rm_scores"][i].sum()) == -1.0
    excluded, report = to_dataproto(
        groups, pad_token_id=0, include_failed=False, return_report=True
    )
    assert "b2" not in list(excluded.non_tensor_batch["rollout_id"])
    assert report.excluded_failed == 1 and report.failed == 1


def _no_calls(rid: str, status: str, reward: float | None, group: str = "g") -> Rollout:
    return Rollout(
        rollout_id=rid,
        group_id=group,
        status=status,  # type: ignore[arg-type]
        reward=reward,
        error="agent crashed" if status != "completed" else None,
        calls=[],
    )


def test_failed_rollout_without_calls_is_a_masked_placeholder() -> None:
    # regression: a failed rollout with no usable call used to vanish from the batch (B=2, report
    # failed=0), taking its failure reward out of the group's GRPO statistics
    group = Group(
        group_id="g",
        rollouts=[two_turn("r1"), one_turn("r3", reward=0.5), _no_calls("r2", "failed", None)],
    )
    dp, report = to_dataproto([group], pad_token_id=PAD, failure_reward=-1.0, return_report=True)
    assert len(dp) == 3
    assert report == ConversionReport(rows=3, failed=1, placeholders=1)
    nt = dp.non_tensor_batch
    assert list(nt["rollout_id"]) == ["r1", "r3", "r2"]
    assert list(nt["uid"]) == ["g", "g", "g"]
    assert list(nt["placeholder"]) == [False, False, True]
    assert nt["status"][2] == "failed" and nt["__num_turns__"][2] == 1
    b = dp.batch
    p = b["prompts"].shape[1]
    assert b["prompts"][2].tolist() == [PAD] * p
    assert b["responses"][2].tolist() == [PAD] * b["responses"].shape[1]
    # one attended prompt token (the last prompt column) and one attended response token
    assert b["attention_mask"][2].tolist() == [0] * (p - 1) + [1, 1] + [0] * (
        b["responses"].shape[1] - 1
    )
    assert b["position_ids"][2, p - 1 :].tolist()[:2] == [0, 1]
    assert int(b["response_mask"][2].sum()) == 0
    assert torch.all(b["rollout_log_probs"][2] == 0)
    assert b["rm_scores"][2, 0].item() == -1.0 and float(b["rm_scores"][2].sum()) == -1.0
    # the failure reward is in the group's statistics: mean of (1, 0.5, -1)
    scores = np.array([1.0, 0.5, -1.0])
    adv = normalize_rewards(dp)
    want = (scores - scores.mean()) / (scores.std(ddof=1) + 1e-6)
    np.testing.assert_allclose(adv, want, rtol=1e-5)
    # flatten gives TrajectoryBuilder's rows: the placeholder holds no token of the rollout
    assert [r.rollout_id for r in flatten_dataproto(dp)] == ["r1", "r3"]
    # excluded with include_failed=False, and counted as such
    ex, report = to_dataproto([group], pad_token_id=PAD, include_failed=False, return_report=True)
    assert len(ex) == 2 and list(ex.non_tensor_batch["rollout_id"]) == ["r1", "r3"]
    assert report == ConversionReport(rows=3, failed=1, excluded_failed=1)


def test_completed_rollout_without_calls_is_a_placeholder() -> None:
    group = Group(group_id="g", rollouts=[two_turn("r1"), _no_calls("r0", "completed", 0.25)])
    dp, report = to_dataproto([group], pad_token_id=PAD, include_failed=False, return_report=True)
    assert len(dp) == 2 and report == ConversionReport(rows=2, placeholders=1)
    assert list(dp.non_tensor_batch["uid"]) == ["g", "g"]
    assert dp.non_tensor_batch["status"][1] == "completed"
    assert dp.batch["rm_scores"][1, 0].item() == 0.25
    assert int(dp.batch["response_mask"][1].sum()) == 0
    # limits and the drop policy keep it (1 + 1 tokens always fit), when its group is kept
    dp, report = to_dataproto(
        [group],
        max_prompt_length=2,
        max_response_length=2,
        overlong="drop",
        keep_untrainable_groups=True,
        return_report=True,
    )
    assert list(dp.non_tensor_batch["rollout_id"]) == ["r0"] and report.dropped == 1
    # with no reward it is the same error as any completed rollout without one
    with pytest.raises(ValueError, match="no reward"):
        to_dataproto([_no_calls("r9", "completed", None)])


def test_batch_of_only_placeholders_converts_when_kept() -> None:
    batch = [_no_calls("a", "failed", None), _no_calls("b", "timeout", None)]
    with pytest.raises(ValueError, match="keep_untrainable_groups=True"):
        to_dataproto(batch)  # by default a group without a trainable token is left out
    dp = to_dataproto(batch, failure_reward=-2.0, keep_untrainable_groups=True)
    assert dp.batch["input_ids"].shape == (2, 2)
    assert dp.batch["attention_mask"].tolist() == [[1, 1], [1, 1]]
    assert dp.batch["rm_scores"].tolist() == [[-2.0], [-2.0]]
    assert list(dp.non_tensor_batch["uid"]) == ["g", "g"]
    assert flatten_dataproto(dp) == []


def test_flat_rollouts_group_by_group_id() -> None:
    flat = [r for g in sample_batch() for r in g.rollouts]
    dp = to_dataproto(flat)
    assert list(dict.fromkeys(dp.non_tensor_batch["uid"])) == ["g0", "g1"]


def test_clear_errors() -> None:
    with pytest.raises(ValueError, match="empty"):
        to_dataproto([])
    r = one_turn()
    r.reward = None
    with pytest.raises(ValueError, match="no reward"):
        to_dataproto([Group(group_id="g", rollouts=[r])])
    with pytest.raises(ValueError, match="positive"):
        to_dataproto([one_turn()], max_prompt_length=0)


def test_normalize_rewards_uses_the_outcome_reward_not_kl_shaped_rewards() -> None:
    dp = to_dataproto(sample_batch(), pad_token_id=0)
    before = normalize_rewards(dp)
    # verl's apply_kl_penalty: token_level_rewards = scores - beta * KL, different on every row
    kl = torch.rand(dp.batch["rm_scores"].shape) * dp.batch["response_mask"]
    dp.batch["token_level_scores"] = dp.batch["rm_scores"].clone()
    dp.batch["token_level_rewards"] = dp.batch["rm_scores"] - 0.1 * kl
    np.testing.assert_allclose(normalize_rewards(dp), before, atol=1e-6)
    # rows of one rollout that disagree on the outcome reward: no silent first-row-wins
    i = list(dp.non_tensor_batch["rollout_id"]).index("a2")
    dp.batch["rm_scores"][i + 1] *= 2.0
    with pytest.raises(ValueError, match="a2"):
        normalize_rewards(dp)


def test_flatten_recovers_the_builders_routed_experts() -> None:
    batch = sample_batch()
    dp = to_dataproto(batch, pad_token_id=0)
    assert list(dp.non_tensor_batch["has_routed_experts"]) == [False] * 4 + [True] + [False] * 2
    expected = {(r.rollout_id, r.row_index): r.routed_experts for r in build_rows(batch)}
    p = dp.batch["prompts"].shape[1]
    plens = dp.batch["attention_mask"][:, :p].sum(dim=1)
    rlens = dp.batch["attention_mask"][:, p:].sum(dim=1)
    rows = flatten_dataproto(dp)
    for i, rid in enumerate(dp.non_tensor_batch["rollout_id"]):
        want = expected[(rid, int(dp.non_tensor_batch["row_index"][i]))]
        if want is None:
            assert not dp.non_tensor_batch["has_routed_experts"][i]
            assert rows[i].routed_experts is None
            continue
        pl, rl = int(plens[i]), int(rlens[i])
        got = dp.batch["routed_experts"][i, p - pl : p + rl - 1].numpy()
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(rows[i].routed_experts, want)
