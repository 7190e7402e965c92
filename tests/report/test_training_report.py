"""The training section of ``rollwire inspect``: a ``rollwire train`` folder as one HTML page with
the reward curve, the pass rate per step beside held-out pass@1, and the time split."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from rollwire.cli.app import app
from rollwire.report.training import is_training_run, write_training_report


def _point(step: int, p: float) -> dict[str, object]:
    return {"step": step, "pass_at_1": p, "pass_at_1_low": p - 0.05, "pass_at_1_high": p + 0.05,
            "mean_reward": p, "tasks": 32, "attempts": 128, "seconds": 3.0, "pass_at_k": {}}  # fmt: skip


def _run(folder: Path, steps: int = 6) -> Path:
    folder.mkdir()
    records = []
    for i in range(1, steps + 1):
        records.append(
            {
                "step": i,
                "reward_mean": i / steps,
                "reward_std": 0.1,
                "pass_rate": i / steps,
                "rollouts": 32,
                "failed": 0,
                "sampled_tokens": 128,
                "rollout_s": 4.0,
                "train_s": 1.5,
                "sync_s": 0.5,
                "tokens_per_s": 32.0,
                "policy_versions": [str(i - 1)],
                "trl": {
                    "loss": 0.01,
                    "kl_behaviour": 1e-8,
                    "is_ratio_min": 1.0,
                    "is_ratio_max": 1.0,
                },
                "eval": _point(i, 0.9) if i == steps else None,
            }
        )
    (folder / "steps.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    summary = {"baseline": _point(0, 0.25), "final": _point(steps, 0.9), "evals": [],
               "warmup_steps": 60, "wall_s": 120.0}  # fmt: skip
    (folder / "summary.json").write_bytes(orjson.dumps(summary))
    return folder


def test_report_draws_each_step_and_the_held_out_intervals(tmp_path: Path) -> None:
    run = _run(tmp_path / "run")
    assert is_training_run(run) and not is_training_run(tmp_path)
    html = write_training_report(run).read_text()
    assert (run / "report.html").is_file()
    assert "held-out pass@1 before step 1" in html and "0.250 [0.200, 0.300]" in html
    assert "held-out pass@1 after step 6" in html and "0.900 [0.850, 0.950]" in html
    assert "60 steps" in html  # the warm-up is named, not hidden
    reward_line = re.search(r'<polyline class="s0" fill="none" points="([^"]+)"', html)
    assert reward_line is not None
    assert len(reward_line.group(1).split()) == 6  # one point per step
    assert html.count('class="s1 ci"') == 2  # baseline and final, with their intervals
    assert html.count("<rect") == 18  # rollout, train and sync per step
    assert "http" not in html.replace("http-equiv", "")  # nothing fetched


def test_inspect_a_run_folder_writes_the_training_report(tmp_path: Path) -> None:
    run = _run(tmp_path / "run", steps=3)
    result = CliRunner().invoke(app, ["inspect", str(run), "--out", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "r.html").is_file() and "reward curve" in result.output


def test_a_folder_without_steps_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no steps\.jsonl"):
        write_training_report(tmp_path)
    result = CliRunner().invoke(app, ["inspect", str(tmp_path)])
    assert result.exit_code == 2 and "not a rollwire train run folder" in " ".join(
        result.output.split()
    )


def test_tool_call_health_per_step_and_the_flagged_step(tmp_path: Path) -> None:
    run = _run(tmp_path / "run", steps=2)
    lines = (run / "steps.jsonl").read_bytes().splitlines()
    first, second = (orjson.loads(line) for line in lines)
    first |= {"tool_offered_calls": 16, "tool_calls_parsed": 15, "tool_call_text_unparsed": 1,
              "flags": ["tool_call_text_unparsed"]}  # fmt: skip
    second |= {"tool_offered_calls": 16, "tool_calls_parsed": 0, "tool_call_text_unparsed": 16,
               "flags": ["no_tool_calls_parsed", "tool_call_text_unparsed"]}  # fmt: skip
    (run / "steps.jsonl").write_bytes(orjson.dumps(first) + b"\n" + orjson.dumps(second) + b"\n")
    html = write_training_report(run).read_text()
    assert "<td>15 / 16, 1 unparsed</td>" in html
    assert "⚠ 0 / 16, 16 unparsed: no tool call parsed" in html
