"""What ``rollwire train`` records about each step, whichever trainer runs it (TRL, Tinker): one
:class:`StepRecord` per optimizer step in ``steps.jsonl``, held-out :class:`EvalPoint`\\ s.

A step's time splits into **rollout** (agents, gateway, servers), **train** (the trainer's
forward and backward passes and its optimizer) and **sync** (getting the new weights to the
servers, verification included).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from rollwire.data.protocol import Rollout

__all__ = [
    "EvalPoint",
    "Progress",
    "StepRecord",
    "batch_figures",
    "batch_warnings",
    "policy_versions",
    "read_steps",
    "record_from_json",
    "step_line",
    "write_step",
]


@dataclass
class EvalPoint:
    """Held-out evaluation after ``step`` optimizer steps (0 = the baseline before step 1)."""

    step: int
    pass_at_1: float
    pass_at_1_low: float
    pass_at_1_high: float
    mean_reward: float
    tasks: int
    attempts: int
    seconds: float
    pass_at_k: dict[str, float] = field(default_factory=dict)
    #: attempts whose rollout failed (deadline, error): counted as misses above
    failed: int = 0

    @classmethod
    def from_result(cls, step: int, result: Any, seconds: float) -> EvalPoint:
        """From an :class:`~rollwire.evaluation.EvalResult` of one setting."""
        s = result.settings[0]
        rate = s.success_rate
        return cls(
            step=step,
            pass_at_1=rate.value,
            pass_at_1_low=rate.low,
            pass_at_1_high=rate.high,
            mean_reward=s.mean_reward.value,
            tasks=s.tasks,
            attempts=s.attempts,
            seconds=seconds,
            pass_at_k={str(k): e.value for k, e in s.pass_at_k.items()},
            failed=s.failed,
        )


@dataclass
class StepRecord:
    """One optimizer step: rollouts, the trainer's statistics, timing."""

    step: int
    reward_mean: float
    reward_std: float
    pass_rate: float
    rollouts: int
    failed: int
    #: tokens the policy sampled in the step's rollouts
    sampled_tokens: int
    rollout_s: float
    train_s: float
    sync_s: float
    tokens_per_s: float
    #: of ``rollout_s``, the time the step waited for its rollouts (less when they ran ahead)
    rollout_wait_s: float = 0.0
    #: the whole step, from its start to its end
    wall_s: float = 0.0
    #: of ``sampled_tokens``, those that carried loss
    trained_tokens: int = 0
    #: prompt tokens sent to the servers (what a managed service bills as prefill)
    prefill_tokens: int = 0
    #: calls that stopped at their token limit (``finish_reason="length"``)
    truncated_calls: int = 0
    #: training rows (a rollout gives one per conversation it held)
    rows: int = 0
    #: rollouts that gave more than one row (a side call, a fork)
    forked: int = 0
    #: calls whose request offered tools; tool calls the server parsed; answers holding
    #: tool-call-shaped text that did not parse (drift into text, a parser mismatch)
    tool_offered_calls: int = 0
    tool_calls_parsed: int = 0
    tool_call_text_unparsed: int = 0
    #: what is wrong with this step's batch, by name: ``no_tool_calls_parsed`` (tools were
    #: offered and the server parsed none: a parser that does not read the model's format, or
    #: tool calls drifted into text), ``tool_call_text_unparsed`` (some answers hold tool calls
    #: the server did not parse)
    flags: list[str] = field(default_factory=list)
    #: the policy versions the gateway stamped on this step's calls (the previous step's)
    policy_versions: list[str] = field(default_factory=list)
    #: the trainer's statistics under rollwire's names (``loss``, ``grad_norm``, and
    #: ``kl_behaviour``, ``is_ratio_*``, ``logp_diff_*`` as ``behaviour_stats`` defines them)
    trainer: dict[str, float] = field(default_factory=dict)
    #: what the sync hook returned, when numbers (WeightSync: the stages save, drain, transfer,
    #: load, verify, the time split and the probe's server-vs-trainer log-prob difference)
    sync: dict[str, float] = field(default_factory=dict)
    #: one policy per role (``--roles``): role -> its ``calls``, ``rows``, ``rollouts``,
    #: ``sampled_tokens``, ``trained_tokens``, ``reward_mean``, the trainer's statistics of its
    #: update (``loss``, ...) and its sync (``version``, ``adapter``, ``verified``,
    #: ``probe_max_abs_diff``); None: one policy
    roles: dict[str, dict[str, Any]] | None = None
    eval: EvalPoint | None = None

    def flat(self) -> dict[str, float]:
        """Numbers for a metrics sink (``train/...``, ``eval/...``)."""
        out = {f"train/{k}": float(v) for k, v in asdict(self).items() if _number(v)}
        out.update({f"train/{k}": v for k, v in self.trainer.items()})
        out.update({k if "/" in k else f"sync/{k}": v for k, v in self.sync.items()})
        if self.eval is not None:
            out["eval/pass@1"] = self.eval.pass_at_1
            out["eval/mean_reward"] = self.eval.mean_reward
        out.pop("train/step", None)
        return out


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def policy_versions(rollouts: Sequence[Rollout]) -> list[str]:
    """The policy versions stamped on the calls of ``rollouts``, sorted."""
    found = {c.policy_version for r in rollouts for c in r.calls}
    return sorted(v for v in found if v is not None)


