"""Per-token facts of the verl layout beyond tokens, masks and log-probs: the weight versions that
sampled each row and its step credit (issues 23.4, 25.2 and 25.5). Pure NumPy.

- ``non_tensor_batch["weight_versions"]``: per row, the versions that sampled its tokens, in order
  of first use (more than one: the rollout crossed a weight sync, and says so);
  ``["weight_version_spans"]``: per row, ``[version, start, end]`` runs over the response columns
  (``responses[i, start:end]``; context tokens belong to none). Per row rather than in
  ``meta_info``, because verl's ``DataProto.concat`` requires equal ``meta_info`` across batches.
- with step credit (:mod:`rollwire.data.credit`): ``batch["step_advantages"]`` [B, R] float32,
  each turn's credit on its sampled tokens, and ``batch["step_rewards"]`` [B, R], each turn's
  step reward on its last sampled token (verl's token-level scores form: ``token_level_scores =
  step_rewards`` lets verl's own GAE / REINFORCE++ discount it); ``non_tensor_batch
  ["has_step_credit"]`` marks the rows that had step rewards (zeros elsewhere).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rollwire.data.protocol import Row
from rollwire_verl.rows import RowCut

__all__ = ["CREDIT_KEYS", "VERSION_KEYS", "credit_tensors", "version_non_tensors"]

VERSION_KEYS = ("weight_versions", "weight_version_spans")
CREDIT_KEYS = ("has_step_credit",)


def _object_array(values: Sequence[object]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):  # one by one: equal-length lists must not broadcast
        out[i] = value
    return out


def _spans(row: Row, cut: RowCut) -> list[list[object]]:
    ids = cut.version_ids
    if ids is None or ids.size == 0:
        return []
    cuts = np.flatnonzero(np.diff(ids)) + 1
    starts = np.concatenate([[0], cuts])
    ends = np.concatenate([cuts, [ids.size]])
    return [
        [row.weight_versions[int(ids[s])], int(s), int(e)]
        for s, e in zip(starts, ends)
        if ids[s] >= 0
    ]


def version_non_tensors(rows: Sequence[Row], cuts: Sequence[RowCut]) -> dict[str, np.ndarray]:
    """``weight_versions`` and ``weight_version_spans`` per row (empty lists when unknown)."""
    return {
        "weight_versions": _object_array([list(row.weight_versions) for row in rows]),
        "weight_version_spans": _object_array([_spans(r, c) for r, c in zip(rows, cuts)]),
    }


def credit_tensors(
    cuts: Sequence[RowCut], masks: Sequence[np.ndarray], r: int
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``(tensors, non_tensors)`` of step credit, both empty when no row has step rewards.
    ``masks`` are the rows' final loss masks (zero for failed rows): credit follows them."""
    if all(c.advantages is None for c in cuts):
        return {}, {}
    b = len(cuts)
    advantages = np.zeros((b, r), dtype=np.float32)
    rewards = np.zeros((b, r), dtype=np.float32)
    for i, (cut, mask) in enumerate(zip(cuts, masks)):
        n = mask.shape[0]
        on = mask.astype(bool)
        if cut.advantages is not None:
            advantages[i, :n] = np.where(on, cut.advantages, 0.0)
        if cut.step_rewards is not None:
            rewards[i, :n] = np.where(on, cut.step_rewards, 0.0)
    has = np.fromiter((c.advantages is not None for c in cuts), np.bool_, count=b)
    return {"step_advantages": advantages, "step_rewards": rewards}, {"has_step_credit": has}
