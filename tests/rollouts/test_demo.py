"""`rollwire demo`, `rollwire run` and `rollwire export` end to end (in-process CLI)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from rollwire.cli import app as cli
from rollwire.cli.demo import DemoError, load_demo_agent
from rollwire.data.dataset import read_jsonl
from rollwire.plugins import discover


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    result = CliRunner().invoke(
        cli, ["demo", "--tasks", "4", "--group-size", "2", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "scripted Wordle solver" in result.output and "reward mean" in result.output
    rollouts = read_jsonl(out / "rollouts.jsonl")
    assert len(rollouts) == 8 and len({r.group_id for r in rollouts}) == 4
    # the solver explores now and then, so a game may be lost: every reward is in a valid band
    assert all(r.status == "completed" and r.reward is not None for r in rollouts)
    assert all(
        r.reward > 1.0 or -0.65 <= r.reward <= -0.35 for r in rollouts if r.reward is not None
    )
    trainers = [
        p.name
        for p in discover("trainers")
        if p.status == "ok" and not p.name.startswith("fixture-")
    ]
    for name in trainers:
        assert any(f.name.startswith(name) for f in out.iterdir()), (
            f"no export for {name}: {result.output}"
        )
    # an adapter whose framework is missing is named, not silently left out
    for info in discover("trainers"):
        if info.status == "missing" and not info.name.startswith("fixture-"):
            assert f"{info.name}: skipped — needs" in result.output
    if any(i.name == "verl" and i.status == "missing" for i in discover("trainers")):
        # what to install, and how to keep a CUDA torch out of this environment
        assert (
            "CPU torch first" in result.output and "download.pytorch.org/whl/cpu" in result.output
        )
    # the embedded engine is an MoE model and the demo turns routed experts on: every call has them
    assert "calls with routed experts" in result.output
    calls = [c for r in rollouts for c in r.calls]
    assert calls and all(c.routed_experts is not None for c in calls)
    assert f"{len(calls)} / {len(calls)}" in result.output


@pytest.mark.parametrize("agent", ["strands", "langgraph"])
def test_demo_with_a_framework_agent(
    agent: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the framework agents ship in the package: any directory works
    out = tmp_path / "demo"
    result = CliRunner().invoke(
        cli, ["demo", "--agent", agent, "--tasks", "2", "--group-size", "2", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    rollouts = read_jsonl(out / "rollouts.jsonl")
    assert len(rollouts) == 4 and all(r.status == "completed" and r.calls for r in rollouts)
    assert all(r.reward is not None and r.reward > -1.5 for r in rollouts)
    # The frameworks stream; the demo's sessions still get routing on every call.
    calls = [c for r in rollouts for c in r.calls]
    assert any(c.stream for c in calls)
    assert all(c.routed_experts is not None and c.routed_experts.shape[0] > 0 for c in calls)


def test_export_adapter_errors_are_clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import rollwire.plugins

    class Broken:
        def export(self, rollouts: object, out: Path) -> Path:
            raise RuntimeError("the batch needs token ids (capture=tokens)")

    src = tmp_path / "in.jsonl"
    src.write_bytes(b"")
    monkeypatch.setattr(rollwire.plugins, "load_trainer", lambda name: Broken())
    result = CliRunner().invoke(
        cli, ["export", "--in", str(src), "--to", "fixture-ok", "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 1
    assert "could not export" in result.output and "needs token ids" in result.output
    assert "Traceback" not in result.output


def test_run_runner_errors_are_clean(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(orjson.dumps({"task_id": "w1", "secret": "crane"}) + b"\n")
    args = [
        "run", "--runner", "http:", "--tasks", str(tasks), "--backend", "embedded",
        "--out", str(tmp_path / "out.jsonl"), "--no-progress",
    ]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1, result.output
    assert "needs agent URLs" in result.output and "Traceback" not in result.output


def test_demo_unknown_or_missing_agent_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DemoError, match="choose one of"):
        load_demo_agent("crewai")
    result = CliRunner().invoke(cli, ["demo", "--agent", "nope", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "unknown demo agent" in result.output


def test_run_then_export(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(orjson.dumps({"task_id": "w1", "secret": "crane"}) + b"\n")
    out = tmp_path / "rollouts.jsonl"
    args = [
        "run", "--agent", "rollwire.envs.wordle.agent_openai:app", "--tasks", str(tasks), "--group-size", "2",
        "--backend", "embedded", "--max-tokens", "16", "--out", str(out), "--no-progress",
    ]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    rollouts = read_jsonl(out)
    assert len(rollouts) == 2 and all(r.task_id == "w1" and r.calls for r in rollouts)
    assert all(r.reward == -1.5 for r in rollouts)  # the raw random model makes no valid guess
    copy = tmp_path / "copy.jsonl"
    assert (
        CliRunner()
        .invoke(cli, ["export", "--in", str(out), "--to", "jsonl", "--out", str(copy)])
        .exit_code
        == 0
    )
    assert [r.rollout_id for r in read_jsonl(copy)] == [r.rollout_id for r in rollouts]
    trainers = [
        p.name
        for p in discover("trainers")
        if p.status == "ok" and not p.name.startswith("fixture-")
    ]
    for name in trainers:
        dest = tmp_path / f"{name}.out"
        result = CliRunner().invoke(
            cli, ["export", "--in", str(out), "--to", name, "--out", str(dest)]
        )
        assert result.exit_code == 0, result.output
        assert dest.exists()
    result = CliRunner().invoke(
        cli, ["export", "--in", str(out), "--to", "no-such-trainer", "--out", str(copy)]
    )
    assert result.exit_code == 2 and "no such trainer adapter is usable" in result.output
