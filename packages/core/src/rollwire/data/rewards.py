"""Rollout-level reward normalisation: a rollout that forked into several rows counts once.

GRPO-style trainers normalise rewards within a task group. When rows are the unit, a rollout that
forked into 3 rows would weigh 3× in its group's mean and std; these helpers compute statistics
over rollouts and then hand every row of a rollout its rollout's advantage. A per-turn reward
list (the ``step_reward/<i>`` metrics) is laid onto the calls it belongs to by
:func:`attach_step_rewards`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from rollwire.data.foreign import STEP_REWARDS_DROPPED, step_rewards_of
from rollwire.data.protocol import Group, Rollout, group_rollouts

__all__ = ["attach_step_rewards", "group_advantages", "normalize_row_rewards"]


def normalize_row_rewards(
    rewards: Sequence[float],
    group_keys: Sequence[object],
    rollout_keys: Sequence[object],
    *,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> np.ndarray:
    """Per-row advantages: (reward - group mean) / (group std + eps) over *rollouts*.

    ``rewards[i]`` is row i's reward (equal for the rows of one rollout, else a ValueError),
    ``group_keys[i]`` its task group and ``rollout_keys[i]`` its rollout. A group whose rollouts
    all scored the same gets 0.
    """
    n = len(rewards)
    if not (len(group_keys) == len(rollout_keys) == n):
        raise ValueError(
            f"rewards ({n}), group_keys ({len(group_keys)}) and rollout_keys "
            f"({len(rollout_keys)}) must have one entry per row"
        )
    values = np.asarray(rewards, dtype=np.float64)
    out = np.zeros(n, dtype=np.float32)
    by_group: dict[object, dict[object, float]] = {}
    for g, r, v in zip(group_keys, rollout_keys, values):
        if not math.isfinite(float(v)):
            raise ValueError(f"row reward {v!r} of rollout {r!r} is not finite")
        per_rollout = by_group.setdefault(g, {})
        first = per_rollout.setdefault(r, float(v))
        if first != float(v):
            raise ValueError(
                f"rows of rollout {r!r} carry different rewards ({first!r} and {float(v)!r}); "
                "every row of a rollout must carry the rollout reward"
            )
    stats: dict[object, tuple[float, float]] = {}
    for g, per_rollout in by_group.items():
        arr = np.fromiter(per_rollout.values(), dtype=np.float64)
        # torch.std in GRPO implementations is the unbiased estimator; keep the same here.
        std = float(arr.std(ddof=1)) if arr.size > 1 else 0.0
        stats[g] = (float(arr.mean()), std)
    for i, (g, v) in enumerate(zip(group_keys, values)):
        mean, std = stats[g]
        adv = float(v) - mean
        if scale_by_std:
            adv = adv / (std + eps) if std > 0 else 0.0
        out[i] = adv
    return out


def group_advantages(
    batch: Iterable[Group | Rollout],
    *,
    scale_by_std: bool = True,
    failure_reward: float | None = None,
    eps: float = 1e-6,
) -> dict[str, float]:
    """Advantage per rollout id, normalised within its group (rollouts, not rows, are counted).

    A rollout without a reward takes ``failure_reward``; if that is None it is left out.
    """
    out: dict[str, float] = {}
    for group in group_rollouts(batch):
        ids: list[str] = []
        vals: list[float] = []
        for r in group.rollouts:
            reward = r.reward if r.reward is not None else failure_reward
            if reward is None:
                continue
            ids.append(r.rollout_id)
            vals.append(float(reward))
        adv = normalize_row_rewards(
            vals, [group.group_id] * len(vals), ids, scale_by_std=scale_by_std, eps=eps
        )
        out.update(zip(ids, (float(a) for a in adv)))
    return out


def attach_step_rewards(rollout: Rollout) -> Rollout:
    """The rollout with each step reward on the call it belongs to (a copy; stored calls are
    never rewritten).

    Element ``i`` of the per-turn list (metric ``step_reward/<i>``) goes to the ``i``-th
    trainable call of the session, in call order; calls that are not trainable (failed, retried,
    the agent hung up) get none. A call past the end of the list keeps ``step_reward=None``;
    elements past the last trainable call are dropped and counted in the metric
    ``step_rewards_dropped``. A rollout without step metrics is returned as it is.
    """
    steps = step_rewards_of(rollout.metrics)
    if not steps:
        return rollout
    trainable = sorted((c for c in rollout.calls if c.trainable), key=lambda c: c.index)
    turn_of = {id(c): i for i, c in enumerate(trainable)}
    calls = [
        c.model_copy(update={"step_reward": steps.get(turn_of.get(id(c), -1))})
        for c in rollout.calls
    ]
    metrics = {k: v for k, v in rollout.metrics.items() if k != STEP_REWARDS_DROPPED}
    dropped = sum(1 for i in steps if i >= len(trainable))
    if dropped:
        metrics[STEP_REWARDS_DROPPED] = float(dropped)
    return rollout.model_copy(update={"calls": calls, "metrics": metrics})
