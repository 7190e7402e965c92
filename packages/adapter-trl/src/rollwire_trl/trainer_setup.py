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

__all__ = [
    "Progress",
    "build_trainer",
    "grpo_config",
    "lora_config",
    "probe_mismatch",
    "serve_starting_policy",
    "step_line",
]


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
        before = probe_mismatch(weight_sync)  # the servers still on the last version
        # the step is the version's ordinal, what a staleness bound counts in
        seq = int(version) if version.isdigit() else None
        out: dict[str, float] = weight_sync.sync(folder, version, seq=seq).summary()
        out["sync/probe_before_max_abs_diff"] = before
        return out

    return sync


def probe_mismatch(weight_sync: Any) -> float:
    """The largest |server - trainer| log-prob over the sync's greedy probe on every server in
    rotation, without pushing: before a sync, how far the optimizer step moved the trainer from
    what the servers still serve (after it, the sync's own verification measures the same)."""
    worst = 0.0
    for b in weight_sync.backends():
        answer = weight_sync.gateway.probe_backend(
            b["name"], prompt_ids=weight_sync.probe_ids, max_tokens=weight_sync.probe_tokens
        )
        ids = [int(t) for t in answer["completion_ids"]]
        expected = weight_sync.reference(weight_sync.probe_ids, ids)
        diffs = [abs(float(a) - float(e)) for a, e in zip(answer["logprobs"], expected)]
        worst = max([worst, *diffs])
    return worst


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
    ahead_client: Any = None,
) -> Any:
    """The trainer, wired to rollwire; ``emit`` gets each step's record. ``ahead_client``
    (``--async``): the client the next step's rollouts run on while this step trains."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback

    from rollwire_trl.trainer import RollwireGRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(policy.tokenizer_folder)
    model = AutoModelForCausalLM.from_pretrained(policy.folder, dtype=torch.float32)
    sync = _sync_hook(spec, gateway, model)
    if spec.async_rollouts:
        sync = _posting_trainer_version(sync, gateway)

    def on_record(record: StepRecord) -> None:
        emit(record)
        progress.update(record)
        spec.log(step_line(record, spec.steps))

    reporter = StepReporter(on_record, evaluate=evaluate, eval_every=spec.eval_every)
    rollout: Any = RolloutFunction(
        client, tasks=train_tasks, key="task_id", tokenizer=tokenizer, on_batch=reporter.on_batch
    )
    if ahead_client is not None:
        from rollwire_trl.prefetch import AsyncRollouts

        rollout = AsyncRollouts(rollout, ahead_client)
    syncer = WeightSyncCallback(
        sync, spec.out / "policy", tokenizer_dir=policy.tokenizer_folder, on_sync=reporter.on_sync
    )
    dataset = Dataset.from_list([{"prompt": str(t["task_id"])} for t in train_tasks])
    trainer = RollwireGRPOTrainer(
        model=model,
        peft_config=lora_config(spec.lora_rank),
        args=grpo_config(spec),
        processing_class=tokenizer,
        reward_funcs=[rollwire_reward],
        train_dataset=dataset,
        rollout_func=rollout,
        callbacks=[syncer, reporter],
    )
    trainer.remove_callback(PrinterCallback)  # the step lines above replace its dicts
    return trainer


def lora_config(rank: int) -> Any:
    """peft's ``LoraConfig`` for ``rank`` on every linear layer (alpha 2 x rank), or None."""
    if not rank:
        return None
    try:
        from peft import LoraConfig
    except ImportError:
        raise ValueError(
            f"--lora-rank {rank} needs peft, which is not installed: pip install peft "
            "(or --lora-rank 0 to train the full weights)"
        ) from None
    return LoraConfig(
        r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules="all-linear",
        task_type="CAUSAL_LM",
    )  # fmt: skip


def serve_starting_policy(spec: TrainSpec, policy: StartingPolicy, gateway: Any, url: str) -> None:
    """Before the baseline: a server of its own (``--backend``) is pushed the starting weights
    (the warmed-up policy, a resumed checkpoint); the engine already serves them. Either way
    the gateway's version is the policy's step."""
    if spec.backend is not None:
        (spec.sync or http_weight_sync([url], gateway=gateway.url, admin_key=gateway.admin_key))(
            policy.folder, str(policy.step)
        )
    gateway_version(gateway, str(policy.step))


def gateway_version(gateway: Any, version: str) -> None:
    """Stamp the gateway's policy version (the embedded engine already serves those weights)."""
    from rollwire.trainer.gateway_client import GatewayClient

    seq = int(version) if version.isdigit() else None
    GatewayClient(gateway.url, gateway.admin_key).set_policy_version(version, seq=seq)


def _posting_trainer_version(sync: SyncHook, gateway: Any) -> SyncHook:
    """``sync`` that first tells the gateway the trainer holds step ``version``'s weights: the
    staleness bound of the rollouts running ahead is counted from it."""
    from rollwire.trainer.gateway_client import GatewayClient

    client = GatewayClient(gateway.url, gateway.admin_key)

    def posting(folder: Path, version: str) -> Any:
        client.set_trainer_version(int(version), version)
        return sync(folder, version)

    return posting
