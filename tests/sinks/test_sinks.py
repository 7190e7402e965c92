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
from typing import Any

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


class _Recording:
    def __init__(self) -> None:
        self.logged: list[tuple[int, dict[str, float]]] = []
        self.tags: dict[str, str] = {}
        self.closed = 0

    def log(self, metrics: Any, step: int) -> None:
        self.logged.append((step, dict(metrics)))

    def set_tags(self, tags: Any) -> None:
        self.tags.update(tags)

    def close(self) -> None:
        self.closed += 1


def test_step_logger_aggregates_by_step_or_every_n() -> None:
    from rollwire.metrics_sinks import StepLogger
    from rollwire.testing.samples import merged_rollout

    sink = _Recording()
    logger = StepLogger(sink, every=2)
    assert logger.add(merged_rollout("a", reward=1.0), step=3) is None
    logger.add(merged_rollout("b", reward=0.0), step=3)  # same step: still buffered
    logged = logger.add(merged_rollout("c", reward=0.5), step=4)  # a new step logs step 3
    assert logged is not None and logged["rollwire/reward/mean"] == 0.5
    assert [s for s, _ in sink.logged] == [3]
    logger.add(merged_rollout("d", reward=1.0))  # no step: a new buffer (step 4 logged first)
    logger.add(merged_rollout("e", reward=0.0))  # every=2 rollouts without a step: logged
    assert [(s, m["rollwire/rollouts/total"]) for s, m in sink.logged] == [(3, 2), (4, 1), (5, 2)]
    assert logger.flush() is None
    with_version = merged_rollout("f")
    for call in with_version.calls:
        call.policy_version = "7"
    logger.log_groups([with_version])
    assert sink.logged[-1][0] == 6 and sink.logged[-1][1]["rollwire/policy/version"] == 7.0
    assert sink.tags == {"policy_version": "7"}
    logger.close()
    logger.close()
    assert sink.closed == 1


def test_metrics_spec_and_every_from_the_environment() -> None:
    from rollwire.metrics_sinks import metrics_every, metrics_spec

    assert metrics_spec(None, {}) is None and metrics_spec(None, {"ROLLWIRE_METRICS": " "}) is None
    assert metrics_spec(None, {"ROLLWIRE_METRICS": "tensorboard:tb"}) == "tensorboard:tb"
    assert metrics_spec("mlflow:m", {"ROLLWIRE_METRICS": "tensorboard:tb"}) == "mlflow:m"
    assert (
        metrics_every(None, {}) == 64 and metrics_every(None, {"ROLLWIRE_METRICS_EVERY": "8"}) == 8
    )
    with pytest.raises(ValueError, match="positive integer, got 'x'"):
        metrics_every(None, {"ROLLWIRE_METRICS_EVERY": "x"})
