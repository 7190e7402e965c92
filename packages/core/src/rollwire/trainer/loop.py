"""``rollwire train``'s loop, once, for every trainer.

Each step: roll a batch of task groups out through the gateway (the agent's own code, the
servers sampling) → rows and advantages (:func:`~rollwire.trainer.train_batch.build_train_batch`,
the same for every trainer) → the trainer's update → its weights exported → pushed to every
server and verified against the trainer (:class:`~rollwire.trainer.weight_sync.WeightSync`) →
stamped as the gateway's policy version → held-out evaluation every ``eval_every`` steps. With
``async_rollouts`` the next step's batch rolls out while this one trains, at most
``max_staleness`` versions behind.

A trainer plugs in through :class:`PolicyTrainer` (the ``rollwire.trainers`` entry point's
``policy_trainer(spec)``); everything else — the task, sampling, the step record, the files of
the run folder — is here.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from rollwire.data.protocol import CaptureMode, Group
from rollwire.trainer.roles import Roles
from rollwire.trainer.rollouts_ahead import RolloutsAhead
from rollwire.trainer.steps import (
    Progress,
    StepRecord,
    batch_figures,
    batch_warnings,
    policy_versions,
    step_line,
)
from rollwire.trainer.train_batch import Algorithm, TrainBatch, build_train_batch
from rollwire.trainer.training_run import (
    StepLog,
    TrainResult,
    datasets,
    default_rates,
    evaluator,
    finish_run,
    measure_baseline,
    prepare_out,
    rollout_client,
    write_heldout,
)
from rollwire.trainer.weight_sync import DEFAULT_PROBE_IDS, Reference, SyncReport, WeightSync

__all__ = ["Export", "PolicyTrainer", "RunSpec", "Start", "StepTrace", "default_rates", "run"]

log = logging.getLogger("rollwire.train")


@dataclass
class RunSpec:
    """One ``rollwire train`` run: what every trainer shares (``options``: the trainer's own)."""

    out: Path
    trainer: str = "trl"
    task: str = "lockbox"
    agent: str | None = None
    tasks: list[dict[str, Any]] | None = None
    eval_tasks: list[dict[str, Any]] | None = None
    #: a model folder to start from (None: the embedded engine's model after a warm-up)
    model: Path | None = None
    #: a vLLM server serving ``model`` (None: the embedded engine, or the trainer's own sampler)
    backend: str | None = None
    steps: int = 40
    tasks_per_step: int = 4
    group_size: int = 8
    learning_rate: float = 1e-3
    #: Adam's first-moment decay. 0 (no momentum): a step whose groups all tie (no advantage, no
    #: gradient) leaves the weights alone, where momentum would keep moving them
    adam_beta1: float = 0.0
    #: KL penalty to the starting policy (k3, as TRL's; 0: none)
    beta: float = 0.0
    #: LoRA rank (0: full weights; None: the trainer's default)
    lora_rank: int | None = None
    #: one policy (LoRA adapter) per role, the model name its calls ask for (None: one policy)
    roles: list[str] | None = None
    #: the run's sampling temperature, which the trainer scores at
    temperature: float = 1.0
    #: None: the agent's own (a built-in task's agent asks for its own)
    max_tokens: int | None = None
    top_p: float | None = None
    #: conversations (JSONL, OpenAI messages) for the supervised warm-up, for any model
    sft: Path | None = None
    warmup_steps: int = 150
    warmup_learning_rate: float = 3e-3
    #: conversations per warm-up step
    warmup_batch_size: int = 32
    teacher_accuracy: float = 0.3
    eval_every: int = 5
    eval_size: int = 64
    eval_k: int = 4
    save_every: int = 5
    seed: int = 0
    resume: bool = False
    async_rollouts: bool = False
    max_staleness: int = 1
    #: rows per forward/backward pass (0: the whole step's rows in one); gradients accumulate
    micro_batch_size: int = 0
    bf16: bool = False
    #: the largest |server - trainer| probe log-prob difference a sync accepts (None: the
    #: trainer's default for its dtypes)
    verify_tolerance: float | None = None
    scale_advantages: bool = True
    failed_rollouts: Literal["baseline", "drop"] = "baseline"
    metrics: str | None = None
    progress: bool = True
    verbose: bool = False
    concurrency: int = 64
    #: seconds one rollout may take (the agent stops it, the rollout fails and, in an
    #: evaluation, counts as a miss)
    deadline: float = 300.0
    #: the trainer's own options (``rollwire train --trainer NAME --help-trainer``)
    options: dict[str, Any] = field(default_factory=dict)
    log: Callable[[str], None] = print
    on_step: Callable[[StepTrace], None] | None = None

    @property
    def algorithm(self) -> Algorithm:
        """The choices every trainer makes alike."""
        return Algorithm(self.scale_advantages, self.failed_rollouts)

    @property
    def sampling(self) -> dict[str, Any]:
        """What the run sets on every call: its temperature, and what the user set; the agent
        keeps everything else (its ``max_tokens``, ``stop``, ``top_p``)."""
        out: dict[str, Any] = {"temperature": self.temperature}
        if self.max_tokens is not None:
            out["max_tokens"] = self.max_tokens
        if self.top_p is not None:
            out["top_p"] = self.top_p
        return out


@dataclass
class Start:
    """Where a run's policy starts, as the trainer set it up."""

    #: what the servers must serve before step 1 (a folder, or a service's checkpoint path)
    weights: str
    version: str
    #: the step a resumed run continues after (0: a new run)
    step: int = 0
    #: a server the trainer brings (a gateway backend entry: ``url``, ``kind``, ...); None: the
    #: embedded engine serving ``weights`` (or ``RunSpec.backend``)
    backend: dict[str, Any] | None = None
    #: a Hugging Face tokenizer (fork classification, the probe's prompt)
    tokenizer: Any = None
    #: a LoRA adapter (PEFT folder) the servers load on ``weights`` before step 1 (a resumed run
    #: whose exports are adapters)
    adapter: str | None = None
    #: one LoRA adapter (PEFT folder) per policy name (``RunSpec.roles``), each loaded on
    #: ``weights`` as ``<name>@<version>`` and verified through it before step 1 (a resumed run
    #: of several policies)
    adapters: dict[str, str] | None = None
    warmup_steps: int = 0
    warmup_loss: float | None = None
    warmup_seconds: float = 0.0


@dataclass
class Export:
    """The trainer's weights after a step, for the servers: a model folder (``kind="full"``) or
    a PEFT LoRA folder the servers load on their base as ``<policy>@<version>`` (``adapter``)."""

    weights: str
    version: str
    seconds: float = 0.0
    kind: Literal["full", "adapter"] = "full"
    #: the role whose adapter this is (``RunSpec.roles``; None: the one policy)
    role: str | None = None


class PolicyTrainer(Protocol):
    """What a trainer gives the loop. ``capture`` is how the gateway captures for it."""

    capture: CaptureMode
    #: the probe tolerance for the trainer's and servers' dtypes (``--verify-tolerance`` wins)
    tolerance: float

    def start(self, spec: RunSpec) -> Start:
        """Set up the starting policy (a warm-up, a resumed checkpoint) and say where it is."""
        ...

    def update(self, batch: TrainBatch) -> dict[str, float]:
        """One optimizer step on ``batch``'s rows; its statistics (``loss``, ``grad_norm``,
        :func:`~rollwire.trainer.train_batch.behaviour_stats`'s, ...)."""
        ...

    def export(self, step: int) -> Export:
        """The weights after ``step`` steps, where the servers can load them."""
        ...

    def reference(self) -> Reference:
        """Scores ids with the trainer's current weights (the sync's verification)."""
        ...

    def save(self, step: int) -> None:
        """A checkpoint a ``resume`` continues from (weights, optimizer, step)."""
        ...

    def finish(self) -> Path:
        """The trained policy (a model folder, or a file naming the service's checkpoint)."""
        ...

    def close(self) -> None:
        """Release what the trainer holds (servers it started, clients)."""
        ...


@dataclass
class StepTrace:
    """Everything one step saw, for a caller's ``on_step`` (tests check rows against rollouts)."""

    step: int
    groups: list[Group]
    batch: TrainBatch
    stats: dict[str, float]
    sync: SyncReport
    record: StepRecord


def _probe_ids(tokenizer: Any, held: list[dict[str, Any]]) -> list[int]:
    """The first held-out prompt as the policy sees it (the probe stays in the rollouts' shapes),
    else a fixed prompt."""
    prompt = held[0].get("prompt") if held else None
    if tokenizer is None or not isinstance(prompt, str):
        return list(DEFAULT_PROBE_IDS)
    try:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
        )
    except Exception:  # no chat template: the fixed prompt
        return list(DEFAULT_PROBE_IDS)
    ids = ids if isinstance(ids, list) else ids["input_ids"]
    return [int(t) for t in ids]


