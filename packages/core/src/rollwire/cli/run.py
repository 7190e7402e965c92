"""``rollwire run``: tasks as groups of rollouts through a gateway, written to JSONL.

The run's exit status says whether its job was done: 0 when every rollout completed, or when
the rollouts that failed did so because of the agent and are no more than ``--max-failed`` of
them; 1 when any rollout failed for an infrastructure reason (see :mod:`rollwire.cli.summary`)
or more than that share failed; 2 when the run could not start as asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from rollwire.cli.checks import parse_backend, probe_backend, probe_gateway
from rollwire.cli.errors import FAILED, check_output_free, fail
from rollwire.cli.run_summary import METRICS_HELP, report_run
from rollwire.cli.summary import (
    failure_causes,
    rollouts_of,
    routing_notes,
    summarize,
    summary_table,
)

__all__ = ["check_backends", "import_path", "quiet_logs", "read_tasks", "run"]

console = Console()
#: a run stops early when this many rollouts finished and every one failed for an
#: infrastructure reason (a dead backend or agent fails them all; no need to wait for the rest)
FAIL_FAST_AFTER = 8


def import_path() -> None:
    """Put the working directory on ``sys.path``: ``--agent mypkg.agent:app`` should import
    from where the user stands (console scripts do not add it)."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def quiet_logs(verbose: bool) -> None:
    """rollwire's per-rollout log lines only with ``--verbose``: the summary groups failures by
    cause, and an error that ends the command is printed once, as its error line."""
    logger = logging.getLogger("rollwire")
    if verbose:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    else:
        logger.setLevel(logging.CRITICAL + 1)


def read_tasks(path: Path) -> list[dict[str, Any]]:
    """The tasks of a file or folder (:func:`rollwire.data.tasks.read_tasks`), at least one."""
    from rollwire.data.tasks import read_tasks as read

    try:
        tasks = read(path)
    except ValueError as exc:
        raise fail(str(exc)) from exc
    if not tasks:
        raise fail(f"{path} holds no tasks: write one JSON object per line")
    return tasks


def _check_tokens_mode(capture: str, gateway: str) -> None:
    if capture not in ("passthrough", "tokens"):
        raise fail(f"--capture must be passthrough or tokens, got {capture!r}")
    if capture == "tokens" and gateway == "embedded":
        try:
            import transformers  # noqa: F401
        except ImportError as exc:
            raise fail(
                "--capture tokens renders chat templates with Hugging Face transformers, which "
                'is not installed: pip install "rollwire[tokens]"'
            ) from exc


def check_backends(specs: list[str], stack: contextlib.ExitStack) -> list[str]:
    """The embedded gateway's backends; each URL is checked to answer before the run starts."""
    out: list[str] = []
    for b in specs:
        if b == "embedded" or b.startswith("embedded:"):
            out.append(_embedded_backend(b.partition(":")[2] or None, stack))
            continue
        spec = parse_backend(b)
        problem = probe_backend(spec)
        if problem is not None:
            raise fail(
                f"--backend {b}: the inference server does not answer ({problem}); start it "
                "first, or use --backend embedded"
            )
        out.append(f"{spec.url}={spec.kind}")
    return out


def _embedded_backend(model_dir: str | None, stack: contextlib.ExitStack) -> str:
    """``embedded`` (the seeded model) or ``embedded:DIR`` (a model folder: ``rollwire engine
    save-model``'s, or a Hugging Face one such as ``rollwire train``'s ``final/``)."""
    from rollwire.engine import EmbeddedEngine, EngineConfig
    from rollwire.engine.model import WeightsError

    folder = Path(model_dir) if model_dir else None
    if folder is not None and not folder.is_dir():
        raise fail(f"--backend embedded:{model_dir}: no such model folder")
    config = EngineConfig(return_routed_experts=True, model_dir=folder)
    try:
        engine = stack.enter_context(EmbeddedEngine(config))
    except (WeightsError, ValueError, OSError) as exc:
        raise fail(f"--backend embedded:{model_dir}: cannot load that model ({exc})") from exc
    return f"{engine.url}=vllm"


