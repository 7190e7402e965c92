"""The steps of ``rollwire train --trainer tinker``: roll out, train on the datums, swap the
sampler, record. Each step's :class:`~rollwire.trainer.steps.StepRecord` carries the Tinker
step's statistics under the names the TRL loop uses (``loss``, ``kl_behaviour``,
``is_ratio_min``/``_mean``/``_max``, ``clip_ratio``), so the report reads both alike.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rollwire.data.protocol import Group
from rollwire.trainer.steps import (
    EvalPoint,
    StepRecord,
    batch_figures,
    policy_versions,
    step_line,
)
from rollwire.trainer.weight_sync import SyncReport
from rollwire_tinker.datums import DatumBuild, to_datums
from rollwire_tinker.trainer import StepResult

if TYPE_CHECKING:
    from rollwire.trainer.training_run import StepLog
    from rollwire_tinker.loop import TinkerTrainSpec
    from rollwire_tinker.trainer import TinkerTrainer

__all__ = ["StepTrace", "run_steps", "trainer_stats"]

#: the Tinker step's statistics kept in a record, under the TRL loop's names
_NAMES = {
    "loss": "loss",
    "kl_behaviour": "kl_behaviour",
    "ratio_min": "is_ratio_min",
    "ratio_mean": "is_ratio_mean",
    "ratio_max": "is_ratio_max",
    "logprob_mismatch_abs": "logp_diff_mean",
    "clip_fraction": "clip_ratio",
}


@dataclass
class StepTrace:
    """Everything one step saw, for a caller's ``on_step`` (tests check datums against rows)."""

    step: int
    groups: list[Group]
    build: DatumBuild
    result: StepResult
    sync: SyncReport
    record: StepRecord


def trainer_stats(result: StepResult) -> dict[str, float]:
    """A step's statistics for its record: the named ones, then every other metric the service
    sent, and the datum and token counts."""
    out = {name: result.metrics[key] for key, name in _NAMES.items() if key in result.metrics}
    out.update({k: v for k, v in result.metrics.items() if k not in _NAMES})
    out["datums"] = float(result.num_datums)
    out["trained_tokens"] = float(result.trained_tokens)
    return out


def run_steps(
    spec: TinkerTrainSpec,
    trainer: TinkerTrainer,
    client: Any,
    sync: Any,
    train_tasks: list[dict[str, Any]],
    evaluate: Callable[[int], EvalPoint],
    log: StepLog,
    progress: Any,
) -> None:
    """Steps 1..``spec.steps``, each on the next ``tasks_per_step`` training tasks."""
    per = spec.tasks_per_step
    for step in range(1, spec.steps + 1):
        tasks = [train_tasks[i % len(train_tasks)] for i in range((step - 1) * per, step * per)]
        t0 = time.perf_counter()
        groups = client.run(tasks)
        t1 = time.perf_counter()
        build = to_datums(groups)
        if not build.datums:
            raise RuntimeError(
                f"step {step}: no rollout of the batch can be trained on ({build.skipped}); "
                "check the agent and the gateway's log"
            )
        result = trainer.step(build.datums)
        t2 = time.perf_counter()
        assert result.model_path is not None  # named_checkpoints: a path the gateway swaps to
        report = sync.sync(result.model_path, result.policy_version, seq=step)
        t3 = time.perf_counter()
        rollouts = [r for g in groups for r in g.rollouts]
        figures = batch_figures(rollouts, result.trained_tokens)
        save_s = result.seconds.get("save_sampler", 0.0)
        record = StepRecord(
            step=step,
            reward_mean=figures["reward_mean"],
            reward_std=figures["reward_std"],
            pass_rate=figures["pass_rate"],
            rollouts=len(rollouts),
            failed=int(figures["failed"]),
            sampled_tokens=result.trained_tokens,
            rollout_s=t1 - t0,
            train_s=max(0.0, t2 - t1 - save_s),
            sync_s=save_s + (t3 - t2),
            tokens_per_s=result.trained_tokens / (t1 - t0) if t1 > t0 else 0.0,
            policy_versions=policy_versions(rollouts),
            trl=trainer_stats(result),
        )
        if spec.eval_every and step % spec.eval_every == 0:
            record.eval = evaluate(step)
        log.emit(record)
        progress.update(record)
        spec.log(step_line(record, spec.steps))
        if spec.on_step is not None:
            spec.on_step(StepTrace(step, groups, build, result, report, record))
