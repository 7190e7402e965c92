"""The held-out evaluation of ``rollwire train`` counts a rollout that failed (past its
``--deadline``) as a miss, records how many did (``EvalPoint.failed``, in ``baseline.json`` and
the summary) and says so, so a slow server is not read as a policy that forgot its task."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rollwire.agent.app import RolloutApp
from rollwire.testing.scripted import scripted_rollouts
from rollwire.trainer.training_run import evaluator

app = RolloutApp(failure_reward=0.0)
RELEASE = threading.Event()  # set at the end: a stuck rollout's thread goes home


@app.rollout_entrypoint
def play(payload: dict[str, Any]) -> dict[str, Any]:
    if payload["slow"]:
        RELEASE.wait(30)  # past the deadline: the rollout fails
    return {"reward": 1.0}


def test_failed_held_out_rollouts_are_counted_and_said(tmp_path: Path) -> None:
    said: list[str] = []
    settings = SimpleNamespace(
        sampling={"temperature": 1.0}, eval_k=1, deadline=1.0, concurrency=8, log=said.append,
        out=tmp_path,
    )  # fmt: skip
    held = [{"task_id": f"t{i}", "slow": i < 2} for i in range(5)]
    try:
        with scripted_rollouts(app, lambda messages, tools: "x", deadline=1.0) as (client, _):
            client.deadline_grace = 1.0
            point = evaluator(settings, client, held)(3)
    finally:
        RELEASE.set()
    assert (point.attempts, point.failed) == (5, 2)
    assert point.pass_at_1 == 3 / 5  # the failed ones count as misses
    (line,) = said
    assert "2 of 5 rollouts failed" in line and "--deadline (1 s" in line
