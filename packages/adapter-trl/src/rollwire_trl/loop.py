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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson

from rollwire_trl.policy import StartingPolicy, resumed_policy, warmed_up_policy
from rollwire_trl.steps import EvalPoint, StepRecord, read_steps, write_step
from rollwire_trl.sync import SyncHook, save_policy

__all__ = ["TASKS", "TrainResult", "TrainSpec", "train"]

#: built-in tasks: the agent, and the module that makes tasks and warm-up conversations
TASKS: dict[str, dict[str, str]] = {
    "lockbox": {
        "agent": "rollwire.envs.lockbox.agent_openai:app",
        "module": "rollwire.envs.lockbox",
    },
    "calculator": {
        "agent": "rollwire.envs.calculator.agent_openai:app",
        "module": "rollwire.envs.calculator",
    },
}
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
    steps: int = 20
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


@dataclass
class TrainResult:
    """What a run did: the baseline and final held-out evaluations, every step, the files."""

    baseline: EvalPoint
    final: EvalPoint
    steps: list[StepRecord]
    policy: StartingPolicy
    final_dir: Path
    wall_s: float
    evals: list[EvalPoint] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The JSON written to ``summary.json``."""
        return {
            "baseline": asdict(self.baseline),
            "final": asdict(self.final),
            "evals": [asdict(e) for e in self.evals],
            "steps": len(self.steps),
            "warmup_steps": self.policy.warmup_steps,
            "warmup_loss": self.policy.warmup_loss,
            "final_dir": str(self.final_dir),
            "wall_s": self.wall_s,
        }


def _task_module(spec: TrainSpec) -> Any:
    import importlib

    if spec.task not in TASKS:
        raise ValueError(f"unknown task {spec.task!r}: built in are {sorted(TASKS)}")
    return importlib.import_module(TASKS[spec.task]["module"])


def _datasets(spec: TrainSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    train_tasks, held = spec.tasks, spec.eval_tasks
    if train_tasks is None or held is None:
        module = _task_module(spec)
        if train_tasks is None:
            train_tasks = module.make_tasks(spec.steps * spec.tasks_per_step, "train", spec.seed)
        if held is None:
            held = module.make_tasks(spec.eval_size, "heldout", spec.seed + 1)
    assert train_tasks is not None and held is not None
    for i, t in enumerate(train_tasks):
        t.setdefault("task_id", f"train-{i}")
    return train_tasks, held


def _starting_policy(spec: TrainSpec) -> StartingPolicy:
    start = _starting_policy_fresh(spec)
    return resumed_policy(spec.out, start) if spec.resume else start


def _starting_policy_fresh(spec: TrainSpec) -> StartingPolicy:
    if spec.model is not None:
        return StartingPolicy(Path(spec.model))
    conversations = _task_module(spec).warmup_conversations(
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


def _client(spec: TrainSpec, gateway: Any, max_staleness: int | None = None) -> Any:
    from rollwire.agent.app import load_app
    from rollwire.trainer.client import RolloutClient
    from rollwire.trainer.runners import LocalRunner

    agent = spec.agent or TASKS[spec.task]["agent"]
    return RolloutClient(
        gateway,
        runner=LocalRunner(load_app(agent)),
        group_size=spec.group_size,
        sampling={"temperature": spec.temperature, "max_tokens": spec.max_tokens},
        concurrency=spec.concurrency,
        deadline=300.0,
        max_staleness=max_staleness,
    )


def _evaluator(
    spec: TrainSpec, client: Any, held: list[dict[str, Any]]
) -> Callable[[int], EvalPoint]:
    def evaluate(step: int) -> EvalPoint:
        t0 = time.perf_counter()
        result = client.evaluate(
            held, [{"temperature": spec.temperature, "max_tokens": spec.max_tokens}], k=spec.eval_k
        )
        return EvalPoint.from_result(step, result, time.perf_counter() - t0)

    return evaluate


def _prepare_out(spec: TrainSpec) -> None:
    spec.out.mkdir(parents=True, exist_ok=True)
    if spec.resume:
        return
    leftovers = [p.name for p in spec.out.iterdir() if p.name in ("checkpoints", "steps.jsonl")]
    if leftovers:
        raise ValueError(
            f"{spec.out} already holds a run ({', '.join(leftovers)}): pass --resume to continue "
            "it, or choose another --out"
        )


def train(spec: TrainSpec) -> TrainResult:
    """Run the loop described in the module docstring; see :class:`TrainSpec`."""
    from rollwire_trl.trainer_setup import Progress, build_trainer

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
    _prepare_out(spec)
    train_tasks, held = _datasets(spec)
    # the held-out tasks, for `rollwire eval --tasks` on any checkpoint of the run
    (spec.out / "heldout.jsonl").write_bytes(b"".join(orjson.dumps(t) + b"\n" for t in held))
    policy = _starting_policy(spec)
    steps_path = spec.out / "steps.jsonl"
    with _serving(spec, policy) as (server_url, gateway):
        client = _client(spec, gateway)
        evaluate = _evaluator(spec, client, held)
        baseline = _baseline(spec, policy, evaluate)
        records = [_as_record(r) for r in read_steps(steps_path, upto=policy.step)]
        steps_path.write_bytes(b"".join(orjson.dumps(asdict(r)) + b"\n" for r in records))
        evals = [baseline] + [r.eval for r in records if r.eval is not None]

        def emit(record: StepRecord) -> None:
            records.append(record)
            write_step(steps_path, record)
            if record.eval is not None:
                evals.append(record.eval)

        progress = Progress(spec.steps, policy.step, spec.progress, spec.metrics)
        if policy.step == 0:
            progress.log_eval(baseline)
        ahead = _client(spec, gateway, spec.max_staleness) if spec.async_rollouts else None
        trainer = build_trainer(
            spec, policy, client, gateway, server_url, train_tasks, evaluate, emit, progress, ahead
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
        final = evals[-1] if evals[-1].step == spec.steps else evaluate(spec.steps)
        if final is not evals[-1]:
            evals.append(final)
        final_dir = save_policy(trainer.model, spec.out / "final", policy.tokenizer_folder)
    result = TrainResult(
        baseline, final, records, policy, final_dir, time.perf_counter() - started, evals
    )
    (spec.out / "summary.json").write_bytes(
        orjson.dumps(result.summary(), option=orjson.OPT_INDENT_2)
    )
    from rollwire.report.training import write_training_report

    write_training_report(spec.out)
    return result


def _baseline(
    spec: TrainSpec, policy: StartingPolicy, evaluate: Callable[[int], EvalPoint]
) -> EvalPoint:
    path = spec.out / "baseline.json"
    if spec.resume and path.exists():
        return EvalPoint(**orjson.loads(path.read_bytes()))
    point = evaluate(0)
    path.write_bytes(orjson.dumps(asdict(point)))
    spec.log(
        f"baseline before step 1: held-out pass@1 {point.pass_at_1:.3f} "
        f"[{point.pass_at_1_low:.3f}, {point.pass_at_1_high:.3f}] over {point.attempts} attempts"
    )
    return point


def _as_record(raw: dict[str, Any]) -> StepRecord:
    ev = raw.pop("eval", None)
    record = StepRecord(**raw)
    record.eval = EvalPoint(**ev) if ev else None
    return record
