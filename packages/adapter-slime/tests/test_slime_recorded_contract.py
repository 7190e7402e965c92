"""rollwire against what slime's real code did with a fixed batch (``tests/data/slime_contract.json``).

``ci/record_contract.py`` ran slime (the commit in the file) on the batch stored in the file:
``Sample.from_dict`` of ``rollwire_slime.to_samples``, the rollout manager's flattening,
``_convert_samples_to_train_data`` (with ``rollwire_slime.normalize_rewards`` as the reward
post-process, and with slime's default) and its DP/micro-batch split, then the Megatron actor's
GRPO advantages and policy loss per micro-batch — plain, ``--use-tis`` and
``--use-rollout-logprobs`` — on made-up logits. These tests need neither slime nor torch: they
check that rollwire still hands slime exactly those samples, and that what slime made of them is
what rollwire's docs promise, with the loss recomputed here in NumPy from slime's formulas.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from rollwire.data.protocol import Group, Rollout
from rollwire_slime import SAMPLE_FIELDS, normalize_rewards, to_sample_dicts

DATA = json.loads((Path(__file__).parent / "data" / "slime_contract.json").read_text())
TRAIN = DATA["train_data"]
#: fields of slime's ``Sample`` that rollwire's dicts leave out, at slime's defaults
SLIME_ONLY: dict[str, Any] = {
    "apply_chat_template_kwargs": {},
    "custom_rm_path": None,
    "multimodal_train_input_id": None,
}
#: keys rollwire writes that this slime's ``Sample`` has no field for (``from_dict`` sets them as
#: attributes; older releases have ``raw_prompt`` as a field)
ROLLWIRE_ONLY = {"raw_prompt"}
#: the sample fields slime's training reads and rollwire must always fill
TRAINED_ON = ("tokens", "response_length", "loss_mask", "rollout_log_probs", "rollout_id", "index")


def _batch() -> list[Group]:
    return [
        Group(
            group_id=g["group_id"],
            task_id=g["task_id"],
            rollouts=[Rollout.from_json(json.dumps(r)) for r in g["rollouts"]],
        )
        for g in DATA["batch"]
    ]


def _flat() -> list[dict[str, Any]]:
    """rollwire's current samples for the batch, flat, in slime's order."""
    return [s for group in to_sample_dicts(_batch()) for s in group]


def test_recorded_with_a_known_slime() -> None:
    assert DATA["slime_commit"], "record_contract.py names the slime commit it ran"
    assert set(DATA["loss"]) == {"ppo", "tis", "rollout_logprobs"}


def test_rollwire_gives_slime_exactly_the_recorded_samples() -> None:
    assert to_sample_dicts(_batch()) == DATA["sample_dicts"]


def test_slime_sample_keeps_every_field_rollwire_writes() -> None:
    """``Sample.from_dict`` then ``to_dict`` gives back rollwire's dict, plus slime's defaults."""
    fields = set(DATA["slime_sample_fields"])
    assert set(SAMPLE_FIELDS) - fields == ROLLWIRE_ONLY
    assert fields - set(SAMPLE_FIELDS) == set(SLIME_ONLY)
    for ours, theirs in zip(DATA["sample_dicts"], DATA["slime_samples"], strict=True):
        for mine, kept in zip(ours, theirs, strict=True):
            assert {k: kept[k] for k in set(kept) - set(mine)} == SLIME_ONLY
            assert mine == {k: v for k, v in kept.items() if k not in SLIME_ONLY}


def test_slime_reads_only_fields_rollwire_fills() -> None:
    read = set(DATA["fields_read"])
    assert read <= set(SAMPLE_FIELDS)
    assert set(TRAINED_ON) <= read
    for s in _flat():
        assert all(s[k] is not None for k in TRAINED_ON), s["index"]


def test_train_data_is_rollwires_samples() -> None:
    """slime's train data: rollwire's tokens, masks and log-probs, unchanged and in order; a
    ``remove_sample`` row's mask all zero; a forked rollout's rows under one rollout id."""
    flat = _flat()
    assert TRAIN["tokens"] == [s["tokens"] for s in flat]
    assert TRAIN["response_lengths"] == [s["response_length"] for s in flat]
    assert TRAIN["rollout_log_probs"] == [s["rollout_log_probs"] for s in flat]
    assert TRAIN["sample_indices"] == [s["index"] for s in flat]
    assert TRAIN["rollout_ids"] == [s["rollout_id"] for s in flat]
    assert TRAIN["truncated"] == [int(s["status"] == "truncated") for s in flat]
    assert TRAIN["raw_reward"] == [s["reward"] for s in flat]
    masks = [[0] * len(s["loss_mask"]) if s["remove_sample"] else s["loss_mask"] for s in flat]
    assert TRAIN["loss_masks"] == masks
    assert any(s["remove_sample"] and s["loss_mask"] for s in flat)  # a failed row has tokens
    assert 1 in TRAIN["truncated"]
    # the forked rollout: two consecutive rows, one rollout id
    forked = [i for i, s in enumerate(flat) if s["metadata"]["rollwire"]["num_rows"] == 2]
    assert len(forked) == 2 and len({TRAIN["rollout_ids"][i] for i in forked}) == 1


def test_rollout_mask_sums_count_a_forked_rollout_once() -> None:
    """The loss divides each row by its rollout's mask total, so a rollout's rows weigh 1 together."""
    ids, sums = TRAIN["rollout_ids"], TRAIN["rollout_mask_sums"]
    totals: dict[int, int] = {}
    for rid, mask in zip(ids, TRAIN["loss_masks"]):
        totals[rid] = totals.get(rid, 0) + sum(mask)
    assert sums == [totals[rid] for rid in ids]
    weight: dict[int, float] = {}
    for rid, mask, total in zip(ids, TRAIN["loss_masks"], sums):
        weight[rid] = weight.get(rid, 0.0) + sum(mask) / max(total, 1)
    assert {w for w in weight.values()} == {0.0, 1.0}  # removed rollouts 0, every other 1


def test_train_rewards_are_rollwires_normalize_rewards() -> None:
    """With ``--custom-reward-post-process-path rollwire_slime.normalize_rewards`` slime trains on
    exactly what rollwire's hook returns for the current samples."""
    raw, rewards = normalize_rewards(SimpleNamespace(**DATA["reward_args"]), _flat())
    assert TRAIN["raw_reward"] == raw
    assert TRAIN["rewards"] == pytest.approx(rewards, abs=1e-6)


