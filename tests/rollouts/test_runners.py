"""Each runner end to end against a real gateway and the scripted engine: local (see
test_client.py), http, AgentCore (boto3 against a local stand-in of the InvokeAgentRuntime REST
route), and Ray (a local ``ray.init``)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rollwire.agent.app import SESSION_HEADER, RolloutApp
from rollwire.agent.serving import ServerThread
from rollwire.data.protocol import Group
from rollwire.envs.wordle import make_tasks
from rollwire.envs.wordle.agent_openai import app as wordle_app
from rollwire.trainer.client import RolloutClient
from rollwire.trainer.runners import HttpRunner, LocalRunner, RateLimiter, RunnerError, make_runner
from rollwire.trainer.runners.agentcore import AgentCoreRunner, runtime_session_id


def _check_wordle(groups: list[Group], n_groups: int, group_size: int) -> None:
    assert len(groups) == n_groups
    for g in groups:
        assert len(g.rollouts) == group_size
        for r in g.rollouts:
            assert r.status == "completed", r.error
            assert r.reward is not None and r.reward > -1.0 and r.calls  # valid guesses were made


def test_http_runner_spreads_sessions_over_agents(stack: Any) -> None:
    second = RolloutApp(failure_reward=-1.5)
    second.rollout_entrypoint(wordle_app.handler)
    before = wordle_app.completed
    with ServerThread(wordle_app) as a, ServerThread(second) as b:
        client = RolloutClient(
            stack,
            runner=f"http:{a.url},{b.url}",
            group_size=2,
            sampling={"max_tokens": 48},
            deadline=60,
        )
        _check_wordle(client.run(make_tasks(2, seed=11)), 2, 2)
        client.close()
        assert (wordle_app.completed - before) + second.completed == 4


async def test_http_runner_pins_a_session_to_one_agent() -> None:
    runner = HttpRunner(["http://127.0.0.1:1", "http://127.0.0.1:2"])
    sids = [f"session-{i}" for i in range(64)]
    assert {runner.url_for(s) for s in sids} == set(runner.urls)  # spread over the pool
    assert all(runner.url_for(s) == runner.url_for(s) for s in sids)  # and stable
    app = RolloutApp()
    app.rollout_entrypoint(lambda p: 1.0)
    with ServerThread(app) as server:
        # an agent whose answer may have been lost keeps its session: retries go there again
        async def lost(request: Request) -> Response:
            await request.body()
            return JSONResponse({"error": "bad gateway"}, status_code=502)

        with ServerThread(Starlette(routes=[Route("/invocations", lost, methods=["POST"])])) as lb:
            runner = HttpRunner([lb.url, server.url])
            sid = next(s for s in sids if runner.url_for(s) == lb.url)
            for _ in range(3):
                with pytest.raises(RunnerError) as info:
                    await runner.invoke({"x": 1}, sid)
                assert info.value.retryable and runner.url_for(sid) == lb.url
            await runner.aclose()
        # a refused connection delivered nothing: only then does the session move on
        runner = HttpRunner(["http://127.0.0.1:1", server.url])
        sid = next(s for s in sids if runner.url_for(s) == "http://127.0.0.1:1")
        with pytest.raises(RunnerError):
            await runner.invoke({"x": 1}, sid)
        assert runner.url_for(sid) == server.url
        await runner.release(sid)
        assert runner.url_for(sid) == "http://127.0.0.1:1"
        await runner.aclose()


async def test_http_runner_errors_are_infrastructure_errors() -> None:
    runner = HttpRunner("127.0.0.1:1")  # nothing listens on port 1
    assert runner.urls == ["http://127.0.0.1:1"]
    with pytest.raises(RunnerError) as info:
        await runner.invoke({"x": 1}, "s")
    assert info.value.retryable
    await runner.aclose()
    app = RolloutApp()
    app.rollout_entrypoint(lambda p: 1.0)
    with ServerThread(app) as server:
        runner = HttpRunner([server.url])
        with pytest.raises(RunnerError) as info:
            await runner.invoke({"_rollwire": {"session_id": "only"}}, "s")  # malformed: 400
        assert not info.value.retryable
        await runner.aclose()


async def test_a_shared_http_runner_drain_leaves_a_pool_in_use_open() -> None:
    """One run's drain must not close the pool another run's invocation is using (same loop)."""

    async def slow(request: Request) -> Response:
        await request.body()
        await asyncio.sleep(0.5)
        return JSONResponse({"status": "accepted"})

    with ServerThread(Starlette(routes=[Route("/invocations", slow, methods=["POST"])])) as agent:
        runner = HttpRunner([agent.url])
        other_run = asyncio.create_task(runner.invoke({"x": 1}, "other-run"))
        await asyncio.sleep(0.1)  # its request is in flight
        await runner.drain(["this-run"])
        await other_run  # not broken by the drain
        await runner.drain(["other-run"])
        assert runner._sessions == {}  # nothing in flight any more: the last drain closed it
        await runner.aclose()


def test_make_runner_specs() -> None:
    assert isinstance(make_runner("local", app=wordle_app), LocalRunner)
    assert isinstance(make_runner("http:http://h:1,http://h:2"), HttpRunner)
    with pytest.raises(ValueError, match="unknown runner"):
        make_runner("carrier-pigeon")
    with pytest.raises(ValueError, match="needs the agent app"):
        make_runner("local")


async def test_rate_limiter_spaces_acquisitions() -> None:
    limiter = RateLimiter(50.0)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    for _ in range(6):
        await limiter.acquire()
    assert loop.time() - t0 >= 0.09


class _RecordingBotoClient:
    """Stands in for boto3's ``bedrock-agentcore`` client: records when each invoke happened."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._lock = threading.Lock()

    def invoke_agent_runtime(self, **kwargs: Any) -> dict[str, Any]:
        with self._lock:
            self.times.append(time.monotonic())
        return {"statusCode": 200}

    def stop_runtime_session(self, **kwargs: Any) -> dict[str, Any]:
        return {}


