"""``rollwire inspect``: the HTML report of a rollouts file, or one session's rows in the terminal."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

__all__ = ["inspect"]

console = Console()


def _fail(message: str, code: int = 2) -> typer.Exit:
    console.print(f"[red]error:[/red] {escape(message)}")
    return typer.Exit(code)


def inspect(
    rollouts: Path = typer.Argument(
        None,
        exists=True,
        help="Rollouts JSONL written by `rollwire run`, or a `rollwire train` run folder.",
    ),
    out: Path = typer.Option(None, "--out", "-o", help="Report path (default: ROLLOUTS.html)."),
    tokenizer: str = typer.Option(
        None,
        "--tokenizer",
        help="'embedded' or a folder with tokenizer.json: decodes tokens and tells roles apart.",
    ),
    mode: str = typer.Option(
        "merge", "--mode", help="Rows as trainers get them: merge | per_call."
    ),
    failure_reward: float = typer.Option(
        None, "--failure-reward", help="Reward of a rollout without one, in its group's advantage."
    ),
    session: str = typer.Option(None, "--session", help="Print this session's rows instead."),
    gateway: str = typer.Option(None, "--gateway", help="Gateway URL of --session."),
    admin_key: str = typer.Option(
        None, "--admin-key", envvar="ROLLWIRE_ADMIN_KEY", help="Admin key of --gateway."
    ),
) -> None:
    """Write a self-contained HTML report of what a batch of rollouts would train (or, for a
    `rollwire train` folder, of how the run learned)."""
    if rollouts is not None and rollouts.is_dir():
        _training(rollouts, out)
        return
    from rollwire.report.tokenizers import load_tokenizer
    from rollwire.report.tokens import ReportTokenizer

    if mode not in ("merge", "per_call"):
        raise _fail(f"--mode must be merge or per_call, got {mode!r}")
    tok: ReportTokenizer | None
    try:
        if tokenizer == "embedded":
            from rollwire.engine.tokenizer import EngineTokenizer

            tok = EngineTokenizer()
        else:
            tok = load_tokenizer(tokenizer)
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    if session is not None:
        _terminal(session, gateway, admin_key, tok, mode)
        return
    if rollouts is None:
        raise _fail("give a rollouts JSONL file, or --session ID --gateway URL")
    _html(rollouts, out, tok, mode, failure_reward)


def _training(run: Path, out: Path | None) -> None:
    from rollwire.report.training import write_training_report

    try:
        path = write_training_report(run, out)
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    console.print(f"wrote {path}: the reward curve, pass rate per step and time split of {run}")


def _html(
    rollouts: Path, out: Path | None, tok: object, mode: str, failure_reward: float | None
) -> None:
    from rollwire.data.dataset import read_jsonl
    from rollwire.report import build_report, write_report

    try:
        batch = read_jsonl(rollouts)
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    report = build_report(
        batch,
        tokenizer=tok,  # type: ignore[arg-type]
        mode=mode,  # type: ignore[arg-type]
        failure_reward=failure_reward,
        source=str(rollouts),
    )
    path = write_report(out or rollouts.with_suffix(".html"), report)
    s = report.summary
    forks = ", ".join(f"{k} {v}" for k, v in sorted(s.forks.items())) or "none"
    console.print(
        f"wrote {path}: {s.rollouts} rollouts, {s.groups} groups, {s.rows} rows; forks: {forks}"
    )
    for d in report.drift:
        console.print(
            escape(
                f"  drift {d.kind}: {d.count} forks, {d.tokens_lost} trainable tokens lost — {d.advice}"
            )
        )
    if tok is None:
        console.print(
            "[yellow]note:[/yellow] no --tokenizer: tokens show as ids and context roles cannot be told "
            "apart (use --tokenizer embedded for the demo's rollouts)"
        )


def _terminal(
    session: str, gateway: str | None, admin_key: str | None, tok: object, mode: str
) -> None:
    import httpx

    from rollwire.data.trajectory import TrajectoryBuilder
    from rollwire.report.terminal import print_rollout
    from rollwire.report.tokens import Vocabulary
    from rollwire.trainer.gateway_client import GatewayAPIError, GatewayClient

    if not gateway:
        raise _fail("--session needs --gateway URL (and --admin-key)")
    try:
        with GatewayClient(gateway, admin_key=admin_key) as gw:
            rollout = gw.rollout(session)
    except GatewayAPIError as exc:
        raise _fail(f"the gateway at {gateway} refused: {exc}", 1) from exc
    except (OSError, httpx.HTTPError) as exc:
        raise _fail(f"cannot reach the gateway at {gateway}: {exc}", 1) from exc
    rows = TrajectoryBuilder(mode, tokenizer=tok).build(rollout)  # type: ignore[arg-type]
    print_rollout(console, rollout, rows, Vocabulary(tok))  # type: ignore[arg-type]
