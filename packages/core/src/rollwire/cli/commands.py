"""``rollwire run``, ``rollwire export`` and ``rollwire demo`` (registered by :mod:`rollwire.cli`)."""

from __future__ import annotations

import contextlib
import math
import os
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rollwire.cli.run_summary import METRICS_HELP, report_run

__all__ = ["demo", "export", "run"]

console = Console()


def _fail(message: str, code: int = 2) -> typer.Exit:
    console.print(f"[red]error:[/red] {escape(message)}")
    return typer.Exit(code)


def _import_path() -> None:
    # Console scripts do not put the working directory on sys.path; `--agent examples.x:app` should work.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def _read_tasks(path: Path) -> list[dict[str, Any]]:
    from rollwire.data.tasks import read_tasks

    try:
        return read_tasks(path)
    except ValueError as exc:
        raise _fail(str(exc)) from exc


def run(
    agent: str = typer.Option(
        None, "--agent", help="The agent app as MODULE:APP (needed by the local and ray runners)."
    ),
    tasks: Path = typer.Option(
        ...,
        "--tasks",
        exists=True,
        help="Tasks: JSONL, a JSON array, CSV, Parquet, or a local Hugging Face datasets folder.",
    ),
    group_size: int = typer.Option(
        4, "--group-size", "-n", min=1, help="Rollouts per task (the GRPO group)."
    ),
    concurrency: int = typer.Option(
        32, "--concurrency", "-c", min=1, help="Rollouts in flight at most."
    ),
    runner: str = typer.Option(
        "local", "--runner", help="local | http:URL[,URL] | ray[:ADDRESS] | agentcore:ARN"
    ),
    gateway: str = typer.Option(
        "embedded", "--gateway", help="Gateway URL, or 'embedded' to start one in-process."
    ),
    admin_key: str = typer.Option(
        None, "--admin-key", envvar="ROLLWIRE_ADMIN_KEY", help="Admin key of --gateway URL."
    ),
    backend: list[str] = typer.Option(
        [],
        "--backend",
        help="Inference server URL[=kind] for the embedded gateway; 'embedded' starts the embedded engine.",
    ),
    capture: str = typer.Option("passthrough", "--capture", help="passthrough | tokens"),
    temperature: float = typer.Option(
        1.0, "--temperature", help="Sampling temperature of every session."
    ),
    max_tokens: int = typer.Option(None, "--max-tokens", help="Max tokens per model call."),
    deadline: float = typer.Option(600.0, "--deadline", help="Seconds per rollout."),
    rate_limit: float = typer.Option(
        None, "--rate-limit", help="Rollouts started per second at most."
    ),
    out: Path = typer.Option(
        Path("rollouts.jsonl"), "--out", "-o", help="Where to write the rollouts (JSONL)."
    ),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
    metrics: str = typer.Option(None, "--metrics", help=METRICS_HELP),
) -> None:
    """Run tasks as groups of rollouts through a gateway and write them to a JSONL file."""
    from rollwire.agent.app import load_app
    from rollwire.data.dataset import write_jsonl
    from rollwire.trainer.client import GatewayUnavailable, RolloutClient
    from rollwire.trainer.runners import RunnerError

    if capture not in ("passthrough", "tokens"):
        raise _fail(f"--capture must be passthrough or tokens, got {capture!r}")
    kind = runner.partition(":")[0]
    if kind in ("local", "ray") and not agent:
        raise _fail(
            f"the {kind} runner needs --agent MODULE:APP (e.g. rollwire.envs.wordle.agent_openai:app)"
        )
    _import_path()
    app = None
    if agent and kind == "local":
        try:
            app = load_app(agent)
        except (ImportError, AttributeError, ValueError, TypeError) as exc:
            raise _fail(f"cannot load --agent {agent}: {exc}") from exc
    task_list = _read_tasks(tasks)
    if not task_list:
        raise _fail(f"{tasks} holds no tasks")
    sampling: dict[str, Any] = {"temperature": temperature}
    if max_tokens is not None:
        sampling["max_tokens"] = max_tokens
    with contextlib.ExitStack() as stack:
        backends: list[str] = []
        for b in backend:
            if b == "embedded":
                from rollwire.engine import EmbeddedEngine

                backends.append(f"{stack.enter_context(EmbeddedEngine()).url}=vllm")
            else:
                backends.append(b)
        if gateway == "embedded" and not backends:
            raise _fail(
                "the embedded gateway needs at least one --backend URL (or --backend embedded)"
            )
        try:
            client = RolloutClient(
                gateway,
                admin_key=admin_key,
                backends=backends,
                runner=runner,
                app=app,
                app_path=agent,
                group_size=group_size,
                sampling=sampling,
                capture=capture,  # type: ignore[arg-type]
                concurrency=concurrency,
                rate_limit=rate_limit,
                deadline=deadline,
                progress=progress,
            )
        except (ValueError, TypeError, ImportError) as exc:
            raise _fail(str(exc)) from exc
        stack.callback(client.close)
        try:
            groups = client.run(task_list)
        except GatewayUnavailable as exc:
            if exc.groups:
                write_jsonl(out, exc.groups)
                console.print(f"wrote the {len(exc.groups)} groups that finished to {out}")
            raise _fail(str(exc), 1) from exc
        except (ImportError, RunnerError, ValueError, TypeError) as exc:
            raise _fail(f"{type(exc).__name__}: {exc}", 1) from exc
    n = write_jsonl(out, groups)
    s = client.stats
    console.print(
        f"wrote {n} rollouts ({len(groups)} groups) to {out}: {s.completed} completed, {s.failed} failed "
        f"({s.statuses}), {s.calls} model calls in {s.wall_s:.1f}s"
    )
    report_run(console, groups, s.wall_s, metrics)


