"""``rollwire train`` where TRL is not installed (the workspace venv): one line saying how to get
it. The loop itself is tested in the TRL venv (packages/adapter-trl/ci/run-tests.sh)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

CLI = Callable[..., Any]

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("trl") is not None, reason="TRL is installed here: see run-tests.sh"
)


def test_train_without_trl_names_the_extra_and_the_venv_script(
    cli: CLI, error_line: CLI, tmp_path: Path
) -> None:
    proc = cli("train", "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert proc.returncode == 2
    line = error_line(proc)
    assert 'pip install "rollwire[trl]"' in line
    assert "download.pytorch.org/whl/cpu" in line  # CPU torch, not PyPI's CUDA build
    assert "packages/adapter-trl/ci/setup-venv.sh" in line
    assert not (tmp_path / "run").exists()


def test_train_agent_needs_its_tasks(cli: CLI, error_line: CLI, tmp_path: Path) -> None:
    proc = cli("train", "--agent", "mod:app", cwd=tmp_path)
    assert proc.returncode == 2
    assert "give --tasks and --eval-tasks, or --task" in error_line(proc)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"prompt": "hi"}\n')
    proc = cli("train", "--agent", "mod:app", "--tasks", str(tasks), cwd=tmp_path)
    assert proc.returncode == 2
    assert "--agent, --tasks and --eval-tasks go together" in error_line(proc)
    proc = cli("train", "--tasks", str(tasks), "--eval-tasks", str(tasks), cwd=tmp_path)
    assert proc.returncode == 2
    assert "--agent, --tasks and --eval-tasks go together" in error_line(proc)


def test_a_trainers_own_options_are_parsed_against_its_declaration() -> None:
    import typer

    from rollwire.cli.train import parse_trainer_options
    from rollwire.plugins.protocols import TrainerOption

    declared = [
        TrainerOption("--loss-fn", "loss_fn", "a", "the loss", str, ("a", "b")),
        TrainerOption("--clip", "clip", 3.0, "a clip", float),
        TrainerOption("--fast", "fast", False, "a switch", bool),
    ]
    assert parse_trainer_options("t", declared, []) == {"loss_fn": "a", "clip": 3.0, "fast": False}
    got = parse_trainer_options("t", declared, ["--loss-fn", "b", "--clip=2.5", "--fast"])
    assert got == {"loss_fn": "b", "clip": 2.5, "fast": True}
    assert parse_trainer_options("t", declared, ["--no-fast"])["fast"] is False
    for bad in (["--nope", "1"], ["--loss-fn", "c"], ["--clip", "x"], ["--clip"]):
        with pytest.raises(typer.Exit):
            parse_trainer_options("t", declared, bad)
