"""rollwire batches through verl 0.9.1's own trainer code (issue 14, items 4-7).

Every test calls verl itself: the legacy ``AgentLoopWorker``'s post-processing (it decides from the
first output whether the batch has routed experts, then concatenates every output's; it reads the
reward-extra keys from the first output and indexes every other with them), and the PPO trainer's
``compute_response_mask``, ``apply_kl_penalty``, ``compute_advantage`` (GRPO, RLOO, REINFORCE++,
OPO) and ``_balance_batch``, on MoE batches with forked, failed and no-call rollouts.
"""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import pytest

pytest.importorskip("verl")
torch = pytest.importorskip("torch")

from verl.experimental.agent_loop.agent_loop import AgentLoopWorker  # noqa: E402
from verl.trainer.config import AlgoConfig  # noqa: E402
from verl.trainer.ppo.core_algos import AdvantageEstimator, FixedKLController  # noqa: E402
from verl.trainer.ppo.ray_trainer import (  # noqa: E402
    RayPPOTrainer,
    apply_kl_penalty,
    compute_advantage,
    compute_response_mask,
)

from rollwire.data.protocol import Group, Rollout  # noqa: E402
from rollwire.data.trajectory import TrajectoryBuilder  # noqa: E402
from rollwire.testing import failed_rollout, forked_rollout, single_turn_rollout  # noqa: E402
from rollwire_verl import to_dataproto  # noqa: E402
from rollwire_verl.outputs import rows_to_agent_loop_outputs  # noqa: E402
from rollwire_verl.settings import LoopSettings  # noqa: E402

LAYERS, TOP_K = 3, 2
ROW = {"raw_prompt": np.array([{"role": "user", "content": "hi"}], dtype=object)}


def _routed(rollout: Rollout, seed: int) -> Rollout:
    """``rollout`` with MoE routing on every call: ``[prompt + completion - 1, L, K]``."""
    rng = np.random.default_rng(seed)
    for call in rollout.calls:
        n = call.prompt_ids.shape[0] + call.completion_ids.shape[0] - 1
        call.routed_experts = rng.integers(0, 8, (n, LAYERS, TOP_K)).astype(np.int16)
    return rollout


def _no_call(rid: str, group: str) -> Rollout:
    return Rollout(rollout_id=rid, group_id=group, status="failed", error="crashed at start")


def _moe_batch() -> list[Group]:
    """g0: clean, forked, failed, no-call; g1: three clean; g2: failed and no-call only.

    Eight trainable-group rows: verl's ``_balance_batch`` asserts that the batch size divides by
    the data-parallel size, and a forked rollout adds a row, so the test sizes the batch for it.
    """
    g0 = [
        _routed(single_turn_rollout("c0", "g0", reward=1.0), 1),
        _routed(forked_rollout("f0", "g0", reward=0.5), 2),
        _routed(failed_rollout("x0", "g0"), 3),
        _no_call("n0", "g0"),
    ]
    g1 = [
        _routed(single_turn_rollout("c1", "g1", reward=0.0), 4),
        _routed(single_turn_rollout("c2", "g1", reward=1.0), 5),
        _routed(single_turn_rollout("c3", "g1", reward=0.5), 8),
    ]
    g2 = [_routed(failed_rollout("x2", "g2"), 6), _no_call("n2", "g2")]
    return [
        Group(group_id="g0", rollouts=g0),
        Group(group_id="g1", rollouts=g1),
        Group(group_id="g2", rollouts=g2),
    ]


def _tokenizer() -> Any:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "a": 1}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="<pad>")), pad_token="<pad>"
    )


def _legacy_worker(prompt_length: int = 32, response_length: int = 32) -> Any:
    worker = object.__new__(AgentLoopWorker)
    worker.reward_loop_worker_handles = None
    worker.distillation_enabled = False
    worker.processor = None
    worker.mm_processor_kwargs = {}
    worker.tokenizer = _tokenizer()
    worker.rollout_config = types.SimpleNamespace(
        prompt_length=prompt_length, response_length=response_length
    )
    return worker


def _last(rollout: Rollout, **kw: Any) -> Any:
    out = rows_to_agent_loop_outputs(
        rollout,
        TrajectoryBuilder().build(rollout),
        multi_row="last",
        reward_extra_keys=kw.pop("reward_extra_keys", ["turns"]),
        fallback_prompt_ids=[1, 1, 1],
        **kw,
    )
    assert not isinstance(out, list)
    return out


async def _legacy_batch(outputs: list[Any]) -> Any:
    worker = _legacy_worker()
    internals = [await worker._agent_loop_postprocess(o, False, **ROW) for o in outputs]
    data = worker._postprocess(internals, input_non_tensor_batch=None)
    data.check_consistency()
    return data


# -- item 4: the legacy worker on an MoE batch with a no-call rollout -------------------------------


@pytest.mark.parametrize("no_call_first", [True, False])
async def test_legacy_worker_keeps_routing_with_a_no_call_rollout(no_call_first: bool) -> None:
    moe = _routed(single_turn_rollout("m", "g"), 7)
    rollouts = [_no_call("n", "g"), moe] if no_call_first else [moe, _no_call("n", "g")]
    outs = [_last(r, routing_shape=(LAYERS, TOP_K)) for r in rollouts]
    data = await _legacy_batch(outs)  # no torch.cat of None, routing not dropped
    experts = data.batch["routed_experts"]
    assert experts.shape == (2, 64, LAYERS, TOP_K) and experts.dtype == torch.int16
    i_moe, i_nc = (1, 0) if no_call_first else (0, 1)
    assert int(experts[i_nc].abs().sum()) == 0  # the placeholder's routing is zero
    (row,) = TrajectoryBuilder().build(moe)
    assert row.routed_experts is not None
    start = 32 - row.prompt_len
    placed = experts[i_moe, start : start + row.routed_experts.shape[0]].numpy()
    np.testing.assert_array_equal(placed, row.routed_experts)
    assert int(data.batch["response_mask"][i_nc].sum()) == 0


