"""The TRL trainer of the loop, piece by piece on the CPU: micro-batches accumulate to the same
gradient as one batch, bf16 training syncs within its dtype's tolerance, and the probe's
reference scores in eval mode on the model's own device without leaving training mode."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from rollwire.testing import merged_rollout, side_call_rollout
from rollwire.trainer.loop import RunSpec
from rollwire.trainer.train_batch import TrainBatch, build_train_batch

pytestmark = pytest.mark.timeout(600)


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


def _trainer(base_model: Path, out: Path, **kw: Any) -> Any:
    from rollwire_trl.policy_trainer import TrlTrainer

    spec = RunSpec(out=out, model=base_model, warmup_steps=0, group_size=2, **kw)
    trainer = TrlTrainer(spec)
    trainer.start(spec)
    return trainer


def _grads(trainer: Any, batch: TrainBatch) -> dict[str, Any]:
    trainer.optimizer.step = lambda *a, **k: None  # keep the weights and the gradients
    trainer.optimizer.zero_grad = lambda *a, **k: None
    trainer.update(batch)
    return {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


def test_micro_batches_accumulate_to_the_gradient_of_one_batch(
    trl: ModuleType, base_model: Path, tmp_path: Path
) -> None:
    import torch

    batch = _batch()
    assert len(batch.rows) == 6
    whole = _grads(_trainer(base_model, tmp_path / "a"), batch)
    micro = _grads(_trainer(base_model, tmp_path / "b", micro_batch_size=2), batch)
    assert whole.keys() == micro.keys() and whole
    for name, g in whole.items():
        torch.testing.assert_close(micro[name], g, rtol=1e-4, atol=1e-7, msg=name)
    assert max(float(g.abs().max()) for g in whole.values()) > 0


def test_bf16_training_syncs_within_its_tolerance(
    trl: ModuleType, base_model: Path, tmp_path: Path
) -> None:
    import torch

    from rollwire.trainer.references import engine_reference
    from rollwire_trl.policy_trainer import tolerance_for

    trainer = _trainer(base_model, tmp_path / "bf16", bf16=True)
    assert next(trainer.model.parameters()).dtype == torch.bfloat16
    assert trainer.tolerance == tolerance_for(True) > tolerance_for(False)
    stats = trainer.update(_batch())
    assert stats["grad_norm"] > 0
    exported = trainer.export(1)
    assert Path(exported.weights).is_absolute()
    prompt, completion = [5, 17, 42, 99], [7, 64, 120, 33]
    served = engine_reference(exported.weights)(prompt, completion)
    trained = trainer.reference()(prompt, completion)
    assert max(abs(a - b) for a, b in zip(served, trained)) < trainer.tolerance


def test_the_reference_scores_in_eval_mode_and_leaves_the_model_training(
    trl: ModuleType, base_model: Path, tmp_path: Path
) -> None:
    trainer = _trainer(base_model, tmp_path / "ref")
    model = trainer.model
    for m in model.modules():  # attention dropout: a training-mode forward is noisy
        if hasattr(m, "attention_dropout"):
            m.attention_dropout = 0.5
    model.train()
    score = trainer.reference()
    prompt, completion = [5, 17, 42, 99, 3, 8], [7, 64, 120, 33]
    first, second = score(prompt, completion), score(prompt, completion)
    assert first == second  # no dropout: scored in eval mode
    assert model.training  # ... and handed back in training mode
    device = next(model.parameters()).device
    seen: list[Any] = []
    hook = model.register_forward_pre_hook(
        lambda _m, args, kwargs: seen.append(kwargs["input_ids"].device), with_kwargs=True
    )
    try:
        score(prompt, completion)
    finally:
        hook.remove()
    assert seen == [device]  # the ids were built on the model's device


def test_a_failed_sync_is_one_line_and_exit_code_1(trl: ModuleType, tmp_path: Path) -> None:
    import subprocess
    import sys

    rollwire = str(Path(sys.executable).with_name("rollwire"))
    args = [rollwire, "train", "--out", str(tmp_path / "run"), "--steps", "1", "--warmup-steps",
            "0", "--eval-size", "2", "--eval-k", "1", "--no-progress", "--verify-tolerance", "0"]  # fmt: skip
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "weight sync failed" in lines[0], proc.stderr
    assert "tolerance 0" in lines[0] and "--resume" in lines[0]


def test_sft_warms_a_given_model_up_from_a_conversations_file(
    trl: ModuleType, base_model: Path, tmp_path: Path
) -> None:
    import orjson
    from safetensors.numpy import load_file

    from rollwire.envs.lockbox import warmup_conversations

    sft = tmp_path / "teacher.jsonl"
    chats = warmup_conversations(16, teacher_accuracy=1.0, seed=0)
    sft.write_bytes(b"".join(orjson.dumps({"messages": c}) + b"\n" for c in chats))
    from rollwire_trl.policy_trainer import TrlTrainer

    spec = RunSpec(out=tmp_path / "run", model=base_model, sft=sft, warmup_steps=5)
    start = TrlTrainer(spec).start(spec)
    assert start.warmup_steps == 5 and start.warmup_loss is not None
    warmed = Path(start.weights)
    assert warmed == (tmp_path / "run" / "warmup").resolve()
    before, after = (
        load_file(str(base_model / "model.safetensors")),
        load_file(str(warmed / "model.safetensors")),
    )
    assert any(not (before[k] == after[k]).all() for k in before)
