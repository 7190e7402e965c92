"""``rollwire train --trainer tinker``: the RL loop of ``rollwire train`` with a Tinker service as
the trainer and its sampler as the inference server.

The task, the agent, the datasets, held-out evaluation, ``steps.jsonl`` and the report are the
TRL loop's (:mod:`rollwire.trainer.training_run`). Each step: the agents roll a batch of task
groups out through the gateway, whose ``tinker`` backend samples with the current sampler
checkpoint (tokens mode: the gateway renders the chat template, the sampler returns ids and
log-probs); the captured rows become datums (:func:`~rollwire_tinker.datums.to_datums`, GRPO
advantages); ``forward_backward`` (``importance_sampling`` on the captured log-probs, or
``ppo``), ``optim_step``, ``save_weights_for_sampler``; then one ``WeightSync`` call swaps the
gateway's sampler to that checkpoint, probes it against the trainer's own forward pass and
stamps the checkpoint's name as the policy version. The built-in task starts with a supervised
warm-up through the same service (:mod:`rollwire_tinker.warmup`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from rollwire.trainer.training_run import (
    StepLog,
    TrainResult,
    datasets,
    evaluator,
    finish_run,
    measure_baseline,
    prepare_out,
    rollout_client,
    task_module,
)
from rollwire_tinker.service import Service, tinker_service
from rollwire_tinker.steps import StepTrace, run_steps
from rollwire_tinker.trainer import LossFn, TinkerConfig, TinkerTrainer, tinker_reference
from rollwire_tinker.warmup import tinker_warmup

__all__ = ["StartingPoint", "StepTrace", "TinkerTrainSpec", "train"]


@dataclass
class TinkerTrainSpec:
    """One ``rollwire train --trainer tinker`` run (the CLI's options, Tinker's own at the end)."""

    out: Path
    task: str = "lockbox"
    agent: str | None = None
    tasks: list[dict[str, Any]] | None = None
    eval_tasks: list[dict[str, Any]] | None = None
    #: a local model folder for SkyRL's server started here (without ``base_url``)
    model: Path | None = None
    steps: int = 40
    tasks_per_step: int = 4
    group_size: int = 8
    learning_rate: float = 1e-3
    #: Adam's first-moment decay in the RL phase: 0, as the TRL loop (a step whose groups all
    #: tie has no gradient, and momentum alone would keep moving the policy)
    adam_beta1: float = 0.0
    temperature: float = 1.0
    max_tokens: int = 8
    warmup_steps: int = 150
    warmup_learning_rate: float = 3e-3
    teacher_accuracy: float = 0.3
    eval_every: int = 5
    eval_size: int = 64
    eval_k: int = 4
    seed: int = 0
    resume: bool = False
    metrics: str | None = None
    progress: bool = True
    verbose: bool = False
    concurrency: int = 64
    #: the Tinker service (None: start SkyRL's server here) and the model it trains
    base_url: str | None = None
    base_model: str | None = None
    api_key: str | None = None
    lora_rank: int = 8
    loss_fn: LossFn = "importance_sampling"
    #: the largest |sampler - trainer| log-prob difference the probe accepts: two code paths
    probe_tolerance: float = 0.05
    #: SkyRL's ``sample_max_num_sequences``: one padded batch shape, compiled once
    max_batch: int = 32
    on_step: Callable[[StepTrace], None] | None = None
    log: Callable[[str], None] = print


@dataclass
class StartingPoint:
    """Where the policy started: the service's base model, after the warm-up if any."""

    base_model: str
    model_path: str
    warmup_steps: int = 0
    warmup_loss: float | None = None
    warmup_seconds: float = 0.0
    warmup_losses: list[float] = field(default_factory=list)


def _check(spec: TinkerTrainSpec) -> None:
    if spec.resume:
        raise ValueError(
            "--resume is not supported with --trainer tinker: start a new --out (the service "
            "keeps the sampler checkpoints of the old run)"
        )
    if spec.loss_fn not in ("importance_sampling", "ppo"):
        raise ValueError(f"loss_fn must be importance_sampling or ppo, got {spec.loss_fn!r}")


def _tokenizer(service: Service) -> Any:
    from rollwire.gateway.tokens.render import ChatRenderer

    return ChatRenderer.from_dir(service.tokenizer).tokenizer


