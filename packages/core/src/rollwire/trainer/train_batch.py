"""One step's rollouts as what every trainer trains on: rows, masks, rewards and advantages.

The same captured batch gives every trainer (TRL, Tinker, verl) the same rows: **every row** the
:class:`~rollwire.data.trajectory.TrajectoryBuilder` makes of a rollout — the main conversation,
a side call (a router, a summariser), a fork — each carrying its rollout's advantage, so every
token the policy sampled in a completed rollout carries loss. Algorithm choices are named options
with one default for all trainers (:class:`Algorithm`). Pure: no I/O, no torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from rollwire.data.protocol import Group, Rollout, Row, group_rollouts
from rollwire.data.tool_health import ToolHealth, tool_health
from rollwire.data.trajectory import BuildMode, TokenizerLike, TrajectoryBuilder

__all__ = [
    "Algorithm",
    "TrainBatch",
    "TrainRow",
    "behaviour_stats",
    "build_train_batch",
    "group_advantages",
]

FailedRollouts = Literal["baseline", "drop"]


@dataclass(frozen=True)
class Algorithm:
    """The choices every trainer makes the same way (``rollwire train`` options).

    - ``scale_advantages``: GRPO's advantage is the reward minus its group's mean; ``True``
      divides by the group's standard deviation too (TRL's ``scale_rewards="group"``).
    - ``failed_rollouts``: a rollout that did not complete (the agent raised, timed out) trains
      no token either way; ``"baseline"`` counts its reward (``failure_reward``) in its group's
      mean, ``"drop"`` leaves it out of the group.
    """

    scale_advantages: bool = True
    failed_rollouts: FailedRollouts = "baseline"
    failure_reward: float = 0.0

    def __post_init__(self) -> None:
        if self.failed_rollouts not in ("baseline", "drop"):
            raise ValueError(
                f"failed_rollouts must be 'baseline' or 'drop', got {self.failed_rollouts!r}"
            )


@dataclass
class TrainRow:
    """One training row and the advantage every sampled token of it gets."""

    row: Row
    advantage: float
    #: 1 = the token was sampled by the policy and carries loss (0 for a failed rollout's)
    loss_mask: np.ndarray

    @property
    def prompt_ids(self) -> np.ndarray:
        """The row's prompt tokens."""
        return self.row.prompt_ids

    @property
    def response_ids(self) -> np.ndarray:
        """The row's response region (sampled tokens and tool/template tokens interleaved)."""
        return self.row.response_ids

    @property
    def logprobs(self) -> np.ndarray:
        """The behaviour policy's log-prob of each response token (0 where not sampled)."""
        return np.where(self.loss_mask == 1, self.row.logprobs, 0.0).astype(np.float32)


@dataclass
class TrainBatch:
    """One step's rows, and the token counts that say what the step trained on."""

    rows: list[TrainRow]
    rollouts: list[Rollout]
    #: tokens the policy sampled in the step's rollouts (every call's completion)
    sampled_tokens: int
    #: of those, the tokens that carried loss
    trained_tokens: int
    #: prompt tokens sent to the servers (what a managed service bills as prefill)
    prefill_tokens: int
    #: calls that stopped at their token limit (``finish_reason="length"``)
    truncated_calls: int
    #: rollouts with more than one row (forked, or a side call)
    forked: int
    #: tool calls parsed, and tool-call-shaped text that did not parse, over the step's calls
    tools: ToolHealth = field(default_factory=ToolHealth)
    #: why sampled tokens carried no loss: cause -> tokens
    untrained: dict[str, int] = field(default_factory=dict)
    #: rollout id -> why it has no row
    skipped: dict[str, str] = field(default_factory=dict)
    advantages: dict[str, float] = field(default_factory=dict)

    def gap_line(self) -> str | None:
        """``None`` when every sampled token was trained, else what was not and why."""
        gap = self.sampled_tokens - self.trained_tokens
        if gap <= 0:
            return None
        causes = ", ".join(f"{n} {why}" for why, n in sorted(self.untrained.items()) if n)
        return f"{gap} of {self.sampled_tokens} sampled tokens carried no loss ({causes})"


def group_advantages(
    rewards: dict[str, float], groups: dict[str, str | None], *, scale: bool = True
) -> dict[str, float]:
    """GRPO's advantage of each rollout: its reward minus its group's mean reward (divided by
    the group's standard deviation when ``scale``; a tied group gets 0). A rollout without a
    group is its own group."""
    members: dict[str, list[str]] = {}
    for rollout_id in rewards:
        members.setdefault(groups.get(rollout_id) or rollout_id, []).append(rollout_id)
    out: dict[str, float] = {}
    for ids in members.values():
        values = np.array([rewards[i] for i in ids], dtype=np.float64)
        centred = values - values.mean()
        if scale and len(ids) > 1:  # the sample standard deviation, as TRL's GRPO
            centred = centred / (values.std(ddof=1) + 1e-4)
        out.update(zip(ids, centred.tolist()))
    return out