@contextlib.contextmanager
def _serving(spec: RunSpec, start: Start) -> Iterator[Any]:
    """A gateway in front of the trainer's server, ``spec.backend``, or the embedded engine."""
    from rollwire.gateway import serve_in_thread

    with contextlib.ExitStack() as stack:
        if start.backend is not None:
            backend: dict[str, Any] = dict(start.backend)
        elif spec.backend is not None:
            backend = {"url": spec.backend.rstrip("/"), "kind": "vllm"}
        else:
            from rollwire.engine import EmbeddedEngine, EngineConfig

            # the trainer scores at the sampling temperature: so must the engine's log-probs
            mode: Literal["raw", "processed"] = "raw" if spec.temperature == 1.0 else "processed"
            engine = stack.enter_context(
                EmbeddedEngine(
                    EngineConfig(
                        model_dir=Path(start.weights),
                        seed=spec.seed,
                        logprobs_mode=mode,
                        weight_version=start.version,
                    )
                )
            )
            backend = {"url": engine.url, "kind": "vllm"}
        yield stack.enter_context(serve_in_thread(backends=[backend]))


def _step_tasks(
    spec: RunSpec, train_tasks: list[dict[str, Any]], step: int
) -> list[dict[str, Any]]:
    per = spec.tasks_per_step
    return [train_tasks[i % len(train_tasks)] for i in range((step - 1) * per, step * per)]