def export(
    src: Path = typer.Option(
        ...,
        "--in",
        "-i",
        exists=True,
        dir_okay=False,
        help="Rollouts JSONL written by `rollwire run`.",
    ),
    to: str = typer.Option(
        ...,
        "--to",
        help="jsonl, or the name of an installed trainer adapter (see `rollwire plugins`).",
    ),
    out: Path = typer.Option(..., "--out", "-o", help="Output path."),
) -> None:
    """Convert rollouts to a trainer's batch format (verl, slime, rLLM, ...) or rollwire JSONL."""
    from rollwire.data.dataset import read_jsonl, write_jsonl
    from rollwire.plugins import PluginError, load_trainer

    try:
        rollouts = read_jsonl(src)
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    if to == "jsonl":
        n = write_jsonl(out, rollouts)
        console.print(f"wrote {n} rollouts to {out}")
        return
    try:
        adapter = load_trainer(to)
    except PluginError as exc:
        raise _fail(str(exc)) from exc
    try:
        path = adapter.export(rollouts, out)
    except Exception as exc:  # an adapter's own error: say which and why, no traceback
        raise _fail(
            f"the {to} adapter could not export {src}: {type(exc).__name__}: {exc}", 1
        ) from exc
    console.print(f"exported {len(rollouts)} rollouts for {to} to {path}")


def demo(
    agent: str = typer.Option("openai", "--agent", help="openai | strands | langgraph"),
    tasks: int = typer.Option(16, "--tasks", min=1, help="Wordle games (tasks)."),
    group_size: int = typer.Option(4, "--group-size", min=1, help="Rollouts per game."),
    unsteered: bool = typer.Option(
        False, "--unsteered", help="Let the raw (random-weight) model sample."
    ),
    out: Path = typer.Option(Path("rollwire-demo"), "--out", help="Output folder."),
    concurrency: int = typer.Option(32, "--concurrency", min=1, help="Rollouts in flight at most."),
    seed: int = typer.Option(0, "--seed", help="Seed of the tasks, the solver and the engine."),
) -> None:
    """Wordle end to end on this machine: embedded engine, gateway, agent, and trainer exports."""
    from rollwire.cli.demo import DemoError, run_demo

    _import_path()
    mode = (
        "unsteered: the raw random-weight model samples"
        if unsteered
        else "steered by a scripted Wordle solver"
    )
    console.print(
        f"[bold]rollwire demo[/bold]: Wordle, {tasks} tasks x {group_size} rollouts, agent [cyan]{agent}[/cyan], "
        f"embedded engine {mode}"
    )
    try:
        result = run_demo(
            agent=agent,
            tasks=tasks,
            group_size=group_size,
            unsteered=unsteered,
            out=out,
            concurrency=concurrency,
            seed=seed,
        )
    except DemoError as exc:
        raise _fail(str(exc)) from exc
    s = result.summary()
    table = Table(title="rollwire demo")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows: list[tuple[str, str]] = [
        ("rollouts", f"{s['rollouts']} ({s['completed']} completed, {s['failed']} failed)"),
        ("groups", str(s["groups"])),
        ("solved", f"{s['solved']} / {s['rollouts']}"),
        ("reward mean ± std", f"{_num(s['reward_mean'])} ± {_num(s['reward_std'])}"),
        ("turns per rollout", f"{s['turns_per_rollout']:.2f}"),
        ("rows per rollout", f"{s['rows_per_rollout']:.2f}"),
        ("trainable tokens", str(s["trainable_tokens"])),
        ("forks by class", ", ".join(f"{k}: {v}" for k, v in sorted(s["forks"].items())) or "none"),
        ("model calls", str(s["calls"])),
        ("calls/s", _num(s["calls_per_s"], 1)),
        ("wall time", f"{s['wall_s']:.1f} s"),
    ]
    for k, v in rows:
        table.add_row(k, v)
    console.print(table)
    console.print(f"rollouts: {result.rollouts_path}")
    for name, path in sorted(result.exports.items()):
        console.print(f"export for {name}: {path}")
    for name, err in sorted(result.export_errors.items()):
        console.print(f"[yellow]export for {name} failed:[/yellow] {escape(err)}")
    for name, why in sorted(result.export_skipped.items()):
        console.print(escape(f"{name}: skipped — {why}"))
    if result.steered:
        console.print(
            "[bold yellow]note:[/bold yellow] the embedded engine is a tiny random-weight model; every guess was "
            "chosen by a scripted Wordle solver and teacher-forced, while the recorded log-probs are the model's "
            "own. Run with --unsteered to see the raw model (it makes no valid guesses)."
        )
    else:
        console.print(
            "[bold yellow]note:[/bold yellow] unsteered: the raw random-weight model sampled every token, so "
            "rewards reflect a model that cannot play."
        )


def _num(x: float, digits: int = 3) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:.{digits}f}"
