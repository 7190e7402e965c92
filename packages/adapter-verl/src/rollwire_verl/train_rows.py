"""The loop's batch (:class:`~rollwire.trainer.train_batch.TrainBatch`) in the layout verl's actor
trains on: :func:`~rollwire_verl.layout.padded_arrays`'s, with each row's advantage on every
token it trains (``advantages``) and the captured log-probs as ``rollout_log_probs``.

Pure NumPy, no torch: ``VerlAdapter.train_rows`` reads the rows back from these very arrays, so
the conformance suite checks what the update feeds verl. A row with no trainable token is left
out (it carries no loss, and a micro-batch of such rows alone is an error in verl's rollout
correction: "response_mask must contain at least one valid token").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rollwire.plugins.protocols import ExportedRow
from rollwire.trainer.train_batch import TrainRow
from rollwire_verl.layout import PaddedBatch, padded_arrays

__all__ = ["TrainArrays", "exported_rows", "train_arrays"]


@dataclass
class TrainArrays:
    """A step's rows as verl's padded batch (``batch.tensors``: ``input_ids``, ``attention_mask``,
    ``position_ids``, ``prompts``, ``responses``, ``response_mask``, ``rollout_log_probs``,
    ``advantages``, ...), and the rows it holds, in order."""

    batch: PaddedBatch
    rows: list[TrainRow]

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def prompt_width(self) -> int:
        """``P``: the padded prompt length."""
        return int(self.batch.tensors["prompts"].shape[1])

    @property
    def trained_tokens(self) -> int:
        """Tokens that carry loss."""
        return int(self.batch.tensors["response_mask"].sum())

    def sequence_lengths(self) -> list[int]:
        """Each row's real tokens (prompt and response), verl's ``global_token_num``."""
        return [int(n) for n in self.batch.tensors["attention_mask"].sum(axis=1)]


def train_arrays(rows: Sequence[TrainRow], *, pad_token_id: int = 0) -> TrainArrays:
    """``rows`` (those with a trainable token) laid out for verl's actor; raises ValueError when
    no row has one."""
    kept = [r for r in rows if int(r.loss_mask.sum()) > 0]
    if not kept:
        raise ValueError(
            f"none of the {len(rows)} rows has a token the policy sampled: nothing to train on"
        )
    # no routing: verl's FSDP engine replays none
    batch = padded_arrays(
        [r.row for r in kept],
        pad_token_id=pad_token_id,
        keep_untrainable_groups=True,
        routed_experts=False,
    )
    t = batch.tensors
    mask = np.zeros_like(t["response_mask"])
    logprobs = np.zeros_like(t["rollout_log_probs"])
    advantages = np.zeros(mask.shape, np.float32)
    for i, row in enumerate(kept):
        n = row.loss_mask.shape[0]
        mask[i, :n] = row.loss_mask
        logprobs[i, :n] = row.logprobs  # the captured log-probs, 0 where not sampled
        advantages[i, :n] = np.float32(row.advantage) * row.loss_mask
    t["response_mask"], t["rollout_log_probs"], t["advantages"] = mask, logprobs, advantages
    return TrainArrays(batch, kept)


def exported_rows(arrays: TrainArrays) -> list[ExportedRow]:
    """The rows of ``arrays`` with the pads stripped, each with its advantage (as the update feeds
    them: the advantage is read back from the ``advantages`` tensor)."""
    t = arrays.batch.tensors
    p = arrays.prompt_width
    attention = t["attention_mask"]
    out: list[ExportedRow] = []
    for i, row in enumerate(arrays.rows):
        pl = int(attention[i, :p].sum())
        rl = int(attention[i, p:].sum())
        mask = t["response_mask"][i, :rl]
        trained = np.flatnonzero(mask)
        advantage = float(t["advantages"][i, trained[0]]) if trained.size else 0.0
        out.append(
            ExportedRow(
                rollout_id=row.row.rollout_id,
                group_id=row.row.group_id,
                prompt_ids=t["prompts"][i, p - pl :],
                response_ids=t["responses"][i, :rl],
                loss_mask=mask,
                logprobs=t["rollout_log_probs"][i, :rl],
                reward=float(t["rm_scores"][i].sum()),
                advantage=advantage,
            )
        )
    return out