def _record(
    step: int,
    batch: TrainBatch,
    stats: dict[str, float],
    report: SyncReport,
    times: dict[str, float],
) -> StepRecord:
    figures = batch_figures(batch.rollouts, batch.sampled_tokens)
    sync = {k: float(v) for k, v in report.summary().items()}
    return StepRecord(
        step=step,
        reward_mean=figures["reward_mean"],
        reward_std=figures["reward_std"],
        pass_rate=figures["pass_rate"],
        rollouts=len(batch.rollouts),
        failed=int(figures["failed"]),
        sampled_tokens=batch.sampled_tokens,
        trained_tokens=batch.trained_tokens,
        prefill_tokens=batch.prefill_tokens,
        truncated_calls=batch.truncated_calls,
        rows=len(batch.rows),
        forked=batch.forked,
        tool_offered_calls=batch.tools.offered,
        tool_calls_parsed=batch.tools.parsed,
        tool_call_text_unparsed=batch.tools.unparsed,
        flags=batch.tools.flags(),
        rollout_s=times["rollout"],
        rollout_wait_s=times["wait"],
        train_s=times["train"],
        sync_s=times["sync"],
        wall_s=times["wall"],
        tokens_per_s=batch.sampled_tokens / times["rollout"] if times["rollout"] else 0.0,
        policy_versions=policy_versions(batch.rollouts),
        trainer=stats,
        sync=sync,
    )


