"""The parts of ``rollwire train``'s loop (:mod:`rollwire.trainer.loop`) around the steps: the
built-in tasks (entry point group ``rollwire.tasks``) and their datasets, the rollout client,
held-out evaluation, the run folder, the baseline, ``steps.jsonl`` and the result files
(``summary.json``, ``report.html``). :class:`TrainSettings` lists what is read here.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson

from rollwire.data.protocol import CaptureMode
from rollwire.data.warmup import Conversation
from rollwire.trainer.steps import EvalPoint, StepRecord, read_steps, record_from_json, write_step

__all__ = [
    "TASK_GROUP",
    "StepLog",
    "TrainResult",
    "TrainSettings",
    "datasets",
    "default_rates",
    "evaluator",
    "finish_run",
    "latest_checkpoint",
    "measure_baseline",
    "prepare_out",
    "rollout_client",
    "task_module",
    "task_names",
    "warmup_conversations",
    "write_heldout",
]

#: entry point group of the built-in tasks: each names a module with ``AGENT`` (its agent's
#: ``module:app``), ``make_tasks(n, split, seed)`` and ``warmup_conversations(n, ...)``
TASK_GROUP = "rollwire.tasks"


class TrainSettings(Protocol):
    """The settings of a ``rollwire train`` run that the shared parts read."""

    out: Path
    task: str
    agent: str | None
    tasks: list[dict[str, Any]] | None
    eval_tasks: list[dict[str, Any]] | None
    steps: int
    tasks_per_step: int
    group_size: int
    temperature: float
    eval_size: int
    eval_k: int
    seed: int
    resume: bool
    concurrency: int
    deadline: float

    @property
    def log(self) -> Callable[[str], None]:
        """Where progress lines go."""

    @property
    def sampling(self) -> dict[str, Any]:
        """What the run sets on every call (the agent keeps the rest)."""


def task_names() -> dict[str, str]:
    """The built-in tasks: name -> module (entry points of :data:`TASK_GROUP`)."""
    from importlib import metadata

    return {ep.name: ep.value for ep in metadata.entry_points(group=TASK_GROUP)}


def default_rates(model: Path | None, lora_rank: int | None) -> dict[str, float | int]:
    """``learning_rate``, ``warmup_learning_rate`` and ``warmup_batch_size`` for a run that does
    not set them: the embedded engine's tiny random model learns at 1e-3 (its warm-up at 3e-3,
    32 conversations a step); a real model's pretrained weights would be wrecked at those rates
    (SmolLM2-135M stops emitting its tool-call format), so a ``model`` trains its full weights
    at 1e-5 and LoRA adapters at 1e-4, and warms up at 1e-4 on 8 conversations a step."""
    if model is None:
        return {"learning_rate": 1e-3, "warmup_learning_rate": 3e-3, "warmup_batch_size": 32}
    return {
        "learning_rate": 1e-4 if lora_rank else 1e-5,
        "warmup_learning_rate": 1e-4,
        "warmup_batch_size": 8,
    }


def task_module(settings: TrainSettings) -> Any:
    """The module of the built-in task (``AGENT``, ``make_tasks``, ``warmup_conversations``)."""
    names = task_names()
    if settings.task not in names:
        raise ValueError(f"unknown task {settings.task!r}: built in are {sorted(names)}")
    return importlib.import_module(names[settings.task])


def warmup_conversations(settings: Any) -> list[Conversation] | None:
    """The supervised warm-up's conversations: the ``--sft`` file (``teacher``: the built-in
    task's teacher, written to ``OUT/sft.jsonl``), else the built-in task's teacher when the run
    starts from the embedded engine's random model; None: no warm-up."""
    teacher = settings.sft is not None and str(settings.sft) == "teacher"
    if settings.sft is not None and not teacher:
        from rollwire.data.warmup import read_conversations

        return read_conversations(settings.sft)
    if not teacher and (settings.model is not None or not settings.warmup_steps):
        return None
    conversations: list[Conversation] = task_module(settings).warmup_conversations(
        max(settings.warmup_steps, 1) * 32,
        teacher_accuracy=settings.teacher_accuracy,
        seed=settings.seed,
    )
    if teacher:
        Path(settings.out).mkdir(parents=True, exist_ok=True)
        (Path(settings.out) / "sft.jsonl").write_bytes(
            b"".join(orjson.dumps(c) + b"\n" for c in conversations)
        )
    return conversations


