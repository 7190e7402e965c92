"""The numbers at the top of a report: what a batch of rollouts would train, and what it lost.

Pure functions over rollouts and their rows; the same figures feed the HTML report, the terminal
summary of ``rollwire run`` and the metrics sinks.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rollwire.data.protocol import Group, Rollout, Row
from rollwire.data.rewards import group_advantages
from rollwire.data.tool_health import ToolHealth

__all__ = ["DriftEntry", "GroupSummary", "Summary", "drift_report", "summarize"]

#: What to do about each fork class, shown next to the drift report.
FORK_ADVICE: dict[str, str] = {
    "template": "the chat template re-rendered control tokens: run `rollwire doctor` on this "
    "model's template, or capture with tokens mode",
    "retokenized": "the history was re-tokenized differently (tool-call JSON re-serialized?): "
    "tokens mode keeps the sampled ids",
    "think_stripped": "reasoning was removed from the history: tokens mode, or keep <think> blocks "
    "in the template's history",
    "truncated": "the agent cut or compacted its history: expected for sliding windows; each cut "
    "starts a new row",
    "other": "the history was edited: `rollwire doctor` shows where",
    "unknown": "rows were built without the model's tokenizer, so the fork could not be classified",
}


@dataclass
class DriftEntry:
    """One fork class: how often it happened and the trainable tokens it cost."""

    kind: str
    count: int
    tokens_lost: int
    rollouts: int
    advice: str


@dataclass
class GroupSummary:
    """A task group: each rollout's reward and the GRPO advantage it would get."""

    group_id: str
    task_id: str | None
    rollout_ids: list[str]
    rewards: list[float | None]
    advantages: list[float | None]
    statuses: list[str]

    @property
    def reward_mean(self) -> float:
        """Mean of the rewards present (NaN when none is)."""
        vals = [r for r in self.rewards if r is not None]
        return sum(vals) / len(vals) if vals else math.nan

    @property
    def reward_std(self) -> float:
        """Unbiased std of the rewards present (0 for fewer than two)."""
        vals = [r for r in self.rewards if r is not None]
        return float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0


@dataclass
class Summary:
    """Figures of a batch of rollouts (see :func:`summarize`)."""

    rollouts: int = 0
    groups: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    rewards: list[float] = field(default_factory=list)
    reward_mean: float = math.nan
    reward_std: float = math.nan
    calls: int = 0
    rows: int = 0
    turns_per_rollout: list[int] = field(default_factory=list)
    rows_per_rollout: list[int] = field(default_factory=list)
    forks: dict[str, int] = field(default_factory=dict)
    fork_tokens_lost: dict[str, int] = field(default_factory=dict)
    response_tokens: int = 0
    trainable_tokens: int = 0
    failed_calls: int = 0
    non_trainable_calls: int = 0
    off_policy_calls: int = 0
    #: calls sampled beyond their session's ``max_staleness`` (flagged ``stale``, not trained)
    stale_calls: int = 0
    flags: dict[str, int] = field(default_factory=dict)
    calls_with_experts: int = 0
    rows_with_experts: int = 0
    policy_versions: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    #: tool calls parsed by the server vs tool-call text it left in the answer
    tools: ToolHealth = field(default_factory=ToolHealth)
    group_summaries: list[GroupSummary] = field(default_factory=list)

    @property
    def trainable_share(self) -> float:
        """Trained tokens over all response-region tokens (NaN for an empty batch)."""
        return self.trainable_tokens / self.response_tokens if self.response_tokens else math.nan

    @property
    def experts_coverage(self) -> float:
        """Share of successful calls that carry routed experts."""
        ok = self.calls - self.failed_calls
        return self.calls_with_experts / ok if ok else 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready figures (also what the metrics sinks log)."""
        n = max(1, self.rollouts)
        return {
            "rollouts": self.rollouts,
            "groups": self.groups,
            "statuses": dict(self.statuses),
            "reward_mean": _finite(self.reward_mean),
            "reward_std": _finite(self.reward_std),
            "calls": self.calls,
            "rows": self.rows,
            "turns_mean": sum(self.turns_per_rollout) / n,
            "rows_mean": sum(self.rows_per_rollout) / n,
            "forks": dict(self.forks),
            "fork_tokens_lost": dict(self.fork_tokens_lost),
            "response_tokens": self.response_tokens,
            "trainable_tokens": self.trainable_tokens,
            "trainable_share": _finite(self.trainable_share),
            "failed_calls": self.failed_calls,
            "non_trainable_calls": self.non_trainable_calls,
            "off_policy_calls": self.off_policy_calls,
            "stale_calls": self.stale_calls,
            "flags": dict(self.flags),
            "calls_with_experts": self.calls_with_experts,
            "rows_with_experts": self.rows_with_experts,
            "experts_coverage": self.experts_coverage,
            "policy_versions": dict(self.policy_versions),
            "errors": dict(self.errors),
            "tools": self.tools.as_dict(),
        }


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _error_kind(error: str | None) -> str:
    if not error:
        return "unknown"
    head = error.split(":", 1)[0].strip()
    return head if head and len(head) <= 40 and " " not in head else "other"


def summarize(
    groups: Sequence[Group],
    rows_by_rollout: Mapping[str, Sequence[Row]],
    *,
    failure_reward: float | None = None,
) -> Summary:
    """Figures of ``groups`` given each rollout's rows (``TrajectoryBuilder`` output)."""
    s = Summary(groups=len(groups))
    statuses: Counter[str] = Counter()
    forks: Counter[str] = Counter()
    lost: Counter[str] = Counter()
    flags: Counter[str] = Counter()
    versions: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    advantages = group_advantages(groups, failure_reward=failure_reward)
    for group in groups:
        for r in group.rollouts:
            _count_rollout(
                s, r, rows_by_rollout.get(r.rollout_id, ()), forks, lost, flags, versions
            )
            statuses[r.status] += 1
            if r.status != "completed":
                errors[_error_kind(r.error)] += 1
        s.group_summaries.append(
            GroupSummary(
                group_id=group.group_id,
                task_id=group.task_id,
                rollout_ids=[r.rollout_id for r in group.rollouts],
                rewards=[r.reward for r in group.rollouts],
                advantages=[advantages.get(r.rollout_id) for r in group.rollouts],
                statuses=[r.status for r in group.rollouts],
            )
        )
    s.statuses, s.forks, s.fork_tokens_lost = dict(statuses), dict(forks), dict(lost)
    s.flags, s.policy_versions, s.errors = dict(flags), dict(versions), dict(errors)
    if s.rewards:
        s.reward_mean = float(np.mean(s.rewards))
        s.reward_std = float(np.std(s.rewards))
    return s


