"""``run_batch`` as agentcore-rl-toolkit's ``RolloutClient`` offers it: one rollout per payload,
at most ``max_concurrent_sessions`` at once, each given ``timeout`` seconds, yielded as
:class:`BatchItem` in completion order (``item.index`` says which payload)."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rollwire.data.protocol import Rollout
from rollwire.trainer.control_plane import ControlPlane
from rollwire.trainer.runners.base import RateLimiter

if TYPE_CHECKING:
    from rollwire.trainer.client import RolloutClient

__all__ = ["BatchItem", "arun_batch", "run_batch"]


@dataclass
class BatchItem:
    """One payload's outcome: ``success`` (the rollout completed), ``result`` (its record in the
    toolkit's shape: ``rewards``, ``status_code``, ``metrics``), ``error``, ``index`` of the
    payload, ``elapsed`` seconds; ``rollout`` is the rollout itself (calls included)."""

    success: bool
    result: dict[str, Any] | None = None
    error: str | None = None
    index: int | None = None
    elapsed: float | None = None
    rollout: Rollout | None = None


def _item(index: int, rollout: Rollout, started: float) -> BatchItem:
    ok = rollout.status == "completed"
    result = {
        "rewards": rollout.reward,
        "status_code": 200 if ok else 500,
        "stop_reason": "end_turn" if ok else (rollout.error or rollout.status),
        "metrics": dict(rollout.metrics),
        "rollout_id": rollout.rollout_id,
    }
    return BatchItem(
        success=ok,
        result=result,
        error=None if ok else (rollout.error or f"rollout {rollout.status}"),
        index=index,
        elapsed=time.monotonic() - started,
        rollout=rollout,
    )


async def arun_batch(
    client: RolloutClient,
    payloads: Sequence[Mapping[str, Any]],
    max_concurrent_sessions: int,
    timeout: float = 900.0,
) -> AsyncIterator[BatchItem]:
    """Async :func:`run_batch`."""
    if max_concurrent_sessions < 1:
        raise ValueError(
            f"max_concurrent_sessions must be at least 1, got {max_concurrent_sessions}"
        )
    runner, _owned = client._get_runner()
    gw = ControlPlane(client.gateway_url, client.admin_key, max_concurrent_sessions)
    sem = asyncio.Semaphore(max_concurrent_sessions)
    limiter = RateLimiter(client.rate_limit)
    sids: list[str] = []

    async def one(index: int, payload: Mapping[str, Any]) -> BatchItem:
        started = time.monotonic()
        task = dict(payload)
        task_id = str(task.get("task_id") or task.get("id") or index)
        group_id = f"{task_id}-{uuid.uuid4().hex[:10]}"
        rollout = await client._rollout(
            gw, runner, sem, limiter, task, task_id, group_id, 0, lambda r: None, sids, timeout
        )
        return _item(index, rollout, started)

    jobs = [asyncio.create_task(one(i, p)) for i, p in enumerate(payloads)]
    try:
        for fut in asyncio.as_completed(jobs):
            yield await fut
    finally:
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
        await client._drain(runner, sids)
        await gw.aclose()


def run_batch(
    client: RolloutClient,
    payloads: Sequence[Mapping[str, Any]],
    max_concurrent_sessions: int,
    timeout: float = 900.0,
) -> Iterator[BatchItem]:
    """Yield each payload's :class:`BatchItem` as soon as its rollout is terminal (blocking; the
    rollouts run on an event loop of their own thread)."""
    items: queue.Queue[tuple[str, Any]] = queue.Queue()

    async def produce() -> None:
        async for item in arun_batch(client, payloads, max_concurrent_sessions, timeout):
            items.put(("item", item))

    def target() -> None:
        try:
            asyncio.run(produce())
        except BaseException as exc:
            items.put(("error", exc))
        else:
            items.put(("done", None))

    thread = threading.Thread(target=target, name="rollwire-run-batch", daemon=True)
    thread.start()
    while True:
        kind, value = items.get()
        if kind == "item":
            yield value
        elif kind == "error":
            raise value
        else:
            break
    thread.join()