def datasets(settings: TrainSettings) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(training tasks, held-out tasks)``: the given ones, else the built-in task's (seeded);
    every training task gets a ``task_id``."""
    train_tasks, held = settings.tasks, settings.eval_tasks
    if train_tasks is None or held is None:
        module = task_module(settings)
        if train_tasks is None:
            n = settings.steps * settings.tasks_per_step
            train_tasks = module.make_tasks(n, "train", settings.seed)
        if held is None:
            held = module.make_tasks(settings.eval_size, "heldout", settings.seed + 1)
    assert train_tasks is not None and held is not None
    for i, t in enumerate(train_tasks):
        t.setdefault("task_id", f"train-{i}")
    return train_tasks, held


def rollout_client(
    settings: TrainSettings,
    gateway: Any,
    *,
    capture: CaptureMode = "passthrough",
    max_staleness: int | None = None,
) -> Any:
    """A :class:`~rollwire.trainer.client.RolloutClient` running the agent in this process
    (``max_staleness``: the bound of its rollouts, as ``RolloutClient``'s)."""
    from rollwire.agent.app import load_app
    from rollwire.trainer.client import RolloutClient
    from rollwire.trainer.runners import LocalRunner

    agent = settings.agent or task_module(settings).AGENT
    return RolloutClient(
        gateway,
        runner=LocalRunner(load_app(agent)),
        group_size=settings.group_size,
        sampling=settings.sampling,
        capture=capture,
        concurrency=settings.concurrency,
        deadline=settings.deadline,
        max_staleness=max_staleness,
    )


def evaluator(
    settings: TrainSettings, client: Any, held: list[dict[str, Any]]
) -> Callable[[int], EvalPoint]:
    """``evaluate(step)``: pass@k of the held-out tasks at the run's sampling settings. A
    rollout that failed (its deadline, an error) counts as a miss; how many did is recorded and
    said, so a slow server is not read as a policy that forgot its task."""

    def evaluate(step: int) -> EvalPoint:
        t0 = time.perf_counter()
        result = client.evaluate(held, [settings.sampling], k=settings.eval_k)
        point = EvalPoint.from_result(step, result, time.perf_counter() - t0)
        if point.failed:
            settings.log(
                f"    held-out evaluation at step {step}: {point.failed} of {point.attempts} "
                "rollouts failed and count as misses (not the policy's answers); a slow server: "
                f"raise --deadline ({settings.deadline:g} s a rollout) or lower --concurrency "
                f"({settings.concurrency})"
            )
        return point

    return evaluate


def write_heldout(out: Path, held: list[dict[str, Any]]) -> None:
    """``heldout.jsonl``: the held-out tasks, for ``rollwire eval --tasks`` on any checkpoint."""
    (out / "heldout.jsonl").write_bytes(b"".join(orjson.dumps(t) + b"\n" for t in held))


def prepare_out(settings: TrainSettings) -> None:
    """Create the run folder; refuse one that holds another run unless resuming."""
    settings.out.mkdir(parents=True, exist_ok=True)
    if settings.resume:
        return
    leftovers = [
        p.name
        for p in settings.out.iterdir()
        if p.name in ("checkpoints", "steps.jsonl", "rollouts")
    ]
    if leftovers:
        raise ValueError(
            f"{settings.out} already holds a run ({', '.join(leftovers)}): pass --resume to "
            "continue it, or choose another --out"
        )


def latest_checkpoint(folder: Path) -> tuple[Path, int] | None:
    """The newest ``step-N`` checkpoint under ``folder`` (one with a ``state.json``) and its step;
    None when there is none. Trainers write them; ``--resume`` continues from it."""
    found = []
    for p in folder.glob("step-*"):
        if (p / "state.json").is_file() and p.name[5:].isdigit():
            found.append((int(p.name[5:]), p))
    if not found:
        return None
    step, path = max(found)
    return path, step


def measure_baseline(settings: TrainSettings, evaluate: Callable[[int], EvalPoint]) -> EvalPoint:
    """Held-out evaluation before step 1 (``baseline.json``; read back when resuming)."""
    path = settings.out / "baseline.json"
    if settings.resume and path.exists():
        return EvalPoint(**orjson.loads(path.read_bytes()))
    point = evaluate(0)
    path.write_bytes(orjson.dumps(asdict(point)))
    settings.log(
        f"baseline before step 1: held-out pass@1 {point.pass_at_1:.3f} "
        f"[{point.pass_at_1_low:.3f}, {point.pass_at_1_high:.3f}] over {point.attempts} attempts"
    )
    return point


class StepLog:
    """``steps.jsonl`` and the evaluations of a run: the records kept from a resumed run's steps
    up to ``upto``, then each new record as it is emitted."""

    def __init__(self, out: Path, baseline: EvalPoint, *, upto: int = 0) -> None:
        self.path = out / "steps.jsonl"
        self.records = [record_from_json(r) for r in read_steps(self.path, upto=upto)]
        self.path.write_bytes(b"".join(orjson.dumps(asdict(r)) + b"\n" for r in self.records))
        self.evals = [baseline] + [r.eval for r in self.records if r.eval is not None]

    def emit(self, record: StepRecord) -> None:
        """Append ``record`` (and its evaluation, if any)."""
        self.records.append(record)
        write_step(self.path, record)
        if record.eval is not None:
            self.evals.append(record.eval)

    def final(self, steps: int, evaluate: Callable[[int], EvalPoint]) -> EvalPoint:
        """The evaluation after the last step: the step's own, else a new one."""
        if self.evals[-1].step == steps:
            return self.evals[-1]
        point = evaluate(steps)
        self.evals.append(point)
        return point


@dataclass
class TrainResult:
    """What a run did: the baseline and final held-out evaluations, every step, the files."""

    baseline: EvalPoint
    final: EvalPoint
    steps: list[StepRecord]
    #: where the policy started (``warmup_steps``, ``warmup_loss``: what was done to it first)
    policy: Any
    #: the trained policy: a model folder, or a file naming the service's checkpoint
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


def finish_run(out: Path, result: TrainResult, extra: dict[str, Any] | None = None) -> TrainResult:
    """Write ``summary.json`` (plus ``extra`` keys) and ``report.html``; returns ``result``."""
    summary = {**result.summary(), **(extra or {})}
    (out / "summary.json").write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    from rollwire.report.training import write_training_report

    write_training_report(out)
    return result