async def test_without_the_routing_shape_verl_drops_routing_for_the_batch() -> None:
    # what the placeholder's zero routing prevents: verl reads data[0] and drops every row's
    outs = [_last(_no_call("n", "g")), _last(_routed(single_turn_rollout("m", "g"), 7))]
    data = await _legacy_batch(outs)
    assert "routed_experts" not in data.batch.keys()  # noqa: SIM118 - TensorDict has no `in`


# -- item 5: reward_extra_keys under the legacy worker ------------------------------------------


async def test_legacy_worker_takes_outputs_whose_metrics_differ() -> None:
    clean = single_turn_rollout("c", "g")  # metrics {"turns": 1.0}
    failed = failed_rollout("x", "g")
    failed.metrics = {}
    outs = [
        _last(failed, reward_extra_keys=["turns", "acc"]),
        _last(clean, reward_extra_keys=["turns", "acc"]),
    ]
    data = await _legacy_batch(outs)  # no KeyError: every output has the same keys
    nt = data.non_tensor_batch
    assert nt["turns"].tolist() == [0.0, 1.0] and nt["turns_present"].tolist() == [0.0, 1.0]
    assert nt["acc"].tolist() == [0.0, 0.0] and nt["acc_present"].tolist() == [0.0, 0.0]
    assert not any(np.isnan(nt[k].astype(float)).any() for k in data.meta_info["reward_extra_keys"])


def test_multi_row_last_without_reward_extra_keys_is_refused() -> None:
    with pytest.raises(ValueError, match="reward_extra_keys"):
        _last(single_turn_rollout(), reward_extra_keys=None)
    with pytest.raises(ValueError, match="ROLLWIRE_REWARD_EXTRA_KEYS"):
        LoopSettings(multi_row="last").validate()
    LoopSettings(multi_row="last", reward_extra_keys=("acc",)).validate()


# -- items 6 and 7: verl's trainer functions on the padded DataProto --------------------------------


def _trainer_batch(**kw: Any) -> Any:
    data, report = to_dataproto(_moe_batch(), pad_token_id=0, return_report=True, **kw)
    data.batch["token_level_scores"] = data.batch["rm_scores"].clone()
    old = data.batch["rollout_log_probs"].clone()
    data.batch["old_log_probs"] = old
    data.batch["ref_log_prob"] = old - 0.1 * data.batch["response_mask"].float()
    return data, report


def test_groups_without_a_trainable_token_are_left_out_and_counted() -> None:
    data, report = _trainer_batch()
    assert "g2" not in set(data.non_tensor_batch["uid"])
    assert report.untrainable_groups == 1 and report.untrainable_rows == 2 and len(data) == 8
    kept, kept_report = _trainer_batch(keep_untrainable_groups=True)
    assert kept_report.untrainable_groups == 0 and "g2" in set(kept.non_tensor_batch["uid"])
    # why: verl's OPO divides by the group's token count, NaN on every row of such a group
    kept.batch["token_level_rewards"] = kept.batch["token_level_scores"]
    compute_advantage(kept, AdvantageEstimator.OPO)
    assert torch.isnan(kept.batch["advantages"]).any()


@pytest.mark.parametrize(
    "estimator",
    [
        AdvantageEstimator.GRPO,
        AdvantageEstimator.RLOO,
        AdvantageEstimator.REINFORCE_PLUS_PLUS,
        AdvantageEstimator.OPO,
    ],
)
def test_trainer_functions_on_a_moe_batch(estimator: AdvantageEstimator) -> None:
    data, report = _trainer_batch()
    # counted over the rows given; group g2 (failed + no-call) is then left out
    assert report.placeholders == 2 and report.failed == 4 and len(data) == 8
    b, nt = data.batch, data.non_tensor_batch
    # compute_response_mask is the attended response; rollwire's policy mask lies inside it
    attended = compute_response_mask(data)
    assert attended.shape == b["response_mask"].shape
    assert bool(((b["response_mask"] == 1) <= (attended == 1)).all())
    data, kl_metrics = apply_kl_penalty(data, FixedKLController(0.05))
    assert np.isfinite(kl_metrics["actor/reward_kl_penalty"])
    compute_advantage(data, estimator, norm_adv_by_std_in_grpo=True, config=AlgoConfig(gamma=1.0))
    adv = data.batch["advantages"]
    assert adv.shape == b["response_mask"].shape and torch.isfinite(adv).all()
    assert bool((adv[b["response_mask"] == 0] == 0).all())  # masked tokens carry nothing
    # failed rows and the placeholder train nothing
    for i, rid in enumerate(nt["rollout_id"]):
        if rid in ("x0", "n0"):
            assert int(b["response_mask"][i].sum()) == 0
    # routing rides along: every row keeps its own through _balance_batch's reorder
    before = {
        (r, int(k)): e.clone()
        for r, k, e in zip(nt["rollout_id"], nt["row_index"], b["routed_experts"])
    }
    trainer = types.SimpleNamespace(
        _get_dp_size=lambda wg, role: 2, actor_rollout_wg=None, use_prefix_grouper=False
    )
    metrics: dict[str, Any] = {}
    RayPPOTrainer._balance_batch(trainer, data, metrics)
    assert metrics and len(data) == len(before)
    for r, k, e in zip(
        data.non_tensor_batch["rollout_id"],
        data.non_tensor_batch["row_index"],
        data.batch["routed_experts"],
    ):
        assert torch.equal(before[(r, int(k))], e)