class _Loop:
    """One run's servers, clients and logs (set up in ``__init__``), and its steps."""

    def __init__(
        self, spec: RunSpec, trainer: PolicyTrainer, start: Start, held: list[dict[str, Any]],
        stack: contextlib.ExitStack,
    ) -> None:  # fmt: skip
        from rollwire.trainer.gateway_client import GatewayClient

        self.spec, self.trainer, self.start = spec, trainer, start
        gateway = stack.enter_context(_serving(spec, start))
        self.control = GatewayClient(gateway.url, gateway.admin_key)
        tolerance = spec.verify_tolerance
        self.sync = WeightSync(
            self.control,
            reference=trainer.reference(),
            probe_ids=_probe_ids(start.tokenizer, held),
            probe_tokens=8,
            tolerance=trainer.tolerance if tolerance is None else tolerance,
            # the adapters of the versions a rollout may still be sampled at stay loaded
            max_staleness=spec.max_staleness if spec.async_rollouts else 0,
        )
        spec.log(_sampling_line(spec))
        # before step 1 the servers serve what the trainer holds, verified, and every call is
        # labelled with the starting version (a resumed LoRA run: its base, then its adapter;
        # a resumed run of roles: its base, then each role's adapter)
        adapted = bool(start.adapter or start.adapters)
        self.sync.sync(start.weights, start.version, seq=start.step, verify=not adapted)
        if start.adapter:
            self.sync.sync(start.adapter, start.version, seq=start.step, kind="adapter")
        self.roles = Roles(spec, trainer, self.sync) if spec.roles else None
        if start.adapters:
            if self.roles is None:
                raise ValueError(
                    f"the trainer started adapters for {sorted(start.adapters)} but the run has "
                    "no --roles: give the roles the run was started with"
                )
            self.roles.push(start.adapters, start.version, start.step)
        self.client = rollout_client(spec, gateway, capture=trainer.capture)
        stack.callback(self.client.close)
        self.evaluate = evaluator(spec, self.client, held)
        baseline = measure_baseline(spec, self.evaluate)
        self.log = StepLog(spec.out, baseline, upto=start.step)
        self.progress = Progress(spec.steps, start.step, spec.progress, spec.metrics)
        stack.callback(self.progress.close)
        if start.step == 0:
            self.progress.log_eval(baseline)
        self.ahead_client: Any = None
        if spec.async_rollouts:
            self.ahead_client = rollout_client(
                spec, gateway, capture=trainer.capture, max_staleness=spec.max_staleness
            )
            stack.callback(self.ahead_client.close)
        self.rollouts_dir = spec.out / "rollouts"
        self.rollouts_dir.mkdir(exist_ok=True)

    def steps(self, train_tasks: list[dict[str, Any]]) -> None:
        """Steps ``start.step + 1`` .. ``spec.steps``, each on the next ``tasks_per_step`` tasks."""
        spec = self.spec
        ahead: RolloutsAhead | None = None
        for step in range(self.start.step + 1, spec.steps + 1):
            t0 = time.perf_counter()
            if ahead is not None:
                groups = ahead.wait()
                rollout_s = ahead.seconds
            else:
                groups = self.client.run(_step_tasks(spec, train_tasks, step))
                rollout_s = time.perf_counter() - t0
            ahead = None
            if self.ahead_client is not None and step < spec.steps:
                ahead = RolloutsAhead(self.ahead_client, _step_tasks(spec, train_tasks, step + 1))
            self.step(step, groups, {"rollout": rollout_s, "wait": time.perf_counter() - t0})
        if ahead is not None:
            ahead.wait()

    def step(self, step: int, groups: list[Group], times: dict[str, float]) -> None:
        """Train on ``groups``, push and verify, record; ``times`` holds the rollout's figures."""
        spec, trainer = self.spec, self.trainer
        t1 = time.perf_counter()
        _keep_rollouts(self.rollouts_dir / f"step-{step}.jsonl", groups)
        tok = _fork_tokenizer(self.start.tokenizer)
        batch = build_train_batch(groups, spec.algorithm, tokenizer=tok)
        if not batch.rows:
            raise ValueError(
                f"step {step}: no rollout of the batch can be trained on "
                f"({_reasons(batch.skipped)}); check the agent and the gateway's log"
            )
        if self.roles is not None:  # each role's adapter on its own rows, pushed and verified
            stats, reports, roles, saved = self.roles.step(step, groups, spec.algorithm, tok)
            report, t2 = SyncReport(version=str(step)), time.perf_counter()
            train_end = t2 - sum(r.push_seconds + r.verify_seconds for r in reports)
        else:
            stats = trainer.update(batch)
            exported = trainer.export(step)
            t2 = train_end = time.perf_counter()
            saved = exported.seconds
            if self.ahead_client is not None:  # the staleness bound counts from the trainer
                self.control.set_trainer_version(step, exported.version)
            report = self.sync.sync(
                exported.weights, exported.version, seq=step, kind=exported.kind
            )
            report.save_seconds = exported.seconds
        if step % spec.save_every == 0 or step == spec.steps:
            trainer.save(step)
        t3 = time.perf_counter()
        times["train"] = max(0.0, train_end - t1 - saved)
        times["sync"] = saved + (t3 - train_end)
        times["wall"] = times["wait"] + (t3 - t1)
        record = _record(step, batch, stats, report, times)
        if self.roles is not None:
            self.roles.fill(record, roles, reports)
        if spec.eval_every and step % spec.eval_every == 0:
            record.eval = self.evaluate(step)
        self.log.emit(record)
        self.progress.update(record)
        spec.log(step_line(record, spec.steps))
        for line in batch_warnings(step, batch):
            spec.log(line)
        if spec.on_step is not None:
            spec.on_step(StepTrace(step, groups, batch, stats, report, record))