async def _collect(client: Any, tasks: list[dict[str, Any]], groups: list[Any]) -> str | None:
    """Collect the run's groups into ``groups`` as they finish; why it stopped early, if it did."""
    from rollwire.cli.summary import is_infrastructure

    finished = infra = 0
    stop: str | None = None
    async with contextlib.aclosing(client.stream(tasks)) as stream:
        async for group in stream:
            groups.append(group)
            for r in group.rollouts:
                finished += 1
                infra += is_infrastructure(r)
            if finished >= FAIL_FAST_AFTER and infra == finished:
                stop = f"stopped after the first {finished} rollouts all failed for an infrastructure reason"
                break
    return stop


def _in_task_order(groups: list[Any], tasks: list[dict[str, Any]]) -> list[Any]:
    from rollwire.trainer.client import task_id_of

    order: dict[str, int] = {}
    for i, t in enumerate(tasks):
        order.setdefault(task_id_of(t, i), i)
    return sorted(groups, key=lambda g: order.get(str(g.task_id), len(order)))


def _report(
    groups: list[Any], out: Path, wall_s: float, max_failed: float, stop: str | None
) -> str | None:
    """Print the summary and the failures by cause; why the run failed, or None when it did not."""
    from rollwire.data.trajectory import build_rows

    rollouts = rollouts_of(groups)
    s = summarize(groups, build_rows(groups), wall_s)
    console.print(summary_table(s, f"rollwire run → {out}"))
    for note in routing_notes(s):
        console.print(f"[bold yellow]note:[/bold yellow] {escape(note)}")
    causes = failure_causes(rollouts)
    if causes:
        console.print("[bold]failed rollouts by cause[/bold]")
        for c in causes:
            kind = "infrastructure" if c.infrastructure else "agent"
            console.print(
                f"  {c.count:>5}  {escape(c.label)} ({kind}): {escape(c.message)}", soft_wrap=True
            )
    infra = sum(c.count for c in causes if c.infrastructure)
    failed = sum(c.count for c in causes)
    total = max(1, len(rollouts))
    if stop is not None:
        return f"{stop}; the {len(rollouts)} rollouts that finished are in {out}"
    if infra:
        return (
            f"{infra} of {len(rollouts)} rollouts failed for an infrastructure reason (causes "
            f"above); they are in {out} with status failed, but this run is not fit to train on"
        )
    if failed / total > max_failed:
        return (
            f"{failed} of {len(rollouts)} rollouts failed ({100 * failed / total:.0f}%, more than "
            f"--max-failed {max_failed:g}); causes above"
        )
    return None


