"""rollwire rollouts as the dict TRL's ``rollout_func`` returns: pure conversion, no torch, no TRL.

``GRPOTrainer(rollout_func=...)`` wants one sample per prompt it hands over, each with
``prompt_ids``, ``completion_ids`` and ``logprobs``; ``env_mask`` (1 = a token the policy sampled,
0 = a tool, user or template token) becomes its tool mask, so those tokens stay in the forward
pass and out of the loss. Every other key reaches the reward functions as a keyword argument;
rollwire's start with ``rollwire_``. How rollouts map onto samples (``multi_row``):

- ``"last"`` (what TRL's own ``rollout_func`` contract allows: exactly one sample per rollout,
  for a ``GRPOTrainer`` you run yourself): a rollout whose calls forked into several rows (DESIGN
  §6) is trained on the row holding its **final call** — the answer its reward is for — and the
  other rows' sampled tokens are dropped and counted in :class:`ConversionReport`.
  ``rollwire train`` does not use this: its loop trains every row.
- ``"all"`` (``export``/``convert`` by default): every row the TrajectoryBuilder gives, for
  trainers or scripts that can take a variable number of rows.

Either way, a rollout that did not complete (failed, timeout, cancelled) keeps its tokens with
``env_mask`` all 0 and its reward (the failure reward), so it still counts in its group's
baseline but pushes no token; a rollout with no usable model call (it never called the model, or
every call failed) becomes a placeholder — its prompt, one end token, mask 0 — whose reward is
``None``: TRL leaves a sample every reward function scores ``None`` out of the group baseline and
gives it no advantage, since no decision of the policy earned that reward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from rollwire.data.protocol import Group, Rollout, Row, group_rollouts
from rollwire.data.trajectory import TokenizerLike, TrajectoryBuilder
from rollwire.plugins.protocols import Batch, ExportedRow

__all__ = [
    "REQUIRED_KEYS",
    "ConversionReport",
    "MultiRow",
    "PaddedRows",
    "flatten_output",
    "pad_rows",
    "to_rollout_output",
]

MultiRow = Literal["last", "all"]
#: the keys TRL checks for in what ``rollout_func`` returns
REQUIRED_KEYS = ("prompt_ids", "completion_ids", "logprobs")
#: per-sample keys rollwire adds; TRL hands them to reward functions as keyword arguments
_EXTRA_KEYS = (
    "rollwire_reward",
    "rollwire_rollout_id",
    "rollwire_group_id",
    "rollwire_row_index",
    "rollwire_status",
    "rollwire_policy_version",
    "rollwire_trainable",
)


@dataclass
class ConversionReport:
    """What a conversion kept and dropped (rollwire's side of a TRL step's statistics)."""

    rollouts: int = 0
    samples: int = 0
    #: rollouts trained on one row of several (``multi_row="last"``), and the sampled tokens of
    #: the rows left out
    forked: int = 0
    forked_tokens_dropped: int = 0
    #: rollouts that did not complete: kept, masked out, with their failure reward
    failed: int = 0
    #: rollouts with no usable model call: a placeholder whose reward is None
    placeholders: int = 0
    #: tokens the policy sampled in the samples kept (``env_mask`` 1)
    trainable_tokens: int = 0
    statuses: dict[str, int] = field(default_factory=dict)


def _empty_output() -> dict[str, list[Any]]:
    return {key: [] for key in (*REQUIRED_KEYS, "env_mask", *_EXTRA_KEYS)}


def _append(
    out: dict[str, list[Any]],
    rollout: Rollout,
    *,
    prompt: Sequence[int],
    completion: Sequence[int],
    logprobs: Sequence[float],
    mask: Sequence[int],
    reward: float | None,
    row_index: int,
    policy_version: str | None,
) -> None:
    out["prompt_ids"].append([int(t) for t in prompt])
    out["completion_ids"].append([int(t) for t in completion])
    out["logprobs"].append([float(x) for x in logprobs])
    out["env_mask"].append([int(m) for m in mask])
    out["rollwire_reward"].append(reward)
    out["rollwire_rollout_id"].append(rollout.rollout_id)
    out["rollwire_group_id"].append(rollout.group_id)
    out["rollwire_row_index"].append(row_index)
    out["rollwire_status"].append(rollout.status)
    out["rollwire_policy_version"].append(policy_version)
    out["rollwire_trainable"].append(bool(any(mask)))


def _add_row(
    out: dict[str, list[Any]],
    rollout: Rollout,
    row: Row,
    reward: float | None,
    report: ConversionReport,
) -> None:
    completed = rollout.status == "completed"
    mask = row.loss_mask if completed else np.zeros_like(row.loss_mask)
    logprobs = np.where(mask == 1, row.logprobs, 0.0)
    report.trainable_tokens += int(mask.sum())
    _append(
        out,
        rollout,
        prompt=row.prompt_ids.tolist(),
        completion=row.response_ids.tolist(),
        logprobs=logprobs.tolist(),
        mask=mask.tolist(),
        reward=reward,
        row_index=row.row_index,
        policy_version=row.policy_version,
    )


def _final_row(rollout: Rollout, rows: Sequence[Row]) -> Row:
    """The row that holds the rollout's last call (rows are in the order they were opened: a
    side call made mid-rollout opens a row after the main conversation's)."""
    last = max(rollout.calls, key=lambda c: c.index, default=None)
    for row in rows:
        if last is not None and last.call_id in row.call_ids:
            return row
    return rows[-1]


