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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
from transformers import TrainerCallback

from rollwire_trl.rollout import RolloutBatch
from rollwire_trl.sync import SyncRecord

__all__ = ["EvalPoint", "StepRecord", "StepReporter", "batch_figures", "read_steps"]

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


@dataclass
class EvalPoint:
    """Held-out evaluation after ``step`` optimizer steps (0 = the baseline before step 1)."""

    step: int
    pass_at_1: float
    pass_at_1_low: float
    pass_at_1_high: float
    mean_reward: float
    tasks: int
    attempts: int
    seconds: float
    pass_at_k: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_result(cls, step: int, result: Any, seconds: float) -> EvalPoint:
        """From an :class:`~rollwire.evaluation.EvalResult` of one setting."""
        s = result.settings[0]
        rate = s.success_rate
        return cls(
            step=step,
            pass_at_1=rate.value,
            pass_at_1_low=rate.low,
            pass_at_1_high=rate.high,
            mean_reward=s.mean_reward.value,
            tasks=s.tasks,
            attempts=s.attempts,
            seconds=seconds,
            pass_at_k={str(k): e.value for k, e in s.pass_at_k.items()},
        )


@dataclass
class StepRecord:
    """One optimizer step: rollouts, TRL's statistics, timing."""

    step: int
    reward_mean: float
    reward_std: float
    pass_rate: float
    rollouts: int
    failed: int
    sampled_tokens: int
    rollout_s: float
    train_s: float
    sync_s: float
    tokens_per_s: float
    #: of ``rollout_s``, the time the step waited for its rollouts (less when they ran ahead)
    rollout_wait_s: float = 0.0
    #: the whole step, from TRL's step start to its end
    wall_s: float = 0.0
    forked: int = 0
    placeholders: int = 0
    #: the policy versions the gateway stamped on this step's calls (the previous step's)
    policy_versions: list[str] = field(default_factory=list)
    trl: dict[str, float] = field(default_factory=dict)
    #: what the sync hook returned, when numbers (WeightSync: the time split and the probe's
    #: server-vs-trainer log-prob difference before and after the push)
    sync: dict[str, float] = field(default_factory=dict)
    eval: EvalPoint | None = None

    def flat(self) -> dict[str, float]:
        """Numbers for a metrics sink (``train/...``, ``eval/...``)."""
        out = {f"train/{k}": float(v) for k, v in asdict(self).items() if _number(v)}
        out.update({f"train/{k}": v for k, v in self.trl.items()})
        out.update({k if "/" in k else f"sync/{k}": v for k, v in self.sync.items()})
        if self.eval is not None:
            out["eval/pass@1"] = self.eval.pass_at_1
            out["eval/mean_reward"] = self.eval.mean_reward
        out.pop("train/step", None)
        return out


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _versions(batch: RolloutBatch) -> list[str]:
    found = {c.policy_version for r in batch.rollouts for c in r.calls}
    return sorted(v for v in found if v is not None)


def _sync_figures(record: SyncRecord | None) -> dict[str, float]:
    result = record.result if record is not None else None
    if not isinstance(result, Mapping):
        return {}
    return {str(k): float(v) for k, v in result.items() if _number(v)}


def batch_figures(batch: RolloutBatch, success_threshold: float = 1.0) -> dict[str, float]:
    """Reward mean/std, pass rate and sampled tokens of one rollout batch."""
    rollouts = batch.rollouts
    rewards = [r.reward if r.reward is not None else 0.0 for r in rollouts]
    n = max(1, len(rewards))
    mean = sum(rewards) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in rewards) / n)
    solved = sum(
        r.status == "completed" and x >= success_threshold for r, x in zip(rollouts, rewards)
    )
    return {
        "reward_mean": mean,
        "reward_std": std,
        "pass_rate": solved / n,
        "rollouts": float(len(rollouts)),
        "failed": float(sum(r.status != "completed" for r in rollouts)),
        "sampled_tokens": float(batch.report.trainable_tokens),
    }


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


def write_step(path: Path, record: StepRecord) -> None:
    """Append ``record`` to a ``steps.jsonl``."""
    with path.open("ab") as f:
        f.write(orjson.dumps(asdict(record), option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")


def read_steps(path: Path, *, upto: int | None = None) -> list[dict[str, Any]]:
    """The records of a ``steps.jsonl`` (those of steps ``<= upto`` when given)."""
    if not path.exists():
        return []
    out = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    return [r for r in out if upto is None or int(r["step"]) <= upto]