def batch_figures(
    rollouts: Sequence[Rollout], sampled_tokens: int, success_threshold: float = 1.0
) -> dict[str, float]:
    """Reward mean/std, pass rate and sampled tokens of one step's rollouts."""
    rewards = [r.reward if r.reward is not None else 0.0 for r in rollouts]
    n = max(1, len(rewards))
    mean = sum(rewards) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in rewards) / n)
    solved = sum(
        r.status == "completed" and x >= success_threshold for r, x in zip(rollouts, rewards)
    )
    return {
        "reward_mean": mean,
        "reward_std": std,
        "pass_rate": solved / n,
        "rollouts": float(len(rollouts)),
        "failed": float(sum(r.status != "completed" for r in rollouts)),
        "sampled_tokens": float(sampled_tokens),
    }


def write_step(path: Path, record: StepRecord) -> None:
    """Append ``record`` to a ``steps.jsonl``."""
    with path.open("ab") as f:
        f.write(orjson.dumps(asdict(record), option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")


def read_steps(path: Path, *, upto: int | None = None) -> list[dict[str, Any]]:
    """The records of a ``steps.jsonl`` (those of steps ``<= upto`` when given)."""
    if not path.exists():
        return []
    out = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    return [r for r in out if upto is None or int(r["step"]) <= upto]


def record_from_json(raw: dict[str, Any]) -> StepRecord:
    """A :class:`StepRecord` from one ``steps.jsonl`` line."""
    raw = dict(raw)
    if "trl" in raw:  # the name records of earlier runs used
        raw["trainer"] = raw.pop("trl")
    raw.pop("placeholders", None)
    ev = raw.pop("eval", None)
    record = StepRecord(**raw)
    record.eval = EvalPoint(**ev) if ev else None
    return record


def step_line(record: StepRecord, total: int) -> str:
    """One terminal line per step."""
    t = record.trainer
    line = (
        f"step {record.step:>3}/{total}  reward {record.reward_mean:.3f}±{record.reward_std:.3f}  "
        f"pass {record.pass_rate:.2f}  loss {t.get('loss', 0.0):+.4f}  "
        f"kl_behaviour {t.get('kl_behaviour', 0.0):.2e}  "
        f"is_ratio {t.get('is_ratio_min', 1.0):.2f}..{t.get('is_ratio_max', 1.0):.2f}  "
        f"clip {t.get('clip_ratio', 0.0):.3f}  "
        f"tokens {record.trained_tokens}/{record.sampled_tokens}  {record.tokens_per_s:.0f} tok/s  "
        f"rollout {record.rollout_s:.1f}s train {record.train_s:.1f}s sync {record.sync_s:.2f}s"
    )
    if record.eval is not None:
        e = record.eval
        line += (
            f"  | held-out pass@1 {e.pass_at_1:.3f} [{e.pass_at_1_low:.3f}, {e.pass_at_1_high:.3f}]"
        )
    return line


class Progress:
    """A progress bar on a terminal (rich), nothing on a pipe; plus the metrics sink, if any."""

    def __init__(self, total: int, done: int, enabled: bool, metrics: str | None) -> None:
        self._bar: Any = None
        self._task: Any = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            console = Console(stderr=True)
            if console.is_terminal:
                self._bar = RichProgress(
                    TextColumn("training"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TextColumn("{task.description}"),
                    TimeElapsedColumn(),
                    console=console,
                )
                self._task = self._bar.add_task("", total=total, completed=done)
                self._bar.start()
        self.sink: Any = None
        if metrics:
            from rollwire.metrics_sinks import make_sink

            self.sink = make_sink(metrics)

    def update(self, record: StepRecord) -> None:
        if self._bar is not None:
            desc = f"reward {record.reward_mean:.2f} pass {record.pass_rate:.2f}"
            self._bar.update(self._task, completed=record.step, description=desc)
        if self.sink is not None:
            self.sink.log(record.flat(), record.step)

    def log_eval(self, point: EvalPoint) -> None:
        if self.sink is not None:
            self.sink.log(
                {"eval/pass@1": point.pass_at_1, "eval/mean_reward": point.mean_reward}, point.step
            )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
        if self.sink is not None:
            self.sink.close()


def batch_warnings(step: int, batch: Any) -> list[str]:
    """The lines a step's :class:`~rollwire.trainer.train_batch.TrainBatch` calls for: sampled
    tokens without loss, tool calls that did not parse, calls cut at their token limit."""
    out = []
    gap = batch.gap_line()
    if gap:
        out.append(f"    step {step}: {gap}")
    tools = batch.tools
    if tools.none_parsed or tools.unparsed:
        out.append(
            f"    step {step}: tools were offered in {tools.offered} calls, {tools.parsed} tool "
            f"calls parsed, {tools.unparsed} answers hold tool-call text that did not parse"
            + (
                ": no tool call parsed — check the server's tool parser"
                if tools.none_parsed
                else ""
            )
        )
    if batch.truncated_calls:
        out.append(
            f"    step {step}: {batch.truncated_calls} calls stopped at their token limit "
            "(finish_reason=length): raise the agent's max_tokens, or --max-tokens"
        )
    return out