def _sampling_line(spec: RunSpec) -> str:
    return (
        f"sampling: temperature {spec.temperature:g} (the trainer scores at it)"
        + (f", max_tokens {spec.max_tokens}" if spec.max_tokens is not None else "")
        + (f", top_p {spec.top_p:g}" if spec.top_p is not None else "")
        + "; everything else as the agent asks"
    )


def run(spec: RunSpec, trainer: PolicyTrainer) -> TrainResult:
    """Run the loop of the module docstring with ``trainer``; see :class:`RunSpec`."""
    started = time.perf_counter()
    prepare_out(spec)
    train_tasks, held = datasets(spec)
    write_heldout(spec.out, held)
    try:
        start = trainer.start(spec)
        with contextlib.ExitStack() as stack:
            loop = _Loop(spec, trainer, start, held, stack)
            loop.steps(train_tasks)
            final = loop.log.final(spec.steps, loop.evaluate)
        final_path = trainer.finish()
    finally:
        trainer.close()
    policy = _StartInfo(start.warmup_steps, start.warmup_loss)
    log = loop.log
    wall = time.perf_counter() - started
    result = TrainResult(log.evals[0], final, log.records, policy, final_path, wall, log.evals)
    return finish_run(spec.out, result, {"trainer": spec.trainer, "roles": spec.roles})


@dataclass
class _StartInfo:
    warmup_steps: int
    warmup_loss: float | None


def _reasons(skipped: dict[str, str]) -> str:
    counts: dict[str, int] = {}
    for why in skipped.values():
        counts[why] = counts.get(why, 0) + 1
    return ", ".join(f"{n} with {why}" for why, n in counts.items())


def _fork_tokenizer(tokenizer: Any) -> Any:
    from rollwire.data.trajectory import TokenizerLike

    return tokenizer if isinstance(tokenizer, TokenizerLike) else None


def _keep_rollouts(path: Path, groups: Sequence[Group]) -> None:
    """``rollouts/step-N.jsonl``: exactly what the step trained on, for ``rollwire inspect``."""
    from rollwire.data.dataset import write_jsonl

    write_jsonl(path, groups)