async def test_agentcore_runner_keeps_to_its_tps_limit() -> None:
    pytest.importorskip("botocore")
    boto = _RecordingBotoClient()
    runner = AgentCoreRunner("arn:aws:bedrock-agentcore:us-east-1:1:runtime/x", tps=20, client=boto)
    await asyncio.gather(*(runner.invoke({"n": i}, f"s{i}") for i in range(6)))
    await runner.aclose()
    times = sorted(boto.times)
    assert len(times) == 6 and times[-1] - times[0] >= 0.2  # 6 calls at 20/s: 5 gaps of 50 ms


class AgentCoreStandIn:
    """A LOCAL STAND-IN for the AgentCore data plane (not AWS): it serves the InvokeAgentRuntime
    REST route ``POST /runtimes/{arn}/invocations?qualifier=...`` (and StopRuntimeSession) the way
    boto3's ``bedrock-agentcore`` client calls it, and forwards each invocation to an agent
    container (a RolloutApp) on its ``/invocations`` with the session header."""

    def __init__(self, agent_url: str) -> None:
        self.agent_url = agent_url
        self.invocations: list[tuple[str, str, str]] = []
        self.stopped: list[str] = []
        self._lock = threading.Lock()
        self.app = Starlette(
            routes=[
                Route("/runtimes/{arn:path}/invocations", self._invoke, methods=["POST"]),
                Route("/runtimes/{arn:path}/stopruntimesession", self._stop, methods=["POST"]),
            ]
        )

    async def _invoke(self, request: Request) -> Response:
        sid = request.headers.get(SESSION_HEADER, "")
        if len(sid) < 33:
            return JSONResponse({"message": "runtimeSessionId too short"}, status_code=400)
        with self._lock:
            self.invocations.append(
                (request.path_params["arn"], request.query_params.get("qualifier", ""), sid)
            )
        async with httpx.AsyncClient(timeout=30) as http:
            resp = await http.post(
                f"{self.agent_url}/invocations",
                content=await request.body(),
                headers={SESSION_HEADER: sid, "content-type": "application/json"},
            )
        return Response(
            resp.content,
            status_code=resp.status_code,
            media_type="application/json",
            headers={SESSION_HEADER: sid},
        )

    async def _stop(self, request: Request) -> Response:
        sid = request.headers.get(SESSION_HEADER, "")
        with self._lock:
            self.stopped.append(sid)
        return JSONResponse({}, headers={SESSION_HEADER: sid})


