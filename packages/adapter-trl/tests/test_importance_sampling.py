"""TRL's importance-sampling correction runs against the log-probs rollwire captured.

The engine keeps serving the starting weights while the trainer's copy is changed (a
deliberately stale behaviour policy): the ratios ``exp(trainer - captured)`` then differ from 1,
and each ``vllm_importance_sampling_mode`` truncates or masks them as TRL documents. With the
same weights on both sides the ratios are 1.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from rollwire.envs.lockbox import make_tasks

CLIP_MIN, CLIP_MAX = 0.5, 1.5
GROUP = 4
#: a first rollout through a cold gateway, TRL's set-up, on a loaded 2-core machine
pytestmark = pytest.mark.timeout(900)


def _trainer(
    trl: ModuleType, base_model: Path, client: Any, tmp: Path, mode: str, stale: bool
) -> Any:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rollwire_trl import RolloutFunction, RollwireGRPOTrainer, rollwire_reward

    tasks = make_tasks(2, "train", seed=3)
    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
    if stale:  # the trainer moved on; the server did not get the new weights
        with torch.no_grad():
            model.lm_head.weight.mul_(1.6)
    args = trl.GRPOConfig(
        output_dir=str(tmp),
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=len(tasks) * GROUP,
        num_generations=GROUP,
        max_steps=1,
        report_to=[],
        vllm_importance_sampling_correction=mode != "off",
        vllm_importance_sampling_mode=mode if mode != "off" else "token_truncate",
        vllm_importance_sampling_clip_min=CLIP_MIN,
        vllm_importance_sampling_clip_max=CLIP_MAX,
    )
    trainer = RollwireGRPOTrainer(
        model=model,
        args=args,
        processing_class=AutoTokenizer.from_pretrained(base_model),
        reward_funcs=[rollwire_reward],
        train_dataset=Dataset.from_list([{"prompt": t["task_id"]} for t in tasks]),
        rollout_func=RolloutFunction(client, tasks=tasks, key="task_id"),
    )
    trainer.model.train()  # as in a training step: TRL files the step's metrics under "train"
    inputs = [{"prompt": t["task_id"]} for t in tasks for _ in range(GROUP)]
    return trainer, inputs


def _raw_ratios(out: dict[str, Any], sequence: bool) -> tuple[Any, Any]:
    import torch

    mask = out["completion_mask"] * out["tool_mask"]
    diff = (out["old_per_token_logps"] - out["sampling_per_token_logps"]) * mask
    if sequence:
        return torch.exp(diff.sum(-1, keepdim=True)), torch.ones_like(diff[:, :1]).bool()
    return torch.exp(diff), mask.bool()


@pytest.mark.parametrize(
    "mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
)
def test_stale_behaviour_policy_is_truncated_or_masked(
    trl: ModuleType, base_model: Path, serving: dict[str, Any], tmp_path: Path, mode: str
) -> None:
    import torch

    trainer, inputs = _trainer(trl, base_model, serving["client"], tmp_path, mode, stale=True)
    out = trainer._generate_and_score_completions(inputs)
    raw, where = _raw_ratios(out, sequence=mode.startswith("sequence"))
    got = out["importance_sampling_ratio"]
    assert got.shape == raw.shape
    kept = raw[where]
    # the captured log-probs are the stale policy's: far from the trainer's on some tokens
    assert bool(((kept < CLIP_MIN) | (kept > CLIP_MAX)).any()), kept
    if mode.endswith("truncate"):
        # TRL: clamp(ratio, min=clip_min, max=clip_max)
        expected = torch.clamp(raw, min=CLIP_MIN, max=CLIP_MAX)
        assert float(got[where].max()) <= CLIP_MAX + 1e-6
    else:
        # TRL: a ratio outside [clip_min, clip_max] becomes 0 (its token/sequence is dropped)
        outside = (raw < CLIP_MIN) | (raw > CLIP_MAX)
        expected = raw.masked_fill(outside, 0.0)
        assert bool((got[where] == 0).any())
    torch.testing.assert_close(got[where], expected[where], rtol=1e-5, atol=1e-6)
    logged = trainer._metrics["train"]
    assert logged["sampling/importance_sampling_ratio/max"][-1] <= CLIP_MAX + 1e-6
    assert logged["rollwire/kl_behaviour"][-1] > 1e-3


def test_synced_behaviour_policy_gives_ratios_of_one(
    trl: ModuleType, base_model: Path, serving: dict[str, Any], tmp_path: Path
) -> None:
    trainer, inputs = _trainer(
        trl, base_model, serving["client"], tmp_path, "token_truncate", stale=False
    )
    out = trainer._generate_and_score_completions(inputs)
    raw, where = _raw_ratios(out, sequence=False)
    assert int(where.sum()) > 0
    assert float((raw[where] - 1).abs().max()) < 1e-3  # engine and trainer agree token by token
    assert trainer._metrics["train"]["rollwire/kl_behaviour"][-1] < 1e-6


def test_off_ignores_the_captured_log_probs(
    trl: ModuleType, base_model: Path, serving: dict[str, Any], tmp_path: Path
) -> None:
    trainer, inputs = _trainer(trl, base_model, serving["client"], tmp_path, "off", stale=True)
    out = trainer._generate_and_score_completions(inputs)
    assert "importance_sampling_ratio" not in out
    assert not trainer.use_vllm