def test_slime_default_normalisation_is_whole_batch_and_counts_forks_twice() -> None:
    """Without the hook: 9 rows ≠ rollout_batch_size × n_samples_per_prompt, so slime falls back to
    one whole-batch group (unbiased std), a forked rollout counts twice and failed rows count."""
    default = DATA["rewards"]["slime_default"]
    raw = np.asarray(default["raw_reward"], dtype=np.float64)
    args = DATA["reward_args"]
    assert raw.size != args["rollout_batch_size"] * args["n_samples_per_prompt"]
    want = (raw - raw.mean()) / (raw.std(ddof=1) + 1e-6)
    assert default["rewards"] == pytest.approx(want.tolist(), abs=1e-5)
    assert default["rewards"] != pytest.approx(TRAIN["rewards"], abs=1e-3)
    assert {k: v for k, v in default.items() if k not in ("rewards",)} == {
        k: v for k, v in TRAIN.items() if k not in ("rewards",)
    }


def test_routing_reaches_slime_for_every_sample() -> None:
    """One routing tensor per sample ``[len(tokens) - 1, layers, top_k]`` — placeholder and rows
    without captured routing included — passed slime's routing-replay check."""
    layers, top_k = DATA["megatron_args"]["num_layers"], DATA["megatron_args"]["moe_router_topk"]
    assert "--use-rollout-routing-replay" in DATA["flags"]
    flat = _flat()
    assert TRAIN["rollout_routed_experts"] == [s["rollout_routed_experts"] for s in flat]
    shapes = [[len(s["tokens"]) - 1, layers, top_k] for s in flat]
    assert TRAIN["rollout_routed_experts_shapes"] == shapes


def test_dynamic_filter_reads_every_sample_of_a_flat_group() -> None:
    """slime's ``check_reward_nonzero_std`` takes a group of Samples (rollwire's flat group, a
    forked rollout's rows included) and keeps it when the unbiased std of their rewards > 1e-6."""
    flat = _flat()
    groups = [[s["index"] for s in g] for g in DATA["sample_dicts"]]
    recorded = DATA["dynamic_filter"]
    assert [f["indices"] for f in recorded[: len(groups)]] == groups
    for f in recorded:
        rewards = np.asarray([flat[i]["reward"] for i in f["indices"]], dtype=np.float64)
        assert f["keep"] == bool(rewards.std(ddof=1) > 1e-6)
        assert f["reason"] == (None if f["keep"] else f"zero_std_{round(rewards[0], 1)}")
    assert not recorded[-1]["keep"]


@pytest.mark.parametrize("case", sorted(DATA["loss"]))
def test_one_training_step_holds_every_rollout(case: str) -> None:
    """slime's step is ``global_batch_size`` rollouts, not rows: the forked rollout's two rows
    land in the same step, and every row in exactly one micro-batch."""
    data = DATA["loss"][case]
    n_rollouts = len(set(TRAIN["rollout_ids"]))
    assert data["global_batch_sizes"] == [n_rollouts] == [data["global_batch_size"]]
    indices = [i for mb in data["micro_batches"] for i in mb["indices"]]
    assert sorted(indices) == list(range(len(TRAIN["tokens"])))
    assert data["num_microbatches"] == [len(data["micro_batches"])]
    assert {"rollout_log_probs", "loss_masks", "rollout_mask_sums"} <= set(data["rank_keys"])


@pytest.mark.parametrize("case", sorted(DATA["loss"]))
def test_grpo_advantages_are_the_train_rewards_per_token(case: str) -> None:
    for adv, reward, n in zip(
        DATA["loss"][case]["advantages"], TRAIN["rewards"], TRAIN["response_lengths"]
    ):
        assert adv == pytest.approx([reward] * n, abs=1e-6)


