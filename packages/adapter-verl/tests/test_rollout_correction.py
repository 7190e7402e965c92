"""verl 0.9.1's own rollout correction on rollwire's DataProto (issue 25.3).

The export carries what verl's correction reads: ``rollout_log_probs`` (the behaviour policy's
log-probs, captured by the gateway) and ``response_mask``. The batch is made deliberately stale:
the "trainer" log-probs are the behaviour log-probs shifted by a known amount per token, so every
IS ratio, truncation, IcePop zeroing, rejection and PPO ratio below is computed by hand and
compared with what verl's ``rollout_corr_helper`` and ``core_algos`` return.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

pytest.importorskip("verl")
torch = pytest.importorskip("torch")

from omegaconf import OmegaConf  # noqa: E402
from verl.trainer.config.algorithm import RolloutCorrectionConfig  # noqa: E402
from verl.trainer.ppo.core_algos import compute_policy_loss, get_policy_loss_fn  # noqa: E402
from verl.trainer.ppo.rollout_corr_helper import (  # noqa: E402
    apply_bypass_mode,
    compute_rollout_correction_and_add_to_batch,
)
from verl.workers.config.actor import ActorConfig, PolicyLossConfig  # noqa: E402

from rollwire.data.protocol import Group  # noqa: E402
from rollwire.testing import sample_batch  # noqa: E402
from rollwire.testing.samples import versioned_rollout  # noqa: E402
from rollwire_verl import grpo_advantages, step_advantages, to_dataproto  # noqa: E402

SHIFT = 0.3  # every trained token: log pi_train - log pi_rollout
FAR_UP = 1.5  # a few tokens far above (ratio 4.48 > 2: truncated / rejected)
FAR_DOWN = -1.2  # a few far below (ratio 0.30 < 0.5: IcePop zeroes, k1 rejects)


def _stale() -> tuple[Any, np.ndarray, np.ndarray]:
    """The exported batch, the per-token log-ratio applied, and the float mask."""
    batch = [*sample_batch(), Group(group_id="g2", rollouts=[versioned_rollout("v0")])]
    data = to_dataproto(batch, step_credit="discounted")
    mask = data.batch["response_mask"].numpy().astype(np.float32)
    delta = np.where(mask > 0, SHIFT, 0.0).astype(np.float32)
    rows, cols = np.nonzero(mask)
    delta[rows[0], cols[0]] = FAR_UP
    delta[rows[-1], cols[-1]] = FAR_DOWN
    delta[rows[len(rows) // 2], cols[len(rows) // 2]] = FAR_UP
    rollout = data.batch["rollout_log_probs"].numpy()
    # what a trainer recomputes: shifted where trained, arbitrary where masked (must not matter)
    noise = np.random.default_rng(0).normal(0, 5, mask.shape).astype(np.float32)
    old = np.where(mask > 0, rollout + delta, noise).astype(np.float32)
    data.batch["old_log_probs"] = torch.from_numpy(old)
    return data, delta, mask


def test_the_export_has_what_verl_correction_reads() -> None:
    data, _, mask = _stale()
    for key in ("rollout_log_probs", "response_mask", "old_log_probs"):
        assert data.batch[key].shape == data.batch["responses"].shape, key
    rollout = data.batch["rollout_log_probs"].numpy()
    assert (rollout[mask > 0] < 0).all() and (rollout[mask == 0] == 0).all()


def test_token_tis_weights_are_the_truncated_ratios() -> None:
    data, delta, mask = _stale()
    before = data.batch["response_mask"].clone()
    data, metrics = compute_rollout_correction_and_add_to_batch(
        data, RolloutCorrectionConfig.decoupled_token_is(threshold=2.0)
    )
    w = data.batch["rollout_is_weights"].numpy()
    expected = np.minimum(np.exp(delta), 2.0) * mask
    np.testing.assert_allclose(w, expected, rtol=1e-5)
    assert (w[mask > 0] != 1.0).all()  # a stale batch: no ratio is 1
    assert np.isclose(w[mask > 0].max(), 2.0) and (w[mask == 0] == 0).all()
    assert torch.equal(data.batch["response_mask"], before)  # TIS alone rejects nothing
    assert metrics["rollout_corr/rollout_is_max"] == pytest.approx(2.0)


def test_sequence_is_is_the_truncated_product_per_row() -> None:
    data, delta, mask = _stale()
    data, _ = compute_rollout_correction_and_add_to_batch(
        data, RolloutCorrectionConfig.decoupled_seq_is(threshold=5.0)
    )
    w = data.batch["rollout_is_weights"].numpy()
    per_row = np.minimum(np.exp(np.clip((delta * mask).sum(axis=1), -20, 20)), 5.0)
    np.testing.assert_allclose(w, per_row[:, None] * mask, rtol=1e-5)
    trained_rows = mask.sum(axis=1) > 0
    assert (per_row[trained_rows] != 1.0).all()


def test_icepop_zeroes_ratios_outside_its_band() -> None:
    data, delta, mask = _stale()
    data, metrics = compute_rollout_correction_and_add_to_batch(
        data, RolloutCorrectionConfig.decoupled_token_icepop(threshold=2.0, threshold_lower=0.5)
    )
    w = data.batch["rollout_is_weights"].numpy()
    ratio = np.exp(delta)
    keep = (ratio >= 0.5) & (ratio <= 2.0) & (mask > 0)
    np.testing.assert_allclose(w, np.where(keep, ratio, 0.0), rtol=1e-5)
    assert int(((mask > 0) & ~keep).sum()) == 3  # the two far-up tokens and the far-down one
    assert metrics["rollout_corr/rollout_is_oob_ratio"] == pytest.approx(3 / mask.sum())


def test_token_rejection_masks_the_far_tokens_only() -> None:
    data, delta, mask = _stale()
    cfg = RolloutCorrectionConfig(
        rollout_is=None, rollout_rs="token_k1", rollout_rs_threshold="0.5_2.0"
    )
    data, _ = compute_rollout_correction_and_add_to_batch(data, cfg)
    kept = data.batch["response_mask"].numpy()
    ratio = np.exp(delta)
    np.testing.assert_array_equal(kept, ((ratio >= 0.5) & (ratio <= 2.0) & (mask > 0)).astype(int))
    assert "rollout_is_weights" not in data.batch


def _actor(**correction: Any) -> ActorConfig:
    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=0.2,
        policy_loss=PolicyLossConfig(
            loss_mode="bypass_mode", rollout_correction=RolloutCorrectionConfig(**correction)
        ),
    )


def _ppo_by_hand(ratio: np.ndarray, adv: np.ndarray, mask: np.ndarray, clip: float) -> float:
    clipped = np.maximum(-adv * ratio, -adv * np.clip(ratio, 1 - clip, 1 + clip))
    dual = np.minimum(-adv * 3.0, clipped)
    losses = np.where(adv < 0, dual, clipped)
    return float((losses * mask).sum() / mask.sum())


def test_decoupled_ppo_loss_with_the_is_weights() -> None:
    """verl's vanilla PPO loss, weighted by the truncated IS weights of the stale batch."""
    data, _, mask = _stale()
    data, _ = compute_rollout_correction_and_add_to_batch(
        data, RolloutCorrectionConfig.decoupled_token_is(threshold=2.0)
    )
    adv, _ = grpo_advantages(data)
    old = data.batch["old_log_probs"]
    log_prob = old + 0.1 * data.batch["response_mask"]  # one optimiser step later
    loss_fn = get_policy_loss_fn("vanilla")
    weights = data.batch["rollout_is_weights"]
    loss, metrics = loss_fn(
        old_log_prob=old,
        log_prob=log_prob,
        advantages=adv,
        response_mask=data.batch["response_mask"],
        loss_agg_mode="token-mean",
        config=_actor(),
        rollout_is_weights=weights,
    )
    a = adv.numpy()
    ratio = np.full(mask.shape, math.exp(0.1), np.float32)
    clipped = np.maximum(-a * ratio, -a * np.clip(ratio, 0.8, 1.2))
    expected = np.where(a < 0, np.minimum(-a * 3.0, clipped), clipped) * weights.numpy() * mask
    assert float(loss) == pytest.approx(float(expected.sum() / mask.sum()), rel=1e-5)
    assert metrics["actor/ppo_kl"] == pytest.approx(-0.1, rel=1e-4)


