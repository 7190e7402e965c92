"""What the CLI prints when nothing goes wrong: readable at 80 columns and piped, no banners,
plugins that say what they can do, distinct default ports."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from rollwire.cli import app
from rollwire.cli.checks import BACKEND_KINDS
from rollwire.gateway import config as gateway_config

CLI = Callable[..., Any]


def _commands(group: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [prefix]
    for name, command in sorted(group.commands.items()):
        if hasattr(command, "commands"):
            out += _commands(command, (*prefix, name))
        else:
            out.append((*prefix, name))
    return out


COMMANDS = _commands(typer.main.get_group(app))


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "rollwire")
def test_help_fits_80_columns(command: tuple[str, ...]) -> None:
    # in-process: the same click formatter the console script uses, at the width a pipe gets
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert "<bool>" not in result.output  # flags take no value: no type shown


def test_plugins_piped_keep_reasons_and_hints(cli: CLI, tmp_path: Path) -> None:
    proc = cli("plugins", cwd=tmp_path)  # stdout is a pipe here
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert "fixture-" not in proc.stdout  # the test plugins exist in the test process only
    text = " ".join(proc.stdout.split())
    # the workspace has slime's and rLLM's adapters but neither framework: export only, said so
    assert "slime export only" in text and "slime is not installed" in text
    assert "rllm export only" in text
    # verl's adapter without torch/verl: each missing requirement and the install hint
    assert "verl missing" in text and "torch is not installed" in text
    assert 'pip install "rollwire[verl]"' in text


def test_plugins_json(cli: CLI, tmp_path: Path) -> None:
    proc = cli("plugins", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    found = {p["name"]: p for p in json.loads(proc.stdout)}
    assert found["openai"]["state"] == "ok" and found["openai"]["kind"] == "agents"
    assert found["slime"]["state"] == "export only" and found["slime"]["export_only"] is True
    assert found["verl"]["state"] == "missing" and "torch" in found["verl"]["detail"]
    assert not any(name.startswith("fixture-") for name in found)


def test_doctor_prints_no_transformers_banner(cli: CLI, tmp_path: Path) -> None:
    proc = cli("doctor", cwd=tmp_path)
    assert "PyTorch was not found" not in proc.stdout + proc.stderr
    assert proc.returncode in (0, 1), proc.stderr  # 1: a drift report, still no banner


def test_engine_and_gateway_default_to_different_ports() -> None:
    def default_port(group: Any) -> object:
        return next(p.default for p in group.params if p.name == "port")

    root = typer.main.get_group(app)
    engine, gateway = root.commands["engine"], root.commands["gateway"]
    assert default_port(engine) == 8000 and default_port(gateway) == 9000


def test_backend_kinds_match_the_gateway() -> None:
    assert gateway_config.BACKEND_KINDS == BACKEND_KINDS


def test_version_is_one_line(cli: CLI, tmp_path: Path) -> None:
    out = cli("--version", cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "rollwire 0.1.0"
