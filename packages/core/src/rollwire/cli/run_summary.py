"""What ``rollwire run`` and ``rollwire eval`` add after their own summary: the drift report and
the metrics sink (``--metrics tensorboard:DIR | mlflow:URI | wandb:DIR``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape

from rollwire.data.protocol import Group

if TYPE_CHECKING:
    from rollwire.evaluation import EvalResult

__all__ = ["METRICS_HELP", "log_eval", "report_run"]

METRICS_HELP = "Log statistics to tensorboard:DIR, mlflow:URI_OR_DIR or wandb:DIR (offline)."


def _sink(spec: str) -> Any:
    from rollwire.metrics_sinks import make_sink

    return make_sink(spec)


def report_run(
    console: Console,
    groups: Sequence[Group],
    wall_s: float,
    metrics: str | None = None,
    tokenizer: Any = None,
) -> None:
    """Print the drift report of ``groups``; log their statistics to ``metrics`` when given."""
    from rollwire.data.trajectory import TrajectoryBuilder
    from rollwire.report.summary import drift_report

    builder = TrajectoryBuilder(tokenizer=tokenizer)
    rows = {r.rollout_id: builder.build(r) for g in groups for r in g.rollouts}
    drift = drift_report(groups, rows)
    if drift:
        console.print("[bold]drift[/bold] (forks by class; `rollwire inspect` shows each one):")
        for d in drift:
            console.print(
                escape(
                    f"  {d.kind}: {d.count} forks in {d.rollouts} rollouts, "
                    f"{d.tokens_lost} trainable tokens lost — {d.advice}"
                )
            )
    else:
        console.print("drift: none (every call extended its row)")
    if metrics:
        from rollwire.metrics_sinks import step_metrics

        sink = _sink(metrics)
        try:
            sink.log(step_metrics(groups, rows_by_rollout=rows, wall_s=wall_s), 0)
            versions = {c.policy_version for g in groups for r in g.rollouts for c in r.calls}
            versions.discard(None)
            if versions:
                sink.set_tags({"policy_version": ",".join(sorted(str(v) for v in versions))})
        finally:
            sink.close()
        console.print(f"logged this run's statistics to {escape(metrics)}")


def log_eval(console: Console, result: EvalResult, metrics: str) -> None:
    """Log every setting's figures (``eval/<setting>/...``) to the sink ``metrics``."""
    figures: dict[str, float] = {}
    for s in result.settings:
        p = f"eval/{s.setting.name}/"
        figures[p + "mean_reward"] = s.mean_reward.value
        figures[p + "success_rate"] = s.success_rate.value
        figures[p + "failed"] = float(s.failed)
        for k, e in s.pass_at_k.items():
            figures[p + f"pass@{k}"] = e.value
    sink = _sink(metrics)
    try:
        sink.log(figures, 0)
    finally:
        sink.close()
    console.print(f"logged the evaluation to {escape(metrics)}")