def test_bypass_mode_ratios_are_against_the_captured_log_probs() -> None:
    """Bypass mode: old_log_probs := rollout_log_probs, so the PPO ratio is pi_train / pi_rollout."""
    data, delta, mask = _stale()
    cfg = RolloutCorrectionConfig(rollout_is="token", rollout_is_threshold=2.0, bypass_mode=True)
    # the trainer's actor_rollout_ref.actor.policy_loss, as verl's ray trainer passes it
    policy_loss = OmegaConf.create({"loss_mode": "vanilla"})
    apply_bypass_mode(data, cfg, policy_loss)
    assert torch.equal(data.batch["old_log_probs"], data.batch["rollout_log_probs"])
    assert policy_loss.loss_mode == "bypass_mode"
    assert policy_loss.rollout_correction.rollout_is == "token"
    actor = _actor(rollout_is="token", rollout_is_threshold=2.0, loss_type="ppo_clip")
    step_advantages(data)
    log_prob = data.batch["rollout_log_probs"] + torch.from_numpy(delta)
    resp = data.batch["response_mask"]
    adv = data.batch["advantages"]
    loss, metrics = get_policy_loss_fn("bypass_mode")(
        old_log_prob=data.batch["old_log_probs"],
        log_prob=log_prob,
        advantages=adv,
        response_mask=resp,
        loss_agg_mode="token-mean",
        config=actor,
    )
    ratio = np.exp(delta)
    assert float(loss) == pytest.approx(_ppo_by_hand(ratio, adv.numpy(), mask, 0.2), rel=1e-5)
    # every trained token moved by >= 0.3 in log space: all outside 1 +- 0.2, so the ones with a
    # positive advantage are clipped (verl counts clipping where the clipped loss is larger)
    a = adv.numpy()
    frac = float(((-a * np.clip(ratio, 0.8, 1.2) > -a * ratio) & (mask > 0)).sum() / mask.sum())
    assert metrics["actor/pg_clipfrac"] == pytest.approx(frac, abs=1e-6)
    assert frac > 0