def run(
    agent: str = typer.Option(
        None,
        "--agent",
        metavar="MODULE:APP",
        help="The agent's RolloutApp (needed by the local and ray runners).",
    ),
    tasks: Path = typer.Option(
        ...,
        "--tasks",
        exists=True,
        metavar="PATH",
        help="Tasks: JSONL, a JSON array, CSV, Parquet, or a local Hugging Face datasets folder.",
    ),
    group_size: int = typer.Option(
        4, "--group-size", "-n", min=1, metavar="N", help="Rollouts per task (the GRPO group)."
    ),
    concurrency: int = typer.Option(
        32, "--concurrency", "-c", min=1, metavar="N", help="Rollouts in flight at most."
    ),
    runner: str = typer.Option(
        "local",
        "--runner",
        metavar="SPEC",
        help="local | http:URL[,URL] | ray[:ADDRESS] | agentcore:ARN",
    ),
    gateway: str = typer.Option(
        "embedded",
        "--gateway",
        metavar="URL",
        help="Gateway URL, or 'embedded' to start one in-process.",
    ),
    admin_key: str = typer.Option(
        None,
        "--admin-key",
        metavar="KEY",
        envvar="ROLLWIRE_ADMIN_KEY",
        help="Admin key of the --gateway URL.",
    ),
    backend: list[str] = typer.Option(
        [],
        "--backend",
        metavar="URL[=KIND]",
        help="Inference server of the embedded gateway (KIND vllm, sglang or openai); "
        "'embedded' starts the embedded engine, 'embedded:DIR' on a model folder. Repeatable.",
    ),
    capture: str = typer.Option(
        "passthrough", "--capture", metavar="MODE", help="passthrough | tokens"
    ),
    temperature: float = typer.Option(
        1.0, "--temperature", metavar="T", help="Sampling temperature of every session."
    ),
    max_tokens: int = typer.Option(
        None, "--max-tokens", metavar="N", help="Max tokens per model call."
    ),
    deadline: float = typer.Option(
        600.0, "--deadline", metavar="SECONDS", help="Seconds per rollout."
    ),
    rate_limit: float = typer.Option(
        None, "--rate-limit", metavar="PER_S", help="Rollouts started per second at most."
    ),
    max_staleness: int = typer.Option(
        None,
        "--max-staleness",
        min=0,
        metavar="N",
        help="Sample no rollout more than N policy versions behind the trainer's (its POST "
        "/api/trainer_version); unset: no bound.",
    ),
    on_stale: str = typer.Option(
        "hold",
        "--on-stale",
        metavar="hold|mark",
        help="With --max-staleness: hold a rollout that would start beyond the bound until the "
        "servers catch up, or run it and have its calls flagged stale (not trained).",
    ),
    max_failed: float = typer.Option(
        0.2,
        "--max-failed",
        min=0.0,
        max=1.0,
        metavar="SHARE",
        help="Exit 1 when more than this share of rollouts failed for the agent's own reasons "
        "(any infrastructure failure always fails the run).",
    ),
    out: Path = typer.Option(
        Path("rollouts.jsonl"),
        "--out",
        "-o",
        metavar="FILE",
        help="Where to write the rollouts (JSONL).",
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite --out if it exists."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
    metrics: str = typer.Option(None, "--metrics", metavar="SINK", help=METRICS_HELP),
    verbose: bool = typer.Option(
        False, "--verbose", "-v", help="Log each failure as it happens (the summary groups them)."
    ),
) -> None:
    """Run tasks as groups of rollouts through a gateway and write them to a JSONL file.

    Exits 1 when a rollout failed for an infrastructure reason or more than --max-failed of
    them failed (the rollouts are written either way), 2 when the run cannot start as asked.
    """
    from rollwire.data.dataset import write_jsonl
    from rollwire.trainer.client import GatewayUnavailable, RolloutClient
    from rollwire.trainer.runners import RunnerError

    quiet_logs(verbose)
    check_output_free(out, force)
    _check_tokens_mode(capture, gateway)
    kind = runner.partition(":")[0]
    if kind in ("local", "ray") and not agent:
        raise fail(
            f"the {kind} runner needs --agent MODULE:APP (e.g. rollwire.envs.wordle.agent_openai:app)"
        )
    import_path()
    app = _load_agent(agent) if agent and kind == "local" else None
    task_list = read_tasks(tasks)
    sampling: dict[str, Any] = {"temperature": temperature}
    if max_tokens is not None:
        sampling["max_tokens"] = max_tokens
    if gateway != "embedded":
        if backend:
            raise fail(
                "--backend is for the embedded gateway; a --gateway URL has its own backends"
            )
        probe_gateway(gateway.rstrip("/"), admin_key)
    with contextlib.ExitStack() as stack:
        backends = check_backends(backend, stack)
        if gateway == "embedded" and not backends:
            raise fail(
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
                max_staleness=max_staleness,
                on_stale=on_stale,
            )
        except (ValueError, TypeError, ImportError, RunnerError) as exc:
            raise fail(str(exc)) from exc
        stack.callback(client.close)
        groups: list[Any] = []
        try:
            stop = asyncio.run(_collect(client, task_list, groups))
        except GatewayUnavailable as exc:
            if groups:
                write_jsonl(out, _in_task_order(groups, task_list))
                console.print(f"wrote the {len(groups)} groups that finished to {out}")
            raise fail(str(exc), FAILED) from exc
        except (ImportError, RunnerError, ValueError, TypeError) as exc:
            raise fail(f"{type(exc).__name__}: {exc}", FAILED) from exc
    groups = _in_task_order(groups, task_list)
    write_jsonl(out, groups)
    problem = _report(groups, out, client.stats.wall_s, max_failed, stop)
    report_run(console, groups, client.stats.wall_s, metrics)
    if problem is not None:
        raise fail(problem, FAILED)


def _load_agent(agent: str) -> Any:
    from rollwire.agent.app import load_app

    try:
        return load_app(agent)
    except (ImportError, AttributeError, ValueError, TypeError) as exc:
        raise fail(f"cannot load --agent {agent}: {type(exc).__name__}: {exc}") from exc
