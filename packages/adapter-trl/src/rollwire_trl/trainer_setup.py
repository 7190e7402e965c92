"""TRL's side of ``rollwire train``: the GRPO configuration, the trainer and its callbacks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollwire.trainer.steps import EvalPoint, Progress, StepRecord, step_line
from rollwire_trl.rollout import RolloutFunction, rollwire_reward
from rollwire_trl.steps import StepReporter
from rollwire_trl.sync import SyncHook, WeightSyncCallback, http_weight_sync

if TYPE_CHECKING:
    from rollwire_trl.loop import TrainSpec
    from rollwire_trl.policy import StartingPolicy

__all__ = ["Progress", "build_trainer", "grpo_config", "step_line"]


def grpo_config(spec: TrainSpec) -> Any:
    """The ``GRPOConfig`` of a run: one generation batch per optimizer step, on the CPU unless
    a GPU is there, float32, TRL's behaviour-policy correction on the captured log-probs."""
    import torch
    from trl import GRPOConfig

    correction = spec.importance_sampling != "off"
    return GRPOConfig(
        output_dir=str(spec.out / "checkpoints"),
        use_cpu=not torch.cuda.is_available(),
        bf16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=spec.tasks_per_step * spec.group_size,
        num_generations=spec.group_size,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_iterations=1,
        max_steps=spec.steps,
        learning_rate=spec.learning_rate,
        adam_beta1=spec.adam_beta1,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        beta=spec.beta,
        temperature=spec.temperature,
        max_completion_length=256,
        logging_steps=1,
        report_to=[],
        disable_tqdm=True,
        save_strategy="steps",
        save_steps=spec.save_every,
        save_total_limit=2,
        seed=spec.seed,
        data_seed=spec.seed,
        dataloader_num_workers=0,
        vllm_importance_sampling_correction=correction,
        vllm_importance_sampling_mode=spec.importance_sampling if correction else "token_truncate",
        vllm_importance_sampling_clip_max=spec.is_clip_max,
    )


def _sync_hook(spec: TrainSpec, gateway: Any, model: Any) -> SyncHook:
    """``spec.sync``, else rollwire's WeightSync: every server behind the gateway reloads the
    folder and is verified against the live trainer model before the step's version is stamped."""
    if spec.sync is not None:
        return spec.sync
    from rollwire.trainer.gateway_client import GatewayClient
    from rollwire.trainer.references import transformers_reference
    from rollwire.trainer.weight_sync import WeightSync

    weight_sync = WeightSync(
        GatewayClient(gateway.url, gateway.admin_key), reference=transformers_reference(model)
    )
    weight_sync.check()  # before step 1: the servers serve what the trainer holds

    def sync(folder: Path, version: str) -> dict[str, float]:
        return weight_sync.sync(folder, version).summary()

    return sync


def build_trainer(
    spec: TrainSpec,
    policy: StartingPolicy,
    client: Any,
    gateway: Any,
    server_url: str,
    train_tasks: list[dict[str, Any]],
    evaluate: Callable[[int], EvalPoint],
    emit: Callable[[StepRecord], None],
    progress: Progress,
) -> Any:
    """The trainer, wired to rollwire; ``emit`` gets each step's record."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback

    from rollwire_trl.trainer import RollwireGRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(policy.tokenizer_folder)
    model = AutoModelForCausalLM.from_pretrained(policy.folder, dtype=torch.float32)
    if spec.backend is not None:  # a server of its own: make it serve the starting weights
        (
            spec.sync
            or http_weight_sync([server_url], gateway=gateway.url, admin_key=gateway.admin_key)
        )(policy.folder, str(policy.step))
    else:
        gateway_version(gateway, str(policy.step))
    sync = _sync_hook(spec, gateway, model)

    def on_record(record: StepRecord) -> None:
        emit(record)
        progress.update(record)
        spec.log(step_line(record, spec.steps))

    reporter = StepReporter(on_record, evaluate=evaluate, eval_every=spec.eval_every)
    rollout = RolloutFunction(
        client, tasks=train_tasks, key="task_id", tokenizer=tokenizer, on_batch=reporter.on_batch
    )
    syncer = WeightSyncCallback(
        sync, spec.out / "policy", tokenizer_dir=policy.tokenizer_folder, on_sync=reporter.on_sync
    )
    dataset = Dataset.from_list([{"prompt": str(t["task_id"])} for t in train_tasks])
    trainer = RollwireGRPOTrainer(
        model=model,
        args=grpo_config(spec),
        processing_class=tokenizer,
        reward_funcs=[rollwire_reward],
        train_dataset=dataset,
        rollout_func=rollout,
        callbacks=[syncer, reporter],
    )
    trainer.remove_callback(PrinterCallback)  # the step lines above replace its dicts
    return trainer


def gateway_version(gateway: Any, version: str) -> None:
    """Stamp the gateway's policy version (the embedded engine already serves those weights)."""
    from rollwire.trainer.gateway_client import GatewayClient

    GatewayClient(gateway.url, gateway.admin_key).set_policy_version(version)
