"""Helpers of the CLI tests: ``rollwire`` run as a user runs it, in a subprocess."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROLLWIRE = str(Path(sys.executable).with_name("rollwire"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: A bound on one command, not a wait (it returns when the command exits): a short command's
#: start-up alone (imports, the embedded engine) takes over a minute on a loaded 2-core machine.
CLI_BOUND = 300


def _cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = CLI_BOUND
) -> subprocess.CompletedProcess[str]:
    """Run ``rollwire ARGS`` in ``cwd``; a traceback in the output fails the test."""
    full_env = {k: v for k, v in os.environ.items() if k != "ROLLWIRE_ADMIN_KEY"}
    full_env.update({"COLUMNS": "80", **(env or {})})
    proc = subprocess.run(
        [ROLLWIRE, *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout
    )
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return proc


def _error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The one ``error:`` line of a failed command (on stderr)."""
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stdout + proc.stderr
    return lines[0]


@pytest.fixture(scope="session")
def cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """``cli(*args, cwd=..., env=..., timeout=...)``: the console script in a subprocess."""
    return _cli


@pytest.fixture(scope="session")
def error_line() -> Callable[[subprocess.CompletedProcess[str]], str]:
    """``error_line(proc)``: the single ``error:`` line a failed command printed."""
    return _error_line


@pytest.fixture(scope="session")
def free_port() -> Callable[[], int]:
    """``free_port()``: a free TCP port on 127.0.0.1."""
    return _free_port
