"""The settings of an evaluation side by side, as a rich table."""

from __future__ import annotations

from rich.table import Table

from rollwire.evaluation.scoring import EvalResult

__all__ = ["result_table"]


def result_table(result: EvalResult) -> Table:
    """One column per setting; rows: attempts, failures, mean reward, success rate, pass@k."""
    pct = round(result.confidence * 100)
    table = Table(title=f"rollwire eval ({pct} % intervals)")
    table.add_column("metric")
    for s in result.settings:
        table.add_column(s.setting.name, justify="right")
    table.add_row(
        "tasks × attempts",
        *(f"{s.tasks} × {s.attempts // max(1, s.tasks)}" for s in result.settings),
    )
    table.add_row("failed rollouts", *(str(s.failed) for s in result.settings))
    table.add_row("mean reward", *(str(s.mean_reward) for s in result.settings))
    table.add_row(
        f"success rate (reward ≥ {result.success_threshold:g})",
        *(str(s.success_rate) for s in result.settings),
    )
    for k in result.ks:
        table.add_row(
            f"pass@{k}",
            *(str(s.pass_at_k[k]) if k in s.pass_at_k else "n/a" for s in result.settings),
        )
    return table