def _start(
    spec: TinkerTrainSpec, trainer: TinkerTrainer, tokenizer: Any, service: Service
) -> StartingPoint:
    """The warm-up (the built-in task on the embedded model, as the TRL loop's), then the
    sampler checkpoint step 1 samples with."""
    point = StartingPoint(service.base_model, "")
    embedded = spec.model is None and spec.base_url is None
    if spec.warmup_steps and spec.agent is None and embedded:
        conversations = task_module(spec).warmup_conversations(
            spec.warmup_steps * 32, teacher_accuracy=spec.teacher_accuracy, seed=spec.seed
        )
        warm = tinker_warmup(
            trainer.training_client,
            tokenizer,
            conversations,
            steps=spec.warmup_steps,
            learning_rate=spec.warmup_learning_rate,
            seed=spec.seed,
        )
        point.warmup_steps, point.warmup_loss = warm.steps, warm.loss
        point.warmup_seconds, point.warmup_losses = warm.seconds, warm.losses
        spec.log(
            f"warm-up: {warm.steps} cross_entropy steps in {warm.seconds:.0f} s, "
            f"loss {warm.losses[0]:.3f} -> {warm.loss:.3f}"
        )
    point.model_path = trainer.save_sampler(trainer.version_name(0))
    return point


def _probe_ids(tokenizer: Any, held: list[dict[str, Any]]) -> list[int]:
    """The first held-out prompt as the policy sees it: the probe stays in the rollouts' shapes."""
    prompt = held[0].get("prompt") if held else None
    if not isinstance(prompt, str):
        from rollwire.trainer.weight_sync import DEFAULT_PROBE_IDS

        return list(DEFAULT_PROBE_IDS)
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
    )
    ids = ids if isinstance(ids, list) else ids["input_ids"]
    return [int(t) for t in ids]


def train(spec: TinkerTrainSpec) -> TrainResult:
    """Run the loop of the module docstring; see :class:`TinkerTrainSpec`."""
    from rollwire.gateway import serve_in_thread
    from rollwire.trainer.gateway_client import GatewayClient
    from rollwire.trainer.steps import Progress
    from rollwire.trainer.weight_sync import WeightSync

    _check(spec)
    started = time.perf_counter()
    prepare_out(spec)
    train_tasks, held = datasets(spec)
    with contextlib.ExitStack() as stack:
        service = stack.enter_context(
            tinker_service(
                spec.out,
                base_url=spec.base_url,
                base_model=spec.base_model,
                model=spec.model,
                seed=spec.seed,
                lora_rank=spec.lora_rank,
                max_batch=spec.max_batch,
            )
        )
        trainer = TinkerTrainer(_config(spec, service))
        tokenizer = _tokenizer(service)
        start = _start(spec, trainer, tokenizer, service)
        backend = {
            "url": service.base_url,
            "kind": "tinker",
            "name": "tinker",
            "model": start.model_path,
            "tokenizer": service.tokenizer,
        }
        gateway = stack.enter_context(serve_in_thread(backends=[backend]))
        sync = WeightSync(
            GatewayClient(gateway.url, gateway.admin_key),
            reference=tinker_reference(trainer.training_client),
            probe_ids=_probe_ids(tokenizer, held),
            probe_tokens=spec.max_tokens,
            tolerance=spec.probe_tolerance,
        )
        # the start-up check and the first stamp: every call is labelled with a checkpoint
        sync.sync(start.model_path, trainer.version_name(0), seq=0)
        client = rollout_client(spec, gateway, capture="tokens")
        stack.callback(client.close)
        evaluate = evaluator(spec, client, held)
        baseline = measure_baseline(spec, evaluate)
        log = StepLog(spec.out, baseline)
        progress = Progress(spec.steps, 0, spec.progress, spec.metrics)
        stack.callback(progress.close)
        progress.log_eval(baseline)
        run_steps(spec, trainer, client, sync, train_tasks, evaluate, log, progress)
        final = log.final(spec.steps, evaluate)
    final_file = spec.out / "final.json"
    final_file.write_bytes(orjson.dumps(_final(spec, service, trainer), option=orjson.OPT_INDENT_2))
    wall = time.perf_counter() - started
    result = TrainResult(baseline, final, log.records, start, final_file, wall, log.evals)
    return finish_run(spec.out, result, {"trainer": "tinker", **_final(spec, service, trainer)})


def _config(spec: TinkerTrainSpec, service: Service) -> TinkerConfig:
    return TinkerConfig(
        base_model=service.base_model,
        base_url=service.base_url,
        api_key=spec.api_key or ("tml-rollwire" if service.local else None),
        lora_rank=spec.lora_rank,
        seed=spec.seed,
        loss_fn=spec.loss_fn,
        learning_rate=spec.learning_rate,
        beta1=spec.adam_beta1,
        beta2=0.999,
        named_checkpoints=True,
    )


def _final(spec: TinkerTrainSpec, service: Service, trainer: TinkerTrainer) -> dict[str, Any]:
    return {
        "base_url": service.base_url,
        "base_model": service.base_model,
        "lora_rank": spec.lora_rank,
        "loss_fn": spec.loss_fn,
        "policy_version": trainer.policy_version,
        "model_path": trainer.model_path,
        "local_server": service.local,
    }
