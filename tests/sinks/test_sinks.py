"""Each metrics sink round-trips: logged through rollwire, read back with the library's reader.

The libraries run in a network namespace with only loopback up (they can phone home); where
``unshare`` is not permitted (not root) they run with their offline and telemetry switches.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from rollwire.metrics_sinks import MissingSinkExtra, make_sink, step_metrics
from rollwire.testing.chat_samples import CHAR_TOKENIZER, chat_batch

SCRIPT = Path(__file__).with_name("roundtrip.py")
OFFLINE = {
    "WANDB_MODE": "offline",
    "WANDB_SILENT": "true",
    "WANDB_DISABLE_GIT": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "1",
}


@cache
def _netns() -> list[str]:
    probe = subprocess.run(
        ["unshare", "-n", "sh", "-c", "ip link set lo up"], capture_output=True, check=False
    )
    if probe.returncode != 0:
        return []
    return ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"]


def _script(*args: str) -> dict:
    proc = subprocess.run(
        [*_netns(), sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **OFFLINE},
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _roundtrip(kind: str, where: Path) -> dict:
    """Log in one process; read back in another, once the writer has exited."""
    wrote = _script("write", kind, str(where))
    names = sorted({k for m in wrote["logged"].values() for k in m})
    arg = json.dumps({"ref": wrote["ref"], "names": names})
    return {"logged": wrote["logged"], "read": _script("read", kind, str(where), arg)}


def _same(logged: dict[str, dict[str, float]], read: dict[str, dict[str, float]]) -> None:
    assert sorted(read) == sorted(logged)
    for step, metrics in logged.items():
        assert set(read[step]) == set(metrics), step
        for name, value in metrics.items():
            assert read[step][name] == pytest.approx(value, rel=1e-6), (step, name)


@pytest.mark.parametrize("kind", ["tensorboard", "mlflow", "wandb"])
def test_sink_round_trip(kind: str, tmp_path: Path) -> None:
    out = _roundtrip(kind, tmp_path / kind)
    logged, read = out["logged"], out["read"]
    _same(logged, read["steps"])
    assert read["tags"]["policy_version"] == "v3"
    assert logged["0"]["forks/think_stripped"] == 1.0 and logged["0"]["calls/per_s"] == 19 / 2.0
    if kind == "mlflow":
        assert read["status"] == "FINISHED"


def test_step_metrics_figures() -> None:
    m = step_metrics(chat_batch(), tokenizer=CHAR_TOKENIZER, wall_s=4.0, prefix="train/")
    assert m["train/rollouts/total"] == 9 and m["train/calls/total"] == 19
    assert m["train/calls/per_s"] == pytest.approx(19 / 4)
    assert {k for k in m if k.startswith("train/forks/")} >= {
        f"train/forks/{k}"
        for k in ("template", "retokenized", "think_stripped", "truncated", "other")
    }
    assert m["train/failures/failed"] == 1 and m["train/failures/error/TimeoutError"] == 1
    assert m["train/calls/off_policy"] == 1 and 0 < m["train/experts/coverage"] < 1
    assert m["train/reward/mean"] == pytest.approx(0.34375)
    assert all(isinstance(v, float) for v in m.values())


def test_make_sink_says_what_is_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="use tensorboard:DIR"):
        make_sink("tensorboard")
    with pytest.raises(ValueError, match="unknown metrics sink 'neptune'"):
        make_sink("neptune:x")
    monkeypatch.setitem(sys.modules, "tensorboard.summary", None)
    with pytest.raises(MissingSinkExtra, match=r'pip install "rollwire\[tensorboard\]"'):
        make_sink("tensorboard:/tmp/x")


def _tensorboard_scalars(where: Path) -> dict[str, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    acc = EventAccumulator(str(where), size_guidance={"tensors": 0})
    acc.Reload()
    return {
        name: float(tensor_util.make_ndarray(acc.Tensors(name)[-1].tensor_proto))
        for name in acc.Tags()["tensors"]
    }


def test_run_and_eval_log_to_a_sink(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from rollwire.cli import app

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"task_id": "t0", "secret": "crane"}\n')
    runner = CliRunner()
    result = runner.invoke(
        app,
        ["run", "--agent", "rollwire.envs.wordle.agent_openai:app", "--tasks", str(tasks),
         "-n", "2", "--backend", "embedded", "--max-tokens", "8", "--no-progress",
         "--out", str(tmp_path / "r.jsonl"), "--metrics", f"tensorboard:{tmp_path / 'tb'}"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "drift" in result.output and "logged this run's statistics" in result.output
    scalars = _tensorboard_scalars(tmp_path / "tb")
    assert scalars["rollouts/total"] == 2 and scalars["rollouts/groups"] == 1
    assert scalars["calls/total"] >= 2 and scalars["calls/per_s"] > 0
    result = runner.invoke(
        app,
        ["eval", "--demo", "1", "-t", "0", "-t", "1", "--k", "2", "--no-progress",
         "--out", str(tmp_path / "e.json"), "--metrics", f"tensorboard:{tmp_path / 'tb-eval'}"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    ev = _tensorboard_scalars(tmp_path / "tb-eval")
    assert set(ev) >= {"eval/temperature=0/pass@2", "eval/temperature=1/mean_reward"}
    assert 0.0 <= ev["eval/temperature=1/success_rate"] <= 1.0
