"""Conformance suite every trainer adapter runs (subclass it and provide the ``adapter`` fixture)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from rollwire.data.protocol import Group, Row
from rollwire.data.trajectory import build_rows
from rollwire.plugins.protocols import ExportedRow, TrainerAdapter
from rollwire.testing.samples import sample_batch

__all__ = ["TrainerAdapterConformance", "TrainerLoopConformance"]


class TrainerAdapterConformance:
    """What any trainer adapter must do with rollwire rollouts, checked on :func:`sample_batch`."""

    #: keyword options passed to ``convert`` / ``export`` (e.g. verl's ``pad_token_id``).
    convert_options: ClassVar[dict[str, Any]] = {}
    #: whether ``flatten`` must give each row's full routed experts (DESIGN §6). An adapter whose
    #: trainer format cannot hold them sets False and says why; rows that do carry them are
    #: still compared.
    exports_routed_experts: ClassVar[bool] = True

    @pytest.fixture
    def adapter(self) -> TrainerAdapter:
        raise NotImplementedError("subclasses provide the adapter under test")

    @pytest.fixture
    def batch(self) -> list[Group]:
        return sample_batch()

    def _flat(self, adapter: TrainerAdapter, batch: Any) -> list[ExportedRow]:
        return adapter.flatten(adapter.convert(batch, **self.convert_options))

    def test_declares_interface(self, adapter: TrainerAdapter) -> None:
        assert isinstance(adapter, TrainerAdapter)
        assert adapter.name and isinstance(adapter.name, str)
        assert all(isinstance(r, str) for r in adapter.requires)

    def test_rows_match_trajectory_builder(
        self, adapter: TrainerAdapter, batch: list[Group]
    ) -> None:
        flat = self._flat(adapter, batch)
        by_rollout: dict[str, list[ExportedRow]] = {}
        for row in flat:
            by_rollout.setdefault(row.rollout_id, []).append(row)
        expected_by_rollout: dict[str, list[Row]] = {}
        for expected in build_rows(batch):
            expected_by_rollout.setdefault(expected.rollout_id, []).append(expected)
        statuses = {r.rollout_id: r.status for g in batch for r in g.rollouts}
        assert set(by_rollout) <= set(statuses), "the export has rows of unknown rollouts"
        for rollout_id, status in statuses.items():
            got_rows = by_rollout.get(rollout_id, [])
            if status != "completed":
                # a failed rollout trains nothing: excluded, or every row fully masked out
                for got in got_rows:
                    assert not np.any(got.loss_mask), (
                        f"rollout {rollout_id} ({status}) exports trainable tokens"
                    )
                continue
            expected_rows = expected_by_rollout.get(rollout_id, [])
            assert len(got_rows) == len(expected_rows), (
                f"rollout {rollout_id}: {len(got_rows)} rows exported, "
                f"TrajectoryBuilder gives {len(expected_rows)}"
            )
            for got, expected in zip(got_rows, expected_rows):
                self._check_row(got, expected)

    def _check_row(self, got: ExportedRow, expected: Row) -> None:
        np.testing.assert_array_equal(got.prompt_ids, expected.prompt_ids)
        np.testing.assert_array_equal(got.response_ids, expected.response_ids)
        np.testing.assert_array_equal(got.loss_mask, expected.loss_mask)
        np.testing.assert_allclose(
            np.where(expected.loss_mask == 1, got.logprobs, 0.0),
            expected.logprobs,
            atol=1e-6,
        )
        assert got.reward == pytest.approx(expected.reward)
        if expected.routed_experts is None:
            assert got.routed_experts is None, "routed experts exported for a row without any"
        elif got.routed_experts is not None or self.exports_routed_experts:
            assert got.routed_experts is not None, (
                f"rollout {expected.rollout_id} row {expected.row_index}: routed experts dropped"
            )
            np.testing.assert_array_equal(
                np.asarray(got.routed_experts, dtype=np.int64),
                expected.routed_experts.astype(np.int64),
            )

    def test_flat_rollouts_equal_groups(self, adapter: TrainerAdapter, batch: list[Group]) -> None:
        flat_rollouts = [r for g in batch for r in g.rollouts]
        a = self._flat(adapter, batch)
        b = self._flat(adapter, flat_rollouts)
        assert [(r.rollout_id, r.group_id) for r in a] == [(r.rollout_id, r.group_id) for r in b]
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x.response_ids, y.response_ids)

    def test_group_ids_preserved(self, adapter: TrainerAdapter, batch: list[Group]) -> None:
        expected = {r.rollout_id: g.group_id for g in batch for r in g.rollouts}
        for row in self._flat(adapter, batch):
            assert row.group_id == expected[row.rollout_id]

    def test_forked_rollout_keeps_its_rows_together(
        self, adapter: TrainerAdapter, batch: list[Group]
    ) -> None:
        rows = [r for r in self._flat(adapter, batch) if r.rollout_id == "a2"]
        assert len(rows) == 2, "a forked rollout exports one row per branch"
        assert rows[0].reward == rows[1].reward

    def test_mask_and_logprob_lengths(self, adapter: TrainerAdapter, batch: list[Group]) -> None:
        for row in self._flat(adapter, batch):
            assert row.loss_mask.shape == row.response_ids.shape == row.logprobs.shape
            assert set(np.unique(row.loss_mask)).issubset({0, 1})
            assert np.all(row.logprobs[row.loss_mask == 0] == 0.0)

    def test_empty_batch_is_a_clear_error(self, adapter: TrainerAdapter) -> None:
        with pytest.raises(ValueError, match=r"empty|no rollouts|no rows"):
            adapter.convert([], **self.convert_options)

    def test_export_writes_file(
        self, adapter: TrainerAdapter, batch: list[Group], tmp_path: Path
    ) -> None:
        out = adapter.export(batch, tmp_path / f"batch.{adapter.name}", **self.convert_options)
        assert Path(out).exists() and Path(out).stat().st_size > 0


class TrainerLoopConformance:
    """What a trainer of ``rollwire train`` must do with the loop's batch: feed its update exactly
    the rows :func:`~rollwire.trainer.train_batch.build_train_batch` made — every sampled token
    of every call, side calls included, with its rollout's advantage. The ``adapter`` fixture's
    ``train_rows(batch)`` gives the rows as the trainer's update sees them."""

    @pytest.fixture
    def adapter(self) -> Any:
        raise NotImplementedError("subclasses provide the adapter under test")

    @pytest.fixture
    def batch(self) -> Any:
        from rollwire.testing.samples import side_call_rollout
        from rollwire.trainer.train_batch import build_train_batch

        group = Group(
            group_id="g-side",
            rollouts=[
                side_call_rollout("r-side-a", reward=1.0),
                side_call_rollout("r-side-b", reward=0.0),
            ],
        )
        return build_train_batch([group, *sample_batch()])

    def test_every_sampled_token_carries_loss(self, adapter: Any, batch: Any) -> None:
        rows = adapter.train_rows(batch)
        assert batch.sampled_tokens > batch.trained_tokens > 0  # sample_batch has a failure
        assert sum(int(r.loss_mask.sum()) for r in rows) == batch.trained_tokens
        for rollout in batch.rollouts:
            if rollout.status != "completed":
                continue
            mine = [r for r in rows if r.rollout_id == rollout.rollout_id]
            for call in rollout.calls:
                ids = call.completion_ids.astype(np.int64)
                found = [
                    (r, start)
                    for r in mine
                    for start in range(len(r.response_ids) - len(ids) + 1)
                    if np.array_equal(r.response_ids[start : start + len(ids)], ids)
                    and r.loss_mask[start : start + len(ids)].all()
                ]
                assert found, f"{call.call_id}'s sampled tokens carry no loss"
                row, start = found[0]
                np.testing.assert_allclose(
                    row.logprobs[start : start + len(ids)], call.logprobs, atol=1e-6
                )

    def test_the_side_call_and_the_final_answer_are_both_trained(
        self, adapter: Any, batch: Any
    ) -> None:
        rows = [r for r in adapter.train_rows(batch) if r.rollout_id == "r-side-a"]
        assert len(rows) == 2  # the main conversation and the side call
        final = batch.rollouts[0].calls[2].completion_ids
        assert any(r.response_ids[-len(final) :].tolist() == final.tolist() for r in rows)

    def test_each_row_has_its_rollouts_advantage(self, adapter: Any, batch: Any) -> None:
        rows = adapter.train_rows(batch)
        for row in rows:
            assert row.advantage == pytest.approx(batch.advantages[row.rollout_id])
        side = {r.rollout_id: r.advantage for r in rows if r.rollout_id.startswith("r-side")}
        assert side["r-side-a"] > 0 > side["r-side-b"]
