"""How the CLI ends on an expected error: one line on stderr, a non-zero exit, no traceback.

Commands ``raise fail(message)``: it prints ``error: <message>`` on stderr and returns the
``typer.Exit`` to raise. :func:`run_app` is the net for expected errors raised deeper (a plugin
that cannot load, a gateway that answers 4xx mid-run, a busy port): one line as well. A traceback
is kept for what is not expected, that is, a bug to report.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

__all__ = [
    "FAILED",
    "USAGE",
    "check_output_free",
    "expected_message",
    "fail",
    "print_error",
    "run_app",
]

#: exit code of a job that ran and failed (a run with failed rollouts, an export that failed)
FAILED = 1
#: exit code of a command that could not start as asked (bad flag, unreachable URL, busy port)
USAGE = 2

_stderr = Console(stderr=True, soft_wrap=True)


def print_error(message: str) -> None:
    """``error: <message>`` on stderr, never wrapped (so it stays one line for grep and logs)."""
    _stderr.print(f"[red]error:[/red] {escape(message)}", highlight=False)


def fail(message: str, code: int = USAGE) -> typer.Exit:
    """Print ``message`` as the command's one error line; returns the ``typer.Exit`` to raise."""
    print_error(message)
    return typer.Exit(code)


def expected_message(exc: BaseException) -> str | None:
    """The one-line message of an expected error raised outside a command's own checks, or
    None for an unexpected one (a bug: its traceback is kept)."""
    from rollwire.plugins import PluginError
    from rollwire.trainer.client import GatewayUnavailable

    if isinstance(exc, (PluginError, GatewayUnavailable)):
        return str(exc)
    # the trainer client's control-plane errors carry the HTTP status of the gateway's answer
    if isinstance(exc, RuntimeError) and isinstance(getattr(exc, "status_code", None), int):
        return str(exc)
    if isinstance(exc, OSError) and exc.strerror:  # a file or socket the user named
        where = f": {exc.filename}" if exc.filename else ""
        return f"{exc.strerror}{where}"
    return None


def run_app(app: Callable[..., object]) -> None:
    """Run the typer ``app`` as the console script does, ending expected errors in one line."""
    try:
        app(standalone_mode=True)
    except KeyboardInterrupt:
        print_error("interrupted")
        sys.exit(130)
    except Exception as exc:
        message = expected_message(exc)
        if message is None:
            raise
        print_error(message)
        sys.exit(FAILED)


def check_output_free(path: Path, force: bool, flag: str = "--out") -> None:
    """Refuse to overwrite ``path`` unless ``force``: a finished run's output is worth keeping."""
    if path.exists() and not force:
        raise fail(f"{flag} {path} exists; pass --force to overwrite it, or choose another path")
