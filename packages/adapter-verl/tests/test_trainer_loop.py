"""The rows ``rollwire train --trainer verl`` feeds verl's actor: the shared loop suite, and the
layout's own promises (NumPy only: these run without torch or verl too)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rollwire.testing import TrainerLoopConformance, merged_rollout, side_call_rollout
from rollwire.trainer.train_batch import build_train_batch
from rollwire_verl import adapter as verl_adapter
from rollwire_verl.train_rows import exported_rows, train_arrays


class TestVerlTrainerLoop(TrainerLoopConformance):
    @pytest.fixture
    def adapter(self) -> Any:
        return verl_adapter


def _batch() -> Any:
    return build_train_batch(
        [
            side_call_rollout("a", "g1", 1.0),
            side_call_rollout("b", "g1", 0.0),
            merged_rollout("c", "g2", 1.0),
            merged_rollout("d", "g2", 0.0),
        ]
    )


def test_every_trained_token_carries_its_rows_advantage_and_no_other_does() -> None:
    batch = _batch()
    arrays = train_arrays(batch.rows, pad_token_id=7)
    t = arrays.batch.tensors
    assert len(arrays) == len(batch.rows) == 6
    mask = t["response_mask"].astype(bool)
    for i, row in enumerate(arrays.rows):
        np.testing.assert_allclose(t["advantages"][i][mask[i]], row.advantage, rtol=1e-6)
        assert not t["advantages"][i][~mask[i]].any()
        np.testing.assert_array_equal(t["rollout_log_probs"][i][~mask[i]], 0.0)
    assert arrays.trained_tokens == batch.trained_tokens
    # verl's padded layout: prompts left-padded, responses right-padded, with the pad id given
    assert (t["input_ids"][t["attention_mask"] == 0] == 7).all()
    assert arrays.sequence_lengths() == [
        len(r.prompt_ids) + len(r.response_ids) for r in arrays.rows
    ]


def test_a_row_without_a_trained_token_is_left_out() -> None:
    # verl's rollout correction refuses a micro-batch whose response_mask is all 0
    batch = _batch()
    batch.rows[1].loss_mask = np.zeros_like(batch.rows[1].loss_mask)
    rows = exported_rows(train_arrays(batch.rows))
    assert len(rows) == len(batch.rows) - 1
    assert all(r.loss_mask.any() for r in rows)
    for row in batch.rows:
        row.loss_mask = np.zeros_like(row.loss_mask)
    with pytest.raises(ValueError, match="nothing to train on"):
        train_arrays(batch.rows)
