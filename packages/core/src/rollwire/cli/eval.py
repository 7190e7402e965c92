"""``rollwire eval``: a task set run k times per task at each sampling setting, side by side."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any

import orjson
import typer
from rich.console import Console
from rich.markup import escape

from rollwire.cli.checks import probe_gateway
from rollwire.cli.errors import FAILED, check_output_free, fail
from rollwire.cli.run import check_backends
from rollwire.cli.run_summary import METRICS_HELP, log_eval
from rollwire.cli.summary import failure_causes, is_infrastructure, rollouts_of

__all__ = ["evaluate"]

console = Console()

_DEMO_AGENT = "rollwire.envs.wordle.agent_openai:app"


def _fail(message: str, code: int = 2) -> typer.Exit:
    console.print(f"[red]error:[/red] {escape(message)}")
    return typer.Exit(code)


def _tasks_from(path: Path) -> list[dict[str, Any]]:
    tasks = []
    for lineno, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise _fail(f"{path}:{lineno}: not JSON: {exc}") from exc
        if not isinstance(obj, dict):
            raise _fail(f"{path}:{lineno}: each line must be a JSON object (a task)")
        tasks.append(obj)
    if not tasks:
        raise _fail(f"{path} holds no tasks")
    return tasks


def evaluate(
    agent: str = typer.Option(None, "--agent", help="The agent app as MODULE:APP."),
    tasks: Path = typer.Option(
        None, "--tasks", exists=True, dir_okay=False, help="JSONL file, one task per line."
    ),
    demo: int = typer.Option(
        0, "--demo", help="Evaluate the Wordle demo setup on this many tasks (no --agent/--tasks)."
    ),
    temperature: list[float] = typer.Option(
        [], "--temperature", "-t", help="A temperature to evaluate at; repeat for several."
    ),
    max_tokens: int = typer.Option(None, "--max-tokens", help="Max tokens per model call."),
    k: int = typer.Option(8, "--k", min=1, help="Attempts per task."),
    pass_k: list[int] = typer.Option(
        [], "--pass-k", help="k of pass@k; repeat (default 1 and --k)."
    ),
    success_threshold: float = typer.Option(
        1.0, "--success-threshold", help="A rollout succeeds when its reward is at least this."
    ),
    failure_reward: float = typer.Option(
        0.0, "--failure-reward", help="Reward of a failed rollout."
    ),
    confidence: float = typer.Option(0.95, "--confidence", help="Of the intervals."),
    runner: str = typer.Option("local", "--runner", help="local | http:URL | ray | agentcore:ARN"),
    gateway: str = typer.Option("embedded", "--gateway", help="Gateway URL or 'embedded'."),
    admin_key: str = typer.Option(None, "--admin-key", envvar="ROLLWIRE_ADMIN_KEY"),
    backend: list[str] = typer.Option(
        [],
        "--backend",
        help="URL[=kind], 'embedded', or 'embedded:DIR' (the engine on a model folder).",
    ),
    concurrency: int = typer.Option(32, "--concurrency", "-c", min=1),
    deadline: float = typer.Option(600.0, "--deadline", help="Seconds per rollout."),
    out: Path = typer.Option(Path("eval.json"), "--out", "-o", help="Where to write the result."),
    force: bool = typer.Option(
        False, "--force", help="Overwrite --out and --rollouts if they exist."
    ),
    rollouts_out: Path = typer.Option(
        None, "--rollouts", help="Also write every evaluation rollout (JSONL, marked untrainable)."
    ),
    plot: Path = typer.Option(None, "--plot", help="A PNG of pass@k per setting (matplotlib)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
    metrics: str = typer.Option(None, "--metrics", help=METRICS_HELP),
) -> None:
    """Evaluate at your serving settings: mean reward, success rate and pass@k per setting."""
    from rollwire.evaluation import EvalSetting, result_table, run_eval

    check_output_free(out, force)
    if rollouts_out is not None:
        check_output_free(rollouts_out, force, "--rollouts")
    if demo and max_tokens is None:
        max_tokens = 48  # the demo's cap (rollwire demo uses the same)
    temps = temperature or [1.0]
    settings = []
    for t in temps:
        sampling: dict[str, Any] = {"temperature": t}
        if max_tokens is not None:
            sampling["max_tokens"] = max_tokens
        settings.append(EvalSetting(f"temperature={t:g}", sampling))
    with contextlib.ExitStack() as stack:
        client, task_list = _setup(
            stack, demo, agent, tasks, runner, gateway, admin_key, backend, concurrency, deadline
        )
        client.progress = progress  # the client stays quiet when stderr is not a terminal
        kept: dict[str, Any] = {}
        try:
            result = run_eval(
                client,
                task_list,
                settings,
                k=k,
                ks=pass_k or None,
                success_threshold=success_threshold,
                failure_reward=failure_reward,
                confidence=confidence,
                groups_out=kept,
            )
        except ValueError as exc:
            raise _fail(str(exc)) from exc
    console.print(result_table(result))
    result.write_json(out)
    console.print(f"wrote {out}")
    if rollouts_out is not None:
        from rollwire.data.dataset import write_jsonl

        n = write_jsonl(rollouts_out, [g for groups in kept.values() for g in groups])
        console.print(f"wrote {n} evaluation rollouts to {rollouts_out}")
    if plot is not None:
        from rollwire.evaluation.plot import MissingPlotExtra, plot_result

        try:
            console.print(f"wrote {plot_result(result, plot)}")
        except MissingPlotExtra as exc:
            raise _fail(str(exc)) from exc
    if metrics:
        log_eval(console, result, metrics)
    infra = sum(is_infrastructure(r) for groups in kept.values() for r in rollouts_of(groups))
    if demo:
        console.print(
            "[bold yellow]note:[/bold yellow] the demo's guesses are chosen by a scripted solver "
            "(teacher-forced), so its rewards do not depend on the temperature; run your own "
            "agent and model with --agent/--tasks/--backend to compare settings for real."
        )
    if infra:
        for c in failure_causes(r for groups in kept.values() for r in rollouts_of(groups)):
            if c.infrastructure:
                console.print(
                    f"  {c.count:>5}  {escape(c.label)}: {escape(c.message)}", soft_wrap=True
                )
        raise fail(
            f"{infra} evaluation rollouts failed for an infrastructure reason (causes above): "
            f"the figures in {out} do not measure the agent",
            FAILED,
        )


def _setup(
    stack: contextlib.ExitStack,
    demo: int,
    agent: str | None,
    tasks: Path | None,
    runner: str,
    gateway: str,
    admin_key: str | None,
    backend: list[str],
    concurrency: int,
    deadline: float,
) -> tuple[Any, list[dict[str, Any]]]:
    from rollwire.trainer.client import RolloutClient

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    if demo:
        from rollwire.engine import EmbeddedEngine, EngineConfig
        from rollwire.envs.wordle import WordleSolver, make_tasks

        engine = stack.enter_context(EmbeddedEngine(EngineConfig(scripted=WordleSolver(seed=0))))
        backend = [f"{engine.url}=vllm"]
        agent = agent or _DEMO_AGENT
        task_list = list(make_tasks(demo, "validation", seed=0))
    elif tasks is None:
        raise _fail("give --tasks FILE (and --agent MODULE:APP), or --demo N")
    else:
        task_list = _tasks_from(tasks)
    kind = runner.partition(":")[0]
    if kind in ("local", "ray") and not agent:
        raise _fail(f"the {kind} runner needs --agent MODULE:APP")
    if gateway != "embedded":
        probe_gateway(gateway.rstrip("/"), admin_key)
    backends = check_backends(backend, stack)  # each URL checked to answer before the run
    if gateway == "embedded" and not backends:
        raise _fail("the embedded gateway needs at least one --backend URL (or --backend embedded)")
    app = None
    if agent and kind == "local":
        from rollwire.agent.app import load_app

        try:
            app = load_app(agent)
        except (ImportError, AttributeError, ValueError, TypeError) as exc:
            raise _fail(f"cannot load --agent {agent}: {exc}") from exc
    try:
        client = RolloutClient(
            gateway,
            admin_key=admin_key,
            backends=backends,
            runner=runner,
            app=app,
            app_path=agent,
            concurrency=concurrency,
            deadline=deadline,
        )
    except (ValueError, TypeError, ImportError) as exc:
        raise _fail(str(exc)) from exc
    stack.callback(client.close)
    return client, task_list
