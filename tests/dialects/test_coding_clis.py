"""Codex CLI and Claude Code, installed from npm, each complete one scripted task through rollwire.

The engine, the gateway and the CLI run together in a network namespace with only loopback up
(``unshare -n``), telemetry and update checks off: nothing can leave the machine, and a CLI that
needed anything beyond loopback fails its task. ``.ci/run`` installs both CLIs (npm) and points
``ROLLWIRE_CLI_BIN`` at them; elsewhere they are looked up on PATH.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
EXECUTABLES = {"codex": "codex", "claude-code": "claude"}


def _executable(name: str) -> str | None:
    folder = os.environ.get("ROLLWIRE_CLI_BIN")
    if folder and (Path(folder) / name).exists():
        return str(Path(folder) / name)
    return shutil.which(name)


def _unshare() -> list[str] | None:
    """The command that gives a child its own network namespace (as root, or via a user ns)."""
    for cmd in (["unshare", "--net"], ["unshare", "--net", "--map-root-user"]):
        if (
            shutil.which("unshare")
            and subprocess.run([*cmd, "true"], capture_output=True).returncode == 0
        ):
            return cmd
    return None


@pytest.mark.parametrize("kind", ["codex", "claude-code"])
def test_cli_completes_a_scripted_task_offline(kind: str, tmp_path: Path) -> None:
    exe = _executable(EXECUTABLES[kind])
    if exe is None:
        pytest.skip(f"{EXECUTABLES[kind]} is not installed (.ci/run installs it from npm)")
    unshare = _unshare()
    if unshare is None or shutil.which("ip") is None:
        pytest.skip("needs unshare and ip (util-linux, iproute2) to isolate the CLI's network")
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [*unshare, sys.executable, str(HERE / "cli_task.py"), kind, exe, str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["interfaces"] == ["lo"]  # nothing but loopback was up while the CLI ran
    for capture in ("passthrough", "tokens"):
        run = result[capture]
        assert run["returncode"] == 0, (capture, run["stdout"], run["stderr"])
        assert run["status"] == "completed" and run["reward"] == 1.0, run
        calls = run["calls"]
        assert len(calls) >= 2 and all(c["status"] == "ok" and c["trainable"] for c in calls), calls
        assert any(c["tool_calls"] for c in calls) and all(c["experts"] for c in calls)
        assert run["rows"] >= 1
    assert result["tokens"]["rows"] == 1  # the CLI's history appends: one training row
