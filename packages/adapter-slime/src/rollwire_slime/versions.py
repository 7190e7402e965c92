"""What a slime ``Sample`` says about the weights that sampled it and its step-level credit.

``Sample.weight_versions`` is slime's ``list[str]``, one entry per generation: slime appends SGLang's
``meta_info["weight_version"]`` after each request, so a partial rollout resumed after a sync lists
two. rollwire writes one entry per call of the row, and a call that crossed a sync (tokens mode,
vLLM's ``keep`` pause) one per version span, in token order; the exact spans over the response
are in ``metadata["rollwire"]["weight_version_spans"]``.

slime trains on one scalar reward per sample and carries no per-token advantage to its trainer
(``train_metadata`` stops at the rollout side), so step credit (:mod:`rollwire.data.credit`)
becomes the sample's ``reward``: the credit of the row's first sampled turn. That is exact with
``mode="per_call"`` (one turn per sample) and with ``discounted`` (the return from the row's first
turn includes its later turns); a merged row of several turns under ``broadcast`` has no single
value and is refused. The per-token values stay in ``metadata["rollwire"]["step_advantages"]``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rollwire.data.credit import StepCredit
from rollwire.data.protocol import Rollout, Row

__all__ = ["credit_reward", "sample_weight_versions", "version_metadata"]


def sample_weight_versions(row: Row, rollout: Rollout) -> list[str]:
    """slime's ``weight_versions`` for a row: each call's version spans, in order."""
    by_id = {c.call_id: c for c in rollout.calls}
    out: list[str] = []
    for cid in row.call_ids:
        call = by_id.get(cid)
        if call is not None:
            out.extend(span.version for span in call.version_spans())
    return out


def version_metadata(row: Row, rollout: Rollout) -> dict[str, Any]:
    """The row's versions and their spans over the response, and the whole rollout's versions
    (more than one: it crossed a weight sync)."""
    return {
        "weight_versions": list(row.weight_versions),
        "weight_version_spans": [list(span) for span in row.version_spans()],
        "rollout_weight_versions": rollout.weight_versions(),
    }


def credit_reward(row: Row, credit: StepCredit | None) -> float | None:
    """The sample reward under step credit, or None when the row has none (keep the rollout's)."""
    if credit is None or row.advantages is None:
        return None
    sampled = np.flatnonzero(row.loss_mask == 1)
    if sampled.size == 0:
        return 0.0
    turns = {int(t) for t in row.turn_ids[sampled]}
    if credit.mode == "broadcast" and len(turns) > 1:
        raise ValueError(
            f"row {row.row_index} of rollout {row.rollout_id!r} merges {len(turns)} turns, and "
            "slime has one reward per sample: broadcast step credit has no single value for it. "
            "Export with mode='per_call' (one sample per call) or step_credit='discounted'"
        )
    return float(row.advantages[sampled[0]])