def _count_rollout(
    s: Summary,
    r: Rollout,
    rows: Sequence[Row],
    forks: Counter[str],
    lost: Counter[str],
    flags: Counter[str],
    versions: Counter[str],
) -> None:
    s.rollouts += 1
    if r.reward is not None:
        s.rewards.append(float(r.reward))
    s.calls += len(r.calls)
    s.turns_per_rollout.append(len(r.calls))
    s.rows_per_rollout.append(len(rows))
    s.rows += len(rows)
    for call in r.calls:
        if call.status != "ok":
            s.failed_calls += 1
            continue
        s.non_trainable_calls += not call.trainable
        s.off_policy_calls += call.off_policy
        s.stale_calls += "stale" in call.flags
        s.calls_with_experts += call.routed_experts is not None
        s.tools.add(call)
        flags.update(call.flags)
        if call.policy_version is not None:
            versions[call.policy_version] += 1
    for row in rows:
        s.response_tokens += int(row.input_ids.shape[0] - row.prompt_len)
        s.trainable_tokens += int(row.loss_mask.sum())
        s.rows_with_experts += row.routed_experts is not None
        if row.fork is not None:
            forks[row.fork.kind] += 1
            lost[row.fork.kind] += row.fork.tokens_lost


def drift_report(
    groups: Sequence[Group], rows_by_rollout: Mapping[str, Sequence[Row]]
) -> list[DriftEntry]:
    """Per fork class: count, trainable tokens lost and rollouts touched, most costly first."""
    count: Counter[str] = Counter()
    lost: Counter[str] = Counter()
    touched: dict[str, set[str]] = {}
    for group in groups:
        for r in group.rollouts:
            for row in rows_by_rollout.get(r.rollout_id, ()):
                if row.fork is None:
                    continue
                count[row.fork.kind] += 1
                lost[row.fork.kind] += row.fork.tokens_lost
                touched.setdefault(row.fork.kind, set()).add(r.rollout_id)
    entries = [
        DriftEntry(k, count[k], lost[k], len(touched[k]), FORK_ADVICE.get(k, FORK_ADVICE["other"]))
        for k in count
    ]
    return sorted(entries, key=lambda e: (-e.tokens_lost, -e.count, e.kind))
