"""``rollwire train``: the whole RL loop on one machine — server, gateway, agent, TRL.

Each step: the rollout_func runs a batch of task groups through the gateway (the agent's own
code, the server sampling), TRL's GRPO updates the policy from the captured ids, log-probs and
masks, the new weights are saved and pushed to the server (the sync hook) and stamped as the
gateway's policy version; every ``eval_every`` steps the held-out tasks are evaluated (pass@k,
as ``rollwire eval``). The baseline is the same evaluation before step 1.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rollwire.trainer.training_run import (
    TASKS,
    StepLog,
    TrainResult,
    datasets,
    evaluator,
    finish_run,
    measure_baseline,
    prepare_out,
    rollout_client,
    task_module,
    write_heldout,
)
from rollwire_trl.policy import StartingPolicy, resumed_policy, warmed_up_policy
from rollwire_trl.sync import SyncHook, save_policy

__all__ = ["TASKS", "TrainResult", "TrainSpec", "train"]

#: TRL's importance-sampling modes, and "off"
IMPORTANCE_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "off")


@dataclass
class TrainSpec:
    """Everything one ``rollwire train`` run needs (the CLI's options)."""

    out: Path
    task: str = "lockbox"
    agent: str | None = None
    tasks: list[dict[str, Any]] | None = None
    eval_tasks: list[dict[str, Any]] | None = None
    model: Path | None = None
    backend: str | None = None
    steps: int = 40
    tasks_per_step: int = 4
    group_size: int = 8
    learning_rate: float = 1e-3
    #: AdamW's first-moment decay. 0 (no momentum): a step whose groups all tie (no advantage,
    #: no gradient) leaves the weights alone, where momentum would keep pushing them along the
    #: last update's direction — seen to wreck a solved policy of the tiny model in a few steps
    adam_beta1: float = 0.0
    beta: float = 0.0
    #: LoRA rank (peft, every linear layer; alpha = 2 x rank); 0 trains the full weights
    lora_rank: int = 0
    temperature: float = 1.0
    max_tokens: int = 8
    warmup_steps: int = 150
    warmup_learning_rate: float = 3e-3
    teacher_accuracy: float = 0.3
    eval_every: int = 5
    eval_size: int = 64
    eval_k: int = 4
    importance_sampling: str = "token_truncate"
    is_clip_max: float = 3.0
    save_every: int = 5
    seed: int = 0
    resume: bool = False
    metrics: str | None = None
    progress: bool = True
    verbose: bool = False
    concurrency: int = 64
    #: roll out the next step's batch while this one trains (``--async``), at most
    #: ``max_staleness`` policy versions behind the trainer
    async_rollouts: bool = False
    max_staleness: int = 1
    #: replaces the default sync (reload on every server + policy version) — e.g. WeightSync.sync
    sync: SyncHook | None = None
    log: Callable[[str], None] = print


def _starting_policy(spec: TrainSpec) -> StartingPolicy:
    start = _starting_policy_fresh(spec)
    return resumed_policy(spec.out, start) if spec.resume else start


def _starting_policy_fresh(spec: TrainSpec) -> StartingPolicy:
    if spec.model is not None:
        return StartingPolicy(Path(spec.model))
    conversations = task_module(spec).warmup_conversations(
        max(1, spec.warmup_steps) * 32, teacher_accuracy=spec.teacher_accuracy, seed=spec.seed
    )
    return warmed_up_policy(
        spec.out,
        conversations,
        seed=spec.seed,
        steps=spec.warmup_steps,
        learning_rate=spec.warmup_learning_rate,
    )


@contextlib.contextmanager
def _serving(spec: TrainSpec, policy: StartingPolicy) -> Iterator[tuple[str, Any]]:
    """The server (embedded engine on the starting weights, or ``spec.backend``) and a gateway."""
    from rollwire.gateway import serve_in_thread

    with contextlib.ExitStack() as stack:
        if spec.backend is None:
            from rollwire.engine import EmbeddedEngine, EngineConfig

            # TRL scores at the sampling temperature: the engine's log-probs must be too
            logprobs: Literal["raw", "processed"] = (
                "raw" if spec.temperature == 1.0 else "processed"
            )
            engine = stack.enter_context(
                EmbeddedEngine(
                    EngineConfig(
                        model_dir=policy.folder,
                        seed=spec.seed,
                        logprobs_mode=logprobs,
                        # the engine reports its weights' version on every answer, and the
                        # gateway records what the server says it served: a resumed run's
                        # engine serves the checkpoint's step, not "0"
                        weight_version=str(policy.step),
                    )
                )
            )
            url = engine.url
        else:
            url = spec.backend.rstrip("/")
        gateway = stack.enter_context(serve_in_thread(backends=[(url, "vllm")]))
        yield url, gateway


def train(spec: TrainSpec) -> TrainResult:
    """Run the loop described in the module docstring; see :class:`TrainSpec`."""
    from rollwire_trl.trainer_setup import Progress, build_trainer, serve_starting_policy

    if spec.importance_sampling not in IMPORTANCE_MODES:
        raise ValueError(
            f"importance_sampling must be one of {IMPORTANCE_MODES}, got {spec.importance_sampling!r}"
        )
    if spec.lora_rank < 0:
        raise ValueError(
            f"lora_rank must be 0 (full weights) or a positive rank, got {spec.lora_rank}"
        )
    if spec.lora_rank and spec.resume:
        raise ValueError(
            "--resume continues full-weight runs only: a LoRA run's checkpoints hold adapters; "
            "start a new run from its final/ folder with --model instead"
        )
    started = time.perf_counter()
    if not spec.verbose:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # weight loading and saving, at every step
    prepare_out(spec)
    train_tasks, held = datasets(spec)
    write_heldout(spec.out, held)
    policy = _starting_policy(spec)
    with _serving(spec, policy) as (server_url, gateway):
        serve_starting_policy(spec, policy, gateway, server_url)
        client = rollout_client(spec, gateway)
        evaluate = evaluator(spec, client, held)
        baseline = measure_baseline(spec, evaluate)
        log = StepLog(spec.out, baseline, upto=policy.step)
        progress = Progress(spec.steps, policy.step, spec.progress, spec.metrics)
        if policy.step == 0:
            progress.log_eval(baseline)
        ahead = (
            rollout_client(spec, gateway, max_staleness=spec.max_staleness)
            if spec.async_rollouts
            else None
        )
        trainer = build_trainer(
            spec,
            policy,
            client,
            gateway,
            server_url,
            train_tasks,
            evaluate,
            log.emit,
            progress,
            ahead,
        )
        try:
            checkpoint = policy.checkpoint
            trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
        finally:
            if ahead is not None:
                trainer.rollout_func.close()
                ahead.close()
            progress.close()
            client.close()
        final = log.final(spec.steps, evaluate)
        final_dir = save_policy(trainer.model, spec.out / "final", policy.tokenizer_folder)
    wall = time.perf_counter() - started
    result = TrainResult(baseline, final, log.records, policy, final_dir, wall, log.evals)
    return finish_run(spec.out, result)
