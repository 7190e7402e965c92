"""RolloutClient against a real gateway and the scripted engine: groups, stream, failures kept,
infrastructure retries only, client-side deadline."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from rollwire.client import RolloutClient, task_id_of
from rollwire.protocol import Group
from rollwire.runners import LocalRunner, RunnerError
from rollwire.trajectory import build_rows
from rollwire.wordle import make_tasks
from rollwire.wordle.agent_openai import app as wordle_app


def test_task_ids() -> None:
    assert task_id_of({"task_id": "a", "id": "b"}, 3) == "a"
    assert task_id_of({"id": 7}, 3) == "7"
    assert task_id_of({}, 3) == "3"


def test_wordle_groups_end_to_end(stack: Any) -> None:
    client = RolloutClient(
        stack,
        runner="local",
        app=wordle_app,
        group_size=2,
        sampling={"max_tokens": 48},
        deadline=60,
    )
    groups = client.run(make_tasks(2, seed=5))
    assert [g.task_id for g in groups] == ["wordle-train-0", "wordle-train-1"]
    for g in groups:
        assert len(g.rollouts) == 2 and g.complete
        assert len({r.rollout_id for r in g.rollouts}) == 2
        for r in g.rollouts:
            assert r.status == "completed" and r.group_id == g.group_id and r.task_id == g.task_id
            assert (
                r.reward is not None and r.metrics["guesses"] >= 1
            )  # the solver plays valid words
            assert 1 <= len(r.calls) <= 6
            assert r.task is not None and r.task["secret"] == g.task["secret"]  # type: ignore[index]
    rows = build_rows(groups)
    assert len(rows) == 4 and all(int(row.loss_mask.sum()) > 0 for row in rows)
    assert (
        client.stats.rollouts == 4
        and client.stats.completed == 4
        and client.stats.calls == sum(len(r.calls) for g in groups for r in g.rollouts)
    )


async def _delayed(payload: dict[str, Any]) -> dict[str, Any]:
    await asyncio.sleep(payload["delay"])
    if payload.get("boom"):
        raise ValueError("the environment crashed")
    return {"reward": payload["delay"], "metrics": {"delay": payload["delay"]}}


async def test_stream_yields_each_group_as_soon_as_it_is_complete(stack: Any) -> None:
    client = RolloutClient(stack, runner=LocalRunner(_delayed), group_size=3, deadline=30)
    tasks = [{"id": "slow", "delay": 1.0}, {"id": "fast", "delay": 0.05}]
    order: list[str] = []
    async for group in client.stream(tasks):
        assert isinstance(group, Group) and group.complete and len(group.rollouts) == 3
        order.append(str(group.task_id))
    assert order == ["fast", "slow"]
    groups = await client.arun(tasks)
    assert [g.task_id for g in groups] == ["slow", "fast"]  # arun keeps task order


async def test_failed_rollouts_are_kept_with_the_failure_reward(stack: Any) -> None:
    runner = LocalRunner(_delayed, failure_reward=-3.0)
    tasks = [{"id": "ok", "delay": 0.01}, {"id": "bad", "delay": 0.01, "boom": True}]
    groups = await RolloutClient(stack, runner=runner, group_size=2).arun(tasks)
    bad = groups[1].rollouts
    assert [r.status for r in bad] == ["failed", "failed"]
    assert all(r.reward == -3.0 and "the environment crashed" in (r.error or "") for r in bad)
    assert [r.status for r in groups[0].rollouts] == ["completed", "completed"]
    dropping = RolloutClient(stack, runner=runner, group_size=2, drop_failed_groups=True)
    kept = await dropping.arun(tasks)
    assert [g.task_id for g in kept] == ["ok"] and dropping.stats.dropped_groups == 1


class FlakyRunner:
    """Fails the first ``fail`` deliveries of every session with an infrastructure error."""

    def __init__(self, inner: LocalRunner, fail: int, retryable: bool = True) -> None:
        self.inner, self.fail, self.retryable = inner, fail, retryable
        self.attempts: dict[str, int] = {}

    async def invoke(self, payload: Mapping[str, Any], session_id: str) -> None:
        n = self.attempts[session_id] = self.attempts.get(session_id, 0) + 1
        if n <= self.fail:
            raise RunnerError("connection refused (simulated)", retryable=self.retryable)
        await self.inner.invoke(payload, session_id)

    async def drain(self) -> None:
        await self.inner.drain()

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_only_infrastructure_errors_are_retried(stack: Any) -> None:
    runs: list[str] = []

    async def handler(payload: dict[str, Any]) -> float:
        runs.append(payload["_rollwire"]["session_id"])
        raise RuntimeError("a failed rollout is never retried")

    flaky = FlakyRunner(LocalRunner(handler), fail=2)
    client = RolloutClient(stack, runner=flaky, group_size=2, infra_retries=2, retry_backoff=0.01)
    (group,) = await client.arun([{"id": "t"}])
    assert all(r.status == "failed" for r in group.rollouts)
    assert (
        sorted(flaky.attempts.values()) == [3, 3] and len(runs) == 2
    )  # 2 infra retries, 1 run each
    assert client.stats.infra_retries == 4


async def test_undeliverable_rollouts_get_a_failed_record(stack: Any) -> None:
    flaky = FlakyRunner(LocalRunner(_delayed), fail=99)
    client = RolloutClient(
        stack, runner=flaky, group_size=1, infra_retries=1, retry_backoff=0.01, failure_reward=-9
    )
    (group,) = await client.arun([{"id": "t", "delay": 0}])
    (r,) = group.rollouts
    assert (
        r.status == "failed" and r.reward == -9 and "could not reach the agent" in (r.error or "")
    )
    refused = FlakyRunner(LocalRunner(_delayed), fail=99, retryable=False)
    await RolloutClient(stack, runner=refused, group_size=1, infra_retries=3).arun(
        [{"id": "t", "delay": 0}]
    )
    assert list(refused.attempts.values()) == [1]  # a refused payload is not retried


class BlackHoleRunner:
    """Accepts every invocation and runs nothing: an agent that died without reporting."""

    async def invoke(self, payload: Mapping[str, Any], session_id: str) -> None:
        return None

    async def aclose(self) -> None:
        return None


async def test_client_deadline_closes_rollouts_nobody_reported(stack: Any) -> None:
    client = RolloutClient(
        stack, runner=BlackHoleRunner(), group_size=2, deadline=0.3, deadline_grace=0.3
    )
    (group,) = await client.arun([{"id": "t"}])
    assert [r.status for r in group.rollouts] == ["timeout", "timeout"]
    assert client.stats.client_timeouts == 2


def test_client_argument_errors() -> None:
    with pytest.raises(ValueError, match="admin key"):
        RolloutClient("http://127.0.0.1:1")
    with pytest.raises(ValueError, match="group_size"):
        RolloutClient("http://127.0.0.1:1", admin_key="k", group_size=0)
