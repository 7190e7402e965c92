"""``RolloutClient.run_batch``, as agentcore-rl-toolkit's: one rollout per payload, at most
``max_concurrent_sessions`` at once, ``BatchItem`` in completion order."""

from __future__ import annotations

import asyncio
from typing import Any

from rollwire.agent.app import RolloutApp
from rollwire.trainer.batch import BatchItem
from rollwire.trainer.client import RolloutClient
from rollwire.trainer.runners import LocalRunner

app = RolloutApp()
running: list[int] = []
peak: list[int] = [0]


@app.rollout_entrypoint
async def handler(payload: dict[str, Any]) -> dict[str, Any]:
    running.append(1)
    peak[0] = max(peak[0], len(running))
    try:
        await asyncio.sleep(payload["delay"])
        if payload.get("boom"):
            raise RuntimeError("tool crashed")
        return {"reward": payload["score"], "metrics": {"delay": payload["delay"]}}
    finally:
        running.pop()


def test_run_batch_yields_items_in_completion_order() -> None:
    payloads = [
        {"id": "slow", "delay": 0.6, "score": 0.1},
        {"id": "fast", "delay": 0.05, "score": 0.9},
        {"id": "boom", "delay": 0.2, "score": 0.0, "boom": True},
        {"id": "mid", "delay": 0.3, "score": 0.5},
    ]
    with RolloutClient("embedded", runner=LocalRunner(app)) as client:
        items = list(client.run_batch(payloads, max_concurrent_sessions=4, timeout=30))
    assert all(isinstance(i, BatchItem) for i in items)
    assert [i.index for i in items] == [1, 2, 3, 0]  # completion order, not input order
    by_index = {i.index: i for i in items}
    assert by_index[1].success and by_index[1].result is not None
    assert by_index[1].result["rewards"] == 0.9 and by_index[1].result["status_code"] == 200
    assert not by_index[2].success and "tool crashed" in (by_index[2].error or "")
    assert by_index[2].result is not None and by_index[2].result["status_code"] == 500
    assert all(i.elapsed is not None and i.elapsed > 0 for i in items)
    assert by_index[0].rollout is not None and by_index[0].rollout.reward == 0.1


def test_run_batch_keeps_to_max_concurrent_sessions() -> None:
    peak[0] = 0
    payloads = [{"id": str(i), "delay": 0.1, "score": 1.0} for i in range(6)]
    with RolloutClient("embedded", runner=LocalRunner(app)) as client:
        items = list(client.run_batch(payloads, max_concurrent_sessions=2, timeout=30))
    assert sorted(i.index for i in items) == list(range(6)) and all(i.success for i in items)
    assert peak[0] == 2


def test_run_batch_times_out_a_rollout_after_timeout_seconds() -> None:
    payloads = [{"id": "late", "delay": 5.0, "score": 1.0}]
    with RolloutClient("embedded", runner=LocalRunner(app), deadline_grace=0.5) as client:
        [item] = list(client.run_batch(payloads, max_concurrent_sessions=1, timeout=0.5))
    assert not item.success and "deadline" in (item.error or "")
