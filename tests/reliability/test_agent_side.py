"""Agent side: RolloutApp refuses oversized and over-deep bodies with a 4xx; a hung agent costs
the trainer at most the rollout's deadline + grace, then a terminal ``failed`` record."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rollwire.agent.app import RolloutApp
from rollwire.agent.serving import ServerThread
from rollwire.testing.null_backend import NullBackend
from rollwire.trainer.client import RolloutClient
from rollwire.trainer.runners import HttpRunner, RunnerError


@pytest.fixture
def agent() -> Iterator[str]:
    app = RolloutApp(max_body_bytes=65536)

    @app.entrypoint
    def handler(payload: dict[str, object]) -> dict[str, object]:
        return {"echo": len(payload)}

    with ServerThread(app) as server:
        yield server.url


def test_rollout_app_refuses_big_and_deep_bodies(agent: str) -> None:
    r = httpx.post(agent + "/invocations", content=b'{"a": "' + b"x" * 70_000 + b'"}', timeout=30)
    assert r.status_code == 413 and "65536" in r.json()["error"]
    r = httpx.post(agent + "/invocations", content=b"[" * 3000 + b"]" * 3000, timeout=30)
    assert r.status_code == 400
    r = httpx.post(
        agent + "/invocations", content=b'{"a": ' * 2000 + b"1" + b"}" * 2000, timeout=30
    )
    assert r.status_code == 400
    assert httpx.post(agent + "/invocations", json={"prompt": "hi"}, timeout=30).status_code == 200


@pytest.fixture
def hung_agent() -> Iterator[str]:
    async def invocations(request: Request) -> Response:
        await asyncio.sleep(3600)  # an agent that took the request and hangs
        return Response()

    async def ping(request: Request) -> Response:
        return Response('{"status": "Healthy"}', media_type="application/json")

    app = Starlette(
        routes=[
            Route("/invocations", invocations, methods=["POST"]),
            Route("/ping", ping, methods=["GET"]),
        ]
    )
    with ServerThread(app) as server:
        yield server.url


async def test_try_timeout_stops_at_deadline_plus_grace(hung_agent: str) -> None:
    runner = HttpRunner(hung_agent, timeout=60.0, grace=0.5)
    payload = {"prompt": "x", "_rollwire": {"version": 1, "deadline": time.time() + 1.0}}
    assert 1.0 <= runner.try_timeout(payload) <= 1.6
    assert runner.try_timeout({"prompt": "no deadline"}) == 60.0
    t = time.monotonic()
    with pytest.raises(RunnerError):
        await runner.invoke(payload, "s1")
    assert time.monotonic() - t < 5.0  # not the 60 s timeout
    await runner.drain()


def test_hung_agent_gives_a_failed_record_by_deadline_plus_grace(hung_agent: str) -> None:
    with ServerThread(NullBackend()) as backend:
        client = RolloutClient(
            "embedded",
            runner=HttpRunner(hung_agent, timeout=60.0, grace=0.5),
            backends=[(backend.url, "vllm")],
            group_size=1,
            deadline=2.0,
            deadline_grace=1.0,
            infra_retries=0,
        )
        t = time.monotonic()
        (group,) = client.run([{"prompt": "hang"}])
        took = time.monotonic() - t
    (rollout,) = group.rollouts
    assert rollout.status in ("failed", "timeout"), rollout.status
    assert rollout.terminal
    assert took < 12.0, took  # deadline 2 s + grace, not 60 s tries
