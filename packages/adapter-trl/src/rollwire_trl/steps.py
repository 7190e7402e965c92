"""What ``rollwire train`` reports about each step: one record per optimizer step, to the terminal,
``steps.jsonl`` and a metrics sink; held-out evaluations every N steps.

A step's time splits into **rollout** (the rollout_func call: agents, gateway, servers),
**sync** (saving the policy and pushing it) and **train** (the rest: TRL's scoring forward
passes, the backward pass and the optimizer).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from transformers import TrainerCallback

from rollwire.trainer.steps import EvalPoint, StepRecord, policy_versions, read_steps, write_step
from rollwire.trainer.steps import batch_figures as _figures
from rollwire_trl.rollout import RolloutBatch
from rollwire_trl.sync import SyncRecord

__all__ = [
    "EvalPoint",
    "StepRecord",
    "StepReporter",
    "batch_figures",
    "read_steps",
    "write_step",
]

#: TRL log keys kept in a step record, under rollwire's names
_TRL_KEYS = {
    "loss": "loss",
    "grad_norm": "grad_norm",
    "entropy": "entropy",
    "kl": "kl_ref",
    "rollwire/kl_behaviour": "kl_behaviour",
    "clip_ratio/region_mean": "clip_ratio",
    "clip_ratio/low_mean": "clip_ratio_low",
    "clip_ratio/high_mean": "clip_ratio_high",
    "sampling/importance_sampling_ratio/min": "is_ratio_min",
    "sampling/importance_sampling_ratio/mean": "is_ratio_mean",
    "sampling/importance_sampling_ratio/max": "is_ratio_max",
    "sampling/sampling_logp_difference/mean": "logp_diff_mean",
    "sampling/sampling_logp_difference/max": "logp_diff_max",
    "frac_reward_zero_std": "frac_reward_zero_std",
    "learning_rate": "learning_rate",
}


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _versions(batch: RolloutBatch) -> list[str]:
    return policy_versions(batch.rollouts)


def _sync_figures(record: SyncRecord | None) -> dict[str, float]:
    result = record.result if record is not None else None
    if not isinstance(result, Mapping):
        return {}
    return {str(k): float(v) for k, v in result.items() if _number(v)}


def batch_figures(batch: RolloutBatch, success_threshold: float = 1.0) -> dict[str, float]:
    """Reward mean/std, pass rate and sampled tokens of one rollout batch."""
    return _figures(batch.rollouts, batch.report.trainable_tokens, success_threshold)


class StepReporter(TrainerCallback):  # type: ignore[misc]
    """Builds a :class:`StepRecord` per optimizer step and hands it to ``emit``.

    Wire :meth:`on_batch` as the RolloutFunction's ``on_batch`` and :meth:`on_sync` as the
    WeightSyncCallback's ``on_sync``; ``evaluate(step)`` (an :class:`EvalPoint`) runs every
    ``eval_every`` steps, after the step's weights are synced.
    """

    def __init__(
        self,
        emit: Callable[[StepRecord], None],
        *,
        evaluate: Callable[[int], EvalPoint] | None = None,
        eval_every: int = 0,
        success_threshold: float = 1.0,
    ) -> None:
        self.emit = emit
        self.evaluate = evaluate
        self.eval_every = eval_every
        self.success_threshold = success_threshold
        self._batch: RolloutBatch | None = None
        self._sync: SyncRecord | None = None
        self._started = 0.0
        self._pending: StepRecord | None = None

    def on_batch(self, batch: RolloutBatch) -> None:
        self._batch = batch

    def on_sync(self, record: SyncRecord) -> None:
        self._sync = record

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._started = time.perf_counter()
        self._batch, self._sync = None, None
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        wall = time.perf_counter() - self._started
        rollout_s = self._batch.seconds if self._batch is not None else 0.0
        waited = self._batch.waited if self._batch is not None else None
        waited_s = rollout_s if waited is None else waited
        sync_s = (self._sync.save_seconds + self._sync.sync_seconds) if self._sync else 0.0
        figures = batch_figures(self._batch, self.success_threshold) if self._batch else {}
        record = StepRecord(
            step=int(state.global_step),
            reward_mean=figures.get("reward_mean", math.nan),
            reward_std=figures.get("reward_std", math.nan),
            pass_rate=figures.get("pass_rate", math.nan),
            rollouts=int(figures.get("rollouts", 0)),
            failed=int(figures.get("failed", 0)),
            sampled_tokens=int(figures.get("sampled_tokens", 0)),
            rollout_s=rollout_s,
            train_s=max(0.0, wall - waited_s - sync_s),
            rollout_wait_s=waited_s,
            wall_s=wall,
            sync_s=sync_s,
            tokens_per_s=figures.get("sampled_tokens", 0) / rollout_s if rollout_s else 0.0,
            forked=self._batch.report.forked if self._batch else 0,
            placeholders=self._batch.report.placeholders if self._batch else 0,
            policy_versions=_versions(self._batch) if self._batch else [],
            sync=_sync_figures(self._sync),
        )
        if self.evaluate is not None and self.eval_every and record.step % self.eval_every == 0:
            record.eval = self.evaluate(record.step)
        self._pending = record
        return control

    def on_log(
        self,
        args: Any,
        state: Any,
        control: Any,
        logs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        record, self._pending = self._pending, None
        if record is None or logs is None or "loss" not in logs:
            if record is not None:  # not a training log: keep waiting for this step's
                self._pending = record
            return control
        record.trl = {name: float(logs[key]) for key, name in _TRL_KEYS.items() if key in logs}
        self.emit(record)
        return control