def build_train_batch(
    batch: Iterable[Group | Rollout],
    algorithm: Algorithm = Algorithm(),
    *,
    mode: BuildMode = "merge",
    tokenizer: TokenizerLike | None = None,
) -> TrainBatch:
    """Every row of every completed rollout of ``batch`` with its rollout's advantage."""
    rollouts = [r for g in group_rollouts(batch) for r in g.rollouts]
    if not rollouts:
        raise ValueError("the batch is empty: no rollouts to train on")
    builder = TrajectoryBuilder(mode, tokenizer)
    untrained: dict[str, int] = {}
    skipped: dict[str, str] = {}
    sampled = prefill = truncated = 0
    for rollout in rollouts:
        for call in rollout.calls:
            n = int(call.completion_ids.shape[0])
            sampled += n
            prefill += int(call.prompt_ids.shape[0])
            truncated += call.finish_reason == "length"
    rewards: dict[str, float] = {}
    built: dict[str, list[Row]] = {}
    for rollout in rollouts:
        completed = rollout.status == "completed"
        rows = builder.build(rollout) if completed else []
        if not completed:
            why = f"status {rollout.status}"
            if algorithm.failed_rollouts == "baseline":  # in its group's mean, trains nothing
                rewards[rollout.rollout_id] = (
                    float(rollout.reward)
                    if rollout.reward is not None
                    else algorithm.failure_reward
                )
        elif rollout.reward is None:
            why = "no reward"
        elif not rows:
            why = "no usable model call"
        else:
            rewards[rollout.rollout_id] = float(rollout.reward)
            built[rollout.rollout_id] = rows
            continue
        skipped[rollout.rollout_id] = why
        n = _sampled(rollout)
        if n:
            untrained[f"rollouts with {why}"] = untrained.get(f"rollouts with {why}", 0) + n
    groups = {r.rollout_id: r.group_id for r in rollouts}
    advantages = group_advantages(rewards, groups, scale=algorithm.scale_advantages)
    out: list[TrainRow] = []
    trained = forked = 0
    left_out = "calls left out of the rows (failed, retried or off-policy)"
    for rollout in rollouts:
        rows = built.get(rollout.rollout_id, [])
        forked += len(rows) > 1
        in_rows = 0
        for row in rows:
            if row.input_ids.shape[0] < 2 or row.input_ids.shape[0] == row.prompt_len:
                continue
            mask = row.loss_mask.astype(np.int8)
            in_rows += int(mask.sum())
            out.append(TrainRow(row, advantages[rollout.rollout_id], mask))
        trained += in_rows
        gap = _sampled(rollout) - in_rows if rows else 0
        if gap > 0:
            untrained[left_out] = untrained.get(left_out, 0) + gap
    return TrainBatch(
        tools=tool_health(c for r in rollouts for c in r.calls),
        rows=out,
        rollouts=rollouts,
        sampled_tokens=sampled,
        trained_tokens=trained,
        prefill_tokens=prefill,
        truncated_calls=truncated,
        forked=forked,
        untrained=untrained,
        skipped=skipped,
        advantages=advantages,
    )


def _sampled(rollout: Rollout) -> int:
    return sum(int(c.completion_ids.shape[0]) for c in rollout.calls)


def behaviour_stats(
    trainer_logprobs: Sequence[np.ndarray], sampled_logprobs: Sequence[np.ndarray]
) -> dict[str, float]:
    """How far the trainer's log-probs (before the update) are from the captured ones, over
    the trained tokens, under one meaning for every trainer: ``kl_behaviour`` is the k3
    estimate of KL(behaviour ‖ trainer), ``mean(exp(d) - d - 1)`` with ``d = trainer -
    behaviour``; ``is_ratio_*`` are ``exp(d)``; ``logp_diff_*`` are ``|d|``."""
    d = np.concatenate(
        [
            np.asarray(t, np.float64) - np.asarray(s, np.float64)
            for t, s in zip(trainer_logprobs, sampled_logprobs)
        ]
        or [np.zeros(0)]
    )
    d = d[np.isfinite(d)]
    if not d.size:
        return {}
    ratio = np.exp(d)
    return {
        "kl_behaviour": float(np.mean(ratio - d - 1.0)),
        "is_ratio_min": float(ratio.min()),
        "is_ratio_mean": float(ratio.mean()),
        "is_ratio_max": float(ratio.max()),
        "logp_diff_mean": float(np.abs(d).mean()),
        "logp_diff_max": float(np.abs(d).max()),
    }
