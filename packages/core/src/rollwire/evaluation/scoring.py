"""From the groups of an evaluation run to per-setting figures: mean reward, success, pass@k."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from rollwire.data.protocol import Group
from rollwire.evaluation.estimators import (
    Estimate,
    bootstrap_interval,
    pass_at_k,
    wilson_interval,
)

__all__ = ["EvalResult", "EvalSetting", "SettingResult", "score_setting"]

#: flag put on every call of an evaluation rollout: never to be trained on
EVAL_FLAG = "eval"


@dataclass(frozen=True)
class EvalSetting:
    """One way of sampling to evaluate at, e.g. the serving settings (``temperature=1.0``)."""

    name: str
    sampling: Mapping[str, Any]

    @classmethod
    def from_sampling(cls, sampling: Mapping[str, Any]) -> EvalSetting:
        """A setting named after its parameters (``temperature=0.0``)."""
        name = ", ".join(f"{k}={v}" for k, v in sorted(sampling.items())) or "defaults"
        return cls(name, dict(sampling))


@dataclass
class SettingResult:
    """The figures of one setting over every task."""

    setting: EvalSetting
    tasks: int
    attempts: int
    completed: int
    failed: int
    mean_reward: Estimate
    success_rate: Estimate
    pass_at_k: dict[int, Estimate]
    per_task: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "setting": self.setting.name,
            "sampling": dict(self.setting.sampling),
            "tasks": self.tasks,
            "attempts": self.attempts,
            "completed": self.completed,
            "failed": self.failed,
            "mean_reward": self.mean_reward.as_dict(),
            "success_rate": self.success_rate.as_dict(),
            "pass_at_k": {str(k): e.as_dict() for k, e in self.pass_at_k.items()},
            "per_task": self.per_task,
        }


@dataclass
class EvalResult:
    """Every setting's figures, comparable side by side."""

    settings: list[SettingResult]
    k: int
    ks: list[int]
    success_threshold: float
    confidence: float

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (what ``rollwire eval --out`` writes)."""
        return {
            "k": self.k,
            "ks": self.ks,
            "success_threshold": self.success_threshold,
            "confidence": self.confidence,
            "settings": [s.as_dict() for s in self.settings],
        }

    def write_json(self, path: str | Path) -> Path:
        """Write :meth:`as_dict` to ``path``."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(orjson.dumps(self.as_dict(), option=orjson.OPT_INDENT_2))
        return path


def score_setting(
    setting: EvalSetting,
    groups: Sequence[Group],
    *,
    success_threshold: float,
    ks: Sequence[int],
    failure_reward: float = 0.0,
    confidence: float = 0.95,
) -> SettingResult:
    """Figures of one setting. A rollout that failed counts as an attempt that did not succeed,
    with ``failure_reward`` in the mean; pass@k is left out for a ``k`` above the attempts."""
    if not groups:
        raise ValueError(f"setting {setting.name!r}: no task groups to score")
    per_task: list[dict[str, Any]] = []
    means: list[float] = []
    attempts = successes = completed = 0
    per_k: dict[int, list[float]] = {k: [] for k in ks}
    n_min = min(len(g.rollouts) for g in groups)
    for g in groups:
        rewards = [r.reward if r.reward is not None else failure_reward for r in g.rollouts]
        ok = [r.status == "completed" and r.reward is not None for r in g.rollouts]
        wins = sum(o and rw >= success_threshold for o, rw in zip(ok, rewards))
        n = len(g.rollouts)
        if n == 0:
            raise ValueError(f"setting {setting.name!r}: task {g.task_id!r} has no rollouts")
        attempts += n
        successes += wins
        completed += sum(ok)
        means.append(float(np.mean(rewards)))
        task: dict[str, Any] = {"task_id": g.task_id, "n": n, "successes": wins}
        task["mean_reward"] = means[-1]
        for k in ks:
            if k <= n_min:
                v = pass_at_k(n, wins, k)
                per_k[k].append(v)
                task[f"pass@{k}"] = v
        per_task.append(task)
    return SettingResult(
        setting=setting,
        tasks=len(groups),
        attempts=attempts,
        completed=completed,
        failed=attempts - completed,
        mean_reward=bootstrap_interval(means, confidence=confidence),
        success_rate=wilson_interval(successes, attempts, confidence),
        pass_at_k={k: bootstrap_interval(v, confidence=confidence) for k, v in per_k.items() if v},
        per_task=per_task,
    )