def to_rollout_output(
    batch: Batch,
    *,
    multi_row: MultiRow = "all",
    failure_reward: float = 0.0,
    end_token_id: int = 0,
    fallback_prompt_ids: Callable[[Rollout], Sequence[int]] | None = None,
    mode: Literal["merge", "per_call"] = "merge",
    tokenizer: TokenizerLike | None = None,
    return_report: bool = False,
) -> Any:
    """The ``rollout_func`` dict of ``batch`` (groups, or rollouts grouped by ``group_id``), in
    batch order; see the module docstring for ``multi_row`` and failed rollouts.

    ``end_token_id`` and ``fallback_prompt_ids(rollout)`` build the placeholder of a rollout with
    no usable call (``multi_row="last"`` only; default prompt: one ``end_token_id``). With
    ``return_report`` the result is ``(output, ConversionReport)``.
    """
    if multi_row not in ("last", "all"):
        raise ValueError(f"multi_row must be 'last' or 'all', got {multi_row!r}")
    groups: list[Group] = group_rollouts(batch)
    if not any(g.rollouts for g in groups):
        raise ValueError("the batch is empty: no rollouts to convert")
    builder = TrajectoryBuilder(mode, tokenizer)
    out = _empty_output()
    report = ConversionReport()
    for group in groups:
        for rollout in group.rollouts:
            report.rollouts += 1
            report.statuses[rollout.status] = report.statuses.get(rollout.status, 0) + 1
            completed = rollout.status == "completed"
            report.failed += not completed
            reward = rollout.reward
            if reward is None or not completed:
                reward = failure_reward if rollout.reward is None else rollout.reward
            rows = builder.build(rollout)
            if multi_row == "all":
                for row in rows:
                    _add_row(out, rollout, row, reward, report)
                continue
            if not rows:
                report.placeholders += 1
                prompt = list(fallback_prompt_ids(rollout)) if fallback_prompt_ids else []
                _append(
                    out,
                    rollout,
                    prompt=prompt or [end_token_id],
                    completion=[end_token_id],
                    logprobs=[0.0],
                    mask=[0],
                    reward=None,
                    row_index=0,
                    policy_version=None,
                )
                continue
            final = _final_row(rollout, rows)
            if len(rows) > 1:
                report.forked += 1
                report.forked_tokens_dropped += sum(
                    int(r.loss_mask.sum()) for r in rows if r is not final
                )
            _add_row(out, rollout, final, reward, report)
    report.samples = len(out["prompt_ids"])
    return (out, report) if return_report else out