def test_agentcore_runner_through_boto3_against_a_local_stand_in(
    stack: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("boto3")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")  # dummy credentials for the local stand-in
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    arn = "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/wordle-abc123"
    with ServerThread(wordle_app) as agent:
        standin = AgentCoreStandIn(agent.url)
        with ServerThread(standin.app) as aws:
            runner = AgentCoreRunner(
                arn, "us-east-1", endpoint_url=aws.url, qualifier="DEFAULT", tps=20
            )
            client = RolloutClient(
                stack, runner=runner, group_size=2, sampling={"max_tokens": 48}, deadline=60
            )
            groups = client.run(make_tasks(1, seed=12))
            asyncio.run(runner.aclose())
    _check_wordle(groups, 1, 2)
    assert [(a, q) for a, q, _ in standin.invocations] == [(arn, "DEFAULT")] * 2
    sids = {r.rollout_id for r in groups[0].rollouts}
    assert {s for _, _, s in standin.invocations} == {runtime_session_id(s) for s in sids}
    assert sorted(standin.stopped) == sorted(
        runtime_session_id(s) for s in sids
    )  # sessions released
    assert all(len(runtime_session_id(s)) >= 33 for s in sids)


CRASHING_AGENT = """
import os
from rollwire.agent.app import RolloutApp

app = RolloutApp()


@app.rollout_entrypoint
def play(payload):
    os._exit(1)  # the worker process dies: no terminal record from the app
"""


# Timed without its fixtures: starting Ray (bounded by its own three tries) took over two
# minutes of the test's budget on a loaded machine.
@pytest.mark.timeout(1800, func_only=True)
def test_ray_runner_runs_rollouts_as_ray_tasks(stack: Any, ray_session: Path) -> None:
    (ray_session / "crashing_agent.py").write_text(CRASHING_AGENT)  # on the workers' path
    from rollwire.trainer.runners.ray import RayRunner

    runner = RayRunner("rollwire.envs.wordle.agent_openai:app")  # joins the session's Ray
    try:
        # The run returns when both rollouts report (~25 s here), so the deadline is only a
        # bound for a hang: at load 7-10 on the two cores a Ray worker took a minute to start
        # and a Wordle rollout (forward passes of the engine) ran past 240 s.
        client = RolloutClient(
            stack, runner=runner, group_size=2, sampling={"max_tokens": 48}, deadline=900
        )
        _check_wordle(client.run(make_tasks(1, seed=13)), 1, 2)
        # A dead worker is noticed when its task fails, not after deadline + grace: the error is
        # the watcher's ("the Ray task of this rollout died"), never the deadline's.
        crashing = RayRunner("crashing_agent:app", failure_reward=-4.0)
        deadline = 600
        client = RolloutClient(stack, runner=crashing, group_size=1, deadline=deadline)
        t0 = time.monotonic()
        ((r,),) = [g.rollouts for g in client.run([{"id": "t"}])]
        assert time.monotonic() - t0 < deadline
        assert r.status == "failed" and r.reward == -4.0 and "Ray task" in (r.error or "")
        asyncio.run(crashing.aclose())
    finally:
        asyncio.run(runner.aclose())