def _policy_terms(case: str, mb: dict[str, Any]) -> tuple[list[np.ndarray], ...]:
    """Per row of a micro-batch: slime's per-token PPO loss and its derivative in the current
    log-prob (the loss and the gradient go through the mask later)."""
    data = DATA["loss"][case]
    uses_rollout = "--use-rollout-logprobs" in data["flags"]
    losses, grads, weights = [], [], []
    for i, lp in zip(mb["indices"], mb["log_probs"]):
        lp = np.asarray(lp, dtype=np.float64)
        train_old = np.asarray(data["old_log_probs"][i], dtype=np.float64)
        rollout = np.asarray(TRAIN["rollout_log_probs"][i], dtype=np.float64)
        old = rollout if uses_rollout else train_old
        adv = np.asarray(data["advantages"][i], dtype=np.float64)
        ratio = np.exp(lp - old)
        clipped = np.clip(ratio, 1 - data["eps_clip"], 1 + data["eps_clip_high"])
        loss = np.maximum(-ratio * adv, -clipped * adv)
        grad = np.where(-ratio * adv >= -clipped * adv, -ratio * adv, 0.0)
        w = np.ones_like(lp)
        if "--use-tis" in data["flags"]:
            w = np.clip(np.exp(train_old - rollout), data["tis_clip_low"], data["tis_clip"])
        losses.append(loss * w)
        grads.append(grad * w)
        weights.append(w)
    return losses, grads, weights


@pytest.mark.parametrize("case", sorted(DATA["loss"]))
def test_policy_loss_is_slimes_formula_on_rollwires_rows(case: str) -> None:
    """pg_loss = Σ_rows Σ_t mask·ℓ_t / rollout_mask_sum, ℓ the clipped PPO term (× the TIS weight
    clip(exp(old − rollout), low, high) with ``--use-tis``; against rollwire's log-probs as the
    old policy with ``--use-rollout-logprobs``), and slime's ``train_rollout_logprob_abs_diff``
    is measured against rollwire's log-probs."""
    data = DATA["loss"][case]
    scale = data["num_microbatches"][0] / data["global_batch_size"]
    for mb in data["micro_batches"]:
        losses, _, _ = _policy_terms(case, mb)
        pg, diff = 0.0, 0.0
        for i, loss, lp in zip(mb["indices"], losses, mb["log_probs"]):
            mask = np.asarray(TRAIN["loss_masks"][i], dtype=np.float64)
            denom = max(TRAIN["rollout_mask_sums"][i], 1)
            pg += float((loss * mask).sum() / denom)
            rollout = np.asarray(TRAIN["rollout_log_probs"][i])
            compared = lp if "--use-rollout-logprobs" in data["flags"] else data["old_log_probs"][i]
            diff += float((np.abs(np.asarray(compared) - rollout) * mask).sum() / denom)
        assert mb["log"]["pg_loss"] == pytest.approx(pg, rel=1e-4, abs=1e-5)
        assert mb["loss"] == pytest.approx(pg * scale, rel=1e-4, abs=1e-5)
        assert mb["log"]["train_rollout_logprob_abs_diff"] == pytest.approx(diff, rel=1e-4)


@pytest.mark.parametrize("case", sorted(DATA["loss"]))
def test_masked_tokens_carry_no_loss(case: str) -> None:
    """The gradient slime's loss puts on each response token: exactly 0 where rollwire's mask is 0
    (tool and user tokens, failed rows, placeholders), slime's formula elsewhere."""
    data = DATA["loss"][case]
    scale = data["num_microbatches"][0] / data["global_batch_size"]
    trained = 0
    for mb in data["micro_batches"]:
        _, grads, _ = _policy_terms(case, mb)
        for i, grad, got in zip(mb["indices"], grads, mb["dloss_dlogprob"]):
            mask = np.asarray(TRAIN["loss_masks"][i], dtype=np.float64)
            got = np.asarray(got)
            assert np.all(got[mask == 0] == 0.0), f"row {i} puts loss on a masked token"
            want = grad * mask / max(TRAIN["rollout_mask_sums"][i], 1) * scale
            assert got == pytest.approx(want, rel=1e-3, abs=1e-6)
            trained += int(np.count_nonzero(got))
    assert trained > 0


def test_tis_weights_are_clipped_ratios_to_rollwires_log_probs() -> None:
    """``vanilla_tis_function``: weight = clip(exp(old − rollout), tis_clip_low, tis_clip) per
    token, with rollout = rollwire's ``rollout_log_probs``; some weights clip at the top."""
    data = DATA["loss"]["tis"]
    old = np.concatenate([np.asarray(x, dtype=np.float64) for x in data["old_log_probs"]])
    rollout = np.concatenate([np.asarray(s["rollout_log_probs"]) for s in _flat()])
    ratio = np.exp(old - rollout)
    assert DATA["tis"]["tis"] == pytest.approx(ratio.tolist(), rel=1e-5)
    want = np.clip(ratio, data["tis_clip_low"], data["tis_clip"])
    assert DATA["tis"]["weights"] == pytest.approx(want.tolist(), rel=1e-5)
    assert (want == data["tis_clip"]).any() and (want < 1).any()