def test_bypass_reinforce_uses_explicit_truncated_weights() -> None:
    data, delta, mask = _stale()
    actor = _actor(rollout_is="token", rollout_is_threshold=2.0, loss_type="reinforce")
    step_advantages(data)
    rollout = data.batch["rollout_log_probs"]
    log_prob = rollout + torch.from_numpy(delta)
    adv = data.batch["advantages"]
    loss, _ = get_policy_loss_fn("bypass_mode")(
        old_log_prob=rollout,
        log_prob=log_prob,
        advantages=adv,
        response_mask=data.batch["response_mask"],
        loss_agg_mode="token-mean",
        config=actor,
    )
    w = np.minimum(np.exp(delta), 2.0) * mask
    expected = (-adv.numpy() * log_prob.numpy() * w * mask).sum() / mask.sum()
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)


def test_plain_compute_policy_loss_sees_the_staleness() -> None:
    data, delta, mask = _stale()
    adv, _ = grpo_advantages(data)
    rollout = data.batch["rollout_log_probs"]
    pg_loss, clipfrac, ppo_kl, _ = compute_policy_loss(
        old_log_prob=rollout,
        log_prob=rollout + torch.from_numpy(delta),
        advantages=adv,
        response_mask=data.batch["response_mask"],
        cliprange=0.2,
    )
    assert float(ppo_kl) == pytest.approx(float(-(delta * mask).sum() / mask.sum()), rel=1e-5)
    assert float(pg_loss) == pytest.approx(
        _ppo_by_hand(np.exp(delta), adv.numpy(), mask, 0.2), rel=1e-5
    )
    assert float(clipfrac) > 0
