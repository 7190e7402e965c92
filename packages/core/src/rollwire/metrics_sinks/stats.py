"""Per-step statistics of a batch of rollouts, flat ``{name: float}`` for any metrics sink."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rollwire.data.protocol import Group, Rollout, Row, group_rollouts
from rollwire.data.trajectory import TokenizerLike, TrajectoryBuilder
from rollwire.report.summary import summarize

__all__ = ["step_metrics"]


def step_metrics(
    batch: Iterable[Group | Rollout],
    *,
    rows_by_rollout: Mapping[str, Sequence[Row]] | None = None,
    tokenizer: TokenizerLike | None = None,
    wall_s: float | None = None,
    prefix: str = "",
) -> dict[str, float]:
    """Reward mean/std, solve rate, turns, tokens, forks by class, failures by kind, calls/s.

    ``rows_by_rollout`` are the rows the trainer gets (built here in merge mode when not given);
    ``wall_s`` the seconds the batch took (for calls/s). Keys are ``group/name``, after
    ``prefix``; a figure that does not exist for this batch (no rewards) is left out.
    """
    groups = group_rollouts(batch)
    if rows_by_rollout is None:
        builder = TrajectoryBuilder(tokenizer=tokenizer)
        rows_by_rollout = {r.rollout_id: builder.build(r) for g in groups for r in g.rollouts}
    s = summarize(groups, rows_by_rollout)
    d = s.as_dict()
    out: dict[str, Any] = {
        "rollouts/total": s.rollouts,
        "rollouts/groups": s.groups,
        "reward/mean": d["reward_mean"],
        "reward/std": d["reward_std"],
        "turns/mean": d["turns_mean"],
        "rows/per_rollout": d["rows_mean"],
        "tokens/response": s.response_tokens,
        "tokens/trainable": s.trainable_tokens,
        "tokens/trainable_share": d["trainable_share"],
        "calls/total": s.calls,
        "calls/failed": s.failed_calls,
        "calls/off_policy": s.off_policy_calls,
        "calls/non_trainable": s.non_trainable_calls,
        "calls/stale": s.stale_calls,
        "experts/coverage": s.experts_coverage,
        "forks/total": sum(s.forks.values()),
        "forks/tokens_lost": sum(s.fork_tokens_lost.values()),
    }
    rollouts = [r for g in groups for r in g.rollouts]
    solved = [r.metrics["solved"] for r in rollouts if "solved" in r.metrics]
    if solved:
        out["solve_rate"] = sum(float(x) > 0 for x in solved) / len(solved)
    if rollouts:
        out["rollouts/completed_share"] = s.statuses.get("completed", 0) / len(rollouts)
    for kind, n in s.forks.items():
        out[f"forks/{kind}"] = n
    for status, n in s.statuses.items():
        if status != "completed":
            out[f"failures/{status}"] = n
    for kind, n in s.errors.items():
        out[f"failures/error/{kind}"] = n
    if wall_s is not None and wall_s > 0:
        out["calls/per_s"] = s.calls / wall_s
    return {
        f"{prefix}{k}": float(v)
        for k, v in out.items()
        if v is not None and math.isfinite(float(v))
    }
