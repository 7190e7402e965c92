"""verl's own actor as the loop's trainer, piece by piece on the CPU: an update moves the
weights, the exported folder scores as the actor does (the sync's check), micro-batches
accumulate to the gradient of one batch, a checkpoint resumes, and what verl's actor cannot do
here is refused with a reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("verl")
torch = pytest.importorskip("torch")

from rollwire.testing import merged_rollout, side_call_rollout  # noqa: E402
from rollwire.trainer.loop import RunSpec  # noqa: E402
from rollwire.trainer.references import engine_reference, transformers_reference  # noqa: E402
from rollwire.trainer.train_batch import TrainBatch, build_train_batch  # noqa: E402
from rollwire_verl.actor import micro_batch_size  # noqa: E402
from rollwire_verl.policy_trainer import VerlTrainer  # noqa: E402
from rollwire_verl.train_rows import train_arrays  # noqa: E402

pytestmark = pytest.mark.timeout(600)

PROBES = [([5, 17, 42, 99], [7, 64, 120, 33]), ([3, 1, 4, 1, 5, 9, 2, 6], [5, 3, 5])]


def _batch() -> TrainBatch:
    rollouts = [
        side_call_rollout("a", "g1", 1.0),
        side_call_rollout("b", "g1", 0.0),
        merged_rollout("c", "g2", 1.0),
        merged_rollout("d", "g2", 0.0),
    ]
    for r in rollouts:  # the tiny model's vocabulary
        for c in r.calls:
            c.prompt_ids = c.prompt_ids % 200
            c.completion_ids = c.completion_ids % 200
    return build_train_batch(rollouts)


def _trainer(base_model: Path, out: Path, **kw: Any) -> VerlTrainer:
    spec = RunSpec(out=out, model=base_model, warmup_steps=0, group_size=2, **kw)
    trainer = VerlTrainer(spec)
    trainer.start(spec)
    return trainer


def _weights(trainer: VerlTrainer) -> dict[str, Any]:
    assert trainer.actor is not None
    return trainer.actor.state_dict()


def test_an_update_moves_the_weights_and_the_export_scores_as_the_actor(
    base_model: Path, tmp_path: Path
) -> None:
    trainer = _trainer(base_model, tmp_path)
    try:
        start = engine_reference(base_model)
        before_update = trainer.reference()
        for prompt, completion in PROBES:  # the actor starts from the engine's very model
            np.testing.assert_allclose(
                before_update(prompt, completion), start(prompt, completion), atol=1e-4
            )
        before = _weights(trainer)
        stats = trainer.update(_batch())
        after = _weights(trainer)
        moved = [k for k in before if not torch.equal(before[k], after[k])]
        assert len(moved) == len(before), set(before) - set(moved)
        assert stats["grad_norm"] > 0 and stats["rows"] == 6 and stats["micro_batches"] == 1
        for key in ("loss", "kl_behaviour", "is_ratio_min", "is_ratio_max", "is_weight_max"):
            assert key in stats, (key, stats)

        exported = trainer.export(1)
        folder = Path(exported.weights)
        assert folder.is_absolute() and exported.version == "1"
        engine, transformers = engine_reference(folder), transformers_reference(folder)
        actor = trainer.reference()
        assert trainer.actor is not None
        module = trainer.actor.engine.module
        module.train()
        for prompt, completion in PROBES:
            ours = actor(prompt, completion)
            np.testing.assert_allclose(engine(prompt, completion), ours, atol=trainer.tolerance)
            np.testing.assert_allclose(transformers(prompt, completion), ours, atol=1e-4)
        assert module.training  # the reference scored in eval mode and put training back
        # the update changed what the policy says
        assert (
            max(abs(a - b) for p, c in PROBES for a, b in zip(actor(p, c), start(p, c)))
            > 10 * trainer.tolerance
        )

        for step in (2, 3):  # the newest two exports are kept
            trainer.export(step)
        assert sorted(p.name for p in (tmp_path / "policy").iterdir()) == ["step-2", "step-3"]
    finally:
        trainer.close()


def test_micro_batches_accumulate_to_the_step_of_one_batch(
    base_model: Path, tmp_path: Path
) -> None:
    whole = _trainer(base_model, tmp_path / "whole")
    micro = _trainer(base_model, tmp_path / "micro", micro_batch_size=2)
    try:
        a, b = whole.update(_batch()), micro.update(_batch())
        assert (a["micro_batches"], b["micro_batches"]) == (1, 3)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4, abs=1e-7)
        # Adam's first step moves each weight by about lr * sign(gradient): where a gradient
        # entry is ~0, summation order can flip its sign, so a few entries may differ by up to
        # 2 lr; everything else must match
        lr = RunSpec(out=tmp_path).learning_rate
        wa, wb = _weights(whole), _weights(micro)
        for name in wa:
            diff = (wb[name] - wa[name]).abs()
            assert float(diff.max()) <= 2 * lr + 1e-6, name
            assert float((diff > 1e-6).float().mean()) <= 0.01, name
    finally:
        whole.close()
        micro.close()


@pytest.mark.parametrize("mode", ["token", "off"])
def test_verls_rollout_correction_weighs_against_the_captured_log_probs(
    base_model: Path, tmp_path: Path, mode: str
) -> None:
    trainer = _trainer(
        base_model, tmp_path, options={"rollout_is": mode, "rollout_is_threshold": 1.5}
    )
    try:
        assert trainer.actor is not None
        batch = _batch()
        # a stale batch: captured = the actor's log-prob - 1 on even tokens (ratio e, above the
        # threshold), + 0.5 on odd ones (ratio exp(-0.5))
        current = trainer.actor.log_probs(train_arrays(batch.rows).batch.tensors, 1.0)
        for i, row in enumerate(train_arrays(batch.rows).rows):
            n = row.loss_mask.shape[0]
            delta = np.where(np.arange(n) % 2 == 0, -1.0, 0.5)
            row.row.logprobs = (current[i, :n] + delta).astype(np.float32)
        stats = trainer.update(batch)
    finally:
        trainer.close()
    assert stats["is_ratio_max"] == pytest.approx(np.e, rel=1e-4)
    assert stats["is_ratio_min"] == pytest.approx(np.exp(-0.5), rel=1e-4)
    if mode == "off":
        assert "is_weight_max" not in stats
        return
    # verl's token weights: exp(trainer - captured), truncated at the threshold from above only
    assert stats["is_weight_max"] == pytest.approx(1.5)
    assert stats["is_weight_min"] == pytest.approx(np.exp(-0.5), rel=1e-4)


def test_the_micro_batch_divides_the_rows() -> None:
    assert micro_batch_size(6, 0) == 6 and micro_batch_size(6, 8) == 6
    assert micro_batch_size(6, 4) == 3 and micro_batch_size(7, 4) == 1
    assert micro_batch_size(32, 8) == 8


def test_a_checkpoint_resumes_the_actor_and_its_optimizer(base_model: Path, tmp_path: Path) -> None:
    first = _trainer(base_model, tmp_path)
    try:
        first.update(_batch())
        first.save(1)
        saved = _weights(first)
        first.update(_batch())
        expected = _weights(first)
    finally:
        first.close()
    assert (tmp_path / "checkpoints" / "step-1" / "state.json").is_file()
    spec = RunSpec(out=tmp_path, model=base_model, warmup_steps=0, group_size=2, resume=True)
    resumed = VerlTrainer(spec)
    try:
        start = resumed.start(spec)
        assert start.step == 1 and start.version == "1"
        assert Path(start.weights).name == "resume-1"
        for name, value in _weights(resumed).items():
            assert torch.equal(value, saved[name]), name
        resumed.update(_batch())  # the optimizer's state came back too: the same second step
        for name, value in _weights(resumed).items():
            torch.testing.assert_close(value, expected[name], rtol=1e-5, atol=1e-7, msg=name)
    finally:
        resumed.close()


@pytest.mark.parametrize(
    ("option", "reason"),
    [
        ({"beta": 0.04}, "no reference model"),
        ({"lora_rank": 8}, "full weights"),
        ({"bf16": True}, "float32"),
    ],
)
def test_what_verls_actor_cannot_do_here_is_refused(
    tmp_path: Path, option: dict[str, Any], reason: str
) -> None:
    with pytest.raises(ValueError, match=reason):
        VerlTrainer(RunSpec(out=tmp_path, **option))