def flatten_output(output: dict[str, list[Any]]) -> list[ExportedRow]:
    """The samples of a ``rollout_func`` dict as trainer-neutral rows (conformance tests)."""
    missing = [k for k in (*REQUIRED_KEYS, "env_mask") if k not in output]
    if missing:
        raise ValueError(f"not a rollout_func output: missing keys {missing}")
    n = len(output["prompt_ids"])
    rollout_ids = output.get("rollwire_rollout_id") or [str(i) for i in range(n)]
    group_ids = output.get("rollwire_group_id") or [None] * n
    rewards = output.get("rollwire_reward") or [None] * n
    rows: list[ExportedRow] = []
    for i in range(n):
        rows.append(
            ExportedRow(
                rollout_id=str(rollout_ids[i]),
                group_id=group_ids[i],
                prompt_ids=np.asarray(output["prompt_ids"][i], dtype=np.int64),
                response_ids=np.asarray(output["completion_ids"][i], dtype=np.int64),
                loss_mask=np.asarray(output["env_mask"][i], dtype=np.int64),
                logprobs=np.asarray(output["logprobs"][i], dtype=np.float32),
                reward=rewards[i],
            )
        )
    return rows


@dataclass
class PaddedRows:
    """Rows as TRL's loss takes them: prompts left-padded, responses right-padded."""

    prompt_ids: np.ndarray
    prompt_mask: np.ndarray
    completion_ids: np.ndarray
    completion_mask: np.ndarray
    #: 1 = sampled by the policy (carries loss); 0 = tool, user or template token, or padding
    tool_mask: np.ndarray
    sampling_logps: np.ndarray
    advantages: np.ndarray
    rollout_ids: list[str]
    group_ids: list[str | None]

    def rows(self) -> list[ExportedRow]:
        """The rows back out of the padding, as the loss sees them."""
        out = []
        for i, rid in enumerate(self.rollout_ids):
            p = self.prompt_ids[i][self.prompt_mask[i] == 1]
            keep = self.completion_mask[i] == 1
            out.append(
                ExportedRow(
                    rollout_id=rid,
                    group_id=self.group_ids[i],
                    prompt_ids=p,
                    response_ids=self.completion_ids[i][keep],
                    loss_mask=self.tool_mask[i][keep],
                    logprobs=self.sampling_logps[i][keep],
                    reward=None,
                    advantage=float(self.advantages[i]),
                )
            )
        return out


def pad_rows(rows: Sequence[Any], pad_id: int) -> PaddedRows:
    """``rows`` (the loop's :class:`~rollwire.trainer.train_batch.TrainRow`\\ s) padded into TRL's
    loss inputs; the behaviour policy's log-prob sits on every sampled token, 0 elsewhere."""
    n = len(rows)
    p_len = max(len(r.prompt_ids) for r in rows)
    c_len = max(len(r.response_ids) for r in rows)
    out = PaddedRows(
        prompt_ids=np.full((n, p_len), pad_id, np.int64),
        prompt_mask=np.zeros((n, p_len), np.int64),
        completion_ids=np.full((n, c_len), pad_id, np.int64),
        completion_mask=np.zeros((n, c_len), np.int64),
        tool_mask=np.zeros((n, c_len), np.int64),
        sampling_logps=np.zeros((n, c_len), np.float32),
        advantages=np.array([r.advantage for r in rows], np.float32),
        rollout_ids=[r.row.rollout_id for r in rows],
        group_ids=[r.row.group_id for r in rows],
    )
    for i, r in enumerate(rows):
        p, c = r.prompt_ids, r.response_ids
        out.prompt_ids[i, p_len - len(p) :] = p
        out.prompt_mask[i, p_len - len(p) :] = 1
        out.completion_ids[i, : len(c)] = c
        out.completion_mask[i, : len(c)] = 1
        out.tool_mask[i, : len(c)] = r.loss_mask
        out.sampling_logps[i, : len(c)] = r.logprobs
    return out
