"""RolloutClient against a real gateway and the scripted engine: groups, stream, failures kept,
infrastructure retries only, client-side deadline."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rollwire.agent.app import RolloutApp
from rollwire.agent.serving import ServerThread
from rollwire.data.protocol import Group
from rollwire.data.trajectory import build_rows
from rollwire.envs.wordle import make_tasks
from rollwire.envs.wordle.agent_openai import app as wordle_app
from rollwire.trainer import control_plane
from rollwire.trainer.client import GatewayUnavailable, RolloutClient, task_id_of
from rollwire.trainer.runners import LocalRunner, RunnerError


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

    async def drain(self, session_ids: list[str]) -> None:
        await self.inner.drain(session_ids)

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


# -- one rollout's error is that rollout's, not the run's -----------------------------------------


class BuggyRunner:
    """Delivers through a LocalRunner, but its ``nth`` invoke raises a bug (not a RunnerError)."""

    def __init__(self, inner: LocalRunner, nth: int) -> None:
        self.inner, self.nth, self.n = inner, nth, 0
        self.sids: list[str] = []

    async def invoke(self, payload: Mapping[str, Any], session_id: str) -> None:
        self.n += 1
        self.sids.append(session_id)
        if self.n == self.nth:
            raise KeyError("unexpected bug in the runner")
        await self.inner.invoke(payload, session_id)

    async def drain(self, session_ids: list[str]) -> None:
        await self.inner.drain(session_ids)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_runner_bug_fails_one_rollout_and_keeps_every_group(stack: Any) -> None:
    runner = BuggyRunner(LocalRunner(_delayed), nth=3)
    client = RolloutClient(stack, runner=runner, group_size=2, failure_reward=-7.0)
    tasks = [{"id": t, "delay": 0.05} for t in ("a", "b", "c")]
    groups = await client.arun(tasks)
    assert [g.task_id for g in groups] == ["a", "b", "c"]
    rollouts = {r.rollout_id: r for g in groups for r in g.rollouts}
    bad = rollouts[runner.sids[2]]
    assert bad.status == "failed" and bad.reward == -7.0
    assert "KeyError" in (bad.error or "") and "unexpected bug" in (bad.error or "")
    assert sum(r.status == "completed" for r in rollouts.values()) == 5
    assert client.stats.client_errors == 1


class BlipProxy:
    """A reverse proxy in front of the gateway whose control plane (``/api/...``) can be switched
    off (503), as during a gateway restart; the data plane keeps flowing."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.down = False
        self.refused = 0
        route = Route("/{path:path}", self._forward, methods=["GET", "POST", "DELETE"])
        self.server = ServerThread(Starlette(routes=[route]))

    async def _forward(self, request: Request) -> Response:
        path = request.url.path
        if self.down and path.startswith("/api/"):
            self.refused += 1
            return JSONResponse({"error": {"message": "gateway restarting"}}, status_code=503)
        headers = {
            k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")
        }
        async with httpx.AsyncClient(timeout=120) as http:
            resp = await http.request(
                request.method,
                self.upstream + path,
                params=request.query_params,
                headers=headers,
                content=await request.body(),
            )
        return Response(
            resp.content,
            status_code=resp.status_code,
            media_type=resp.headers.get("content-type", "application/json"),
        )


async def test_a_gateway_blip_mid_run_is_ridden_out(stack: Any) -> None:
    proxy = BlipProxy(stack.url)
    with proxy.server:
        gateway = SimpleNamespace(url=proxy.server.url, admin_key=stack.admin_key)
        client = RolloutClient(
            gateway,
            runner=LocalRunner(_delayed),
            group_size=2,
            concurrency=2,
            retry_backoff=0.1,
            gateway_timeout=30,
        )

        async def blip() -> None:
            await asyncio.sleep(0.4)
            proxy.down = True
            await asyncio.sleep(2.0)
            proxy.down = False

        blipping = asyncio.create_task(blip())
        groups = await client.arun([{"id": f"t{i}", "delay": 0.3} for i in range(4)])
        await blipping
    assert proxy.refused > 0 and client.stats.gateway_retries > 0
    assert len(groups) == 4
    assert all(r.status == "completed" for g in groups for r in g.rollouts)


async def test_a_gateway_down_past_the_budget_aborts_the_run_clearly() -> None:
    client = RolloutClient(
        "http://127.0.0.1:1",  # nothing listens
        admin_key="k",
        runner=LocalRunner(_delayed),
        group_size=1,
        retry_backoff=0.05,
        gateway_timeout=0.5,
    )
    t0 = time.monotonic()
    with pytest.raises(GatewayUnavailable, match=r"unreachable for .* \(gateway_timeout=0.5s\)"):
        await client.arun([{"id": "t", "delay": 0}])
    assert time.monotonic() - t0 < 5


async def test_an_aborted_run_hands_back_the_groups_that_finished(stack: Any) -> None:
    proxy = BlipProxy(stack.url)
    app = RolloutApp(shutdown_timeout=0.5)
    fast_done = threading.Event()  # the client has the fast rollout's final record

    @app.rollout_entrypoint
    async def handler(payload: dict[str, Any]) -> float:
        if payload["id"] == "slow":
            assert await asyncio.to_thread(fast_done.wait, 60)
            proxy.down = True  # the gateway goes away for good
        return 1.0

    with proxy.server:
        gateway = SimpleNamespace(url=proxy.server.url, admin_key=stack.admin_key)
        client = RolloutClient(
            gateway,
            runner="local",
            app=app,
            group_size=1,
            deadline=2.0,
            deadline_grace=0.5,
            retry_backoff=0.1,
            gateway_timeout=1.0,
        )
        tick = client._tick

        def ticked(progress: Any, bar: Any, rollout: Any) -> None:
            tick(progress, bar, rollout)
            if rollout.task_id == "fast":
                fast_done.set()

        client._tick = ticked  # type: ignore[method-assign]
        with pytest.raises(GatewayUnavailable) as info:
            await client.arun([{"id": "fast"}, {"id": "slow"}])
        await client.aclose()
    assert [g.task_id for g in info.value.groups] == ["fast"]


# -- a rollout is terminal when it is returned ---------------------------------------------------


async def test_a_failure_the_client_cannot_record_is_marked_failed_locally(
    stack: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def refuse(self: Any, session_id: str, **fields: Any) -> None:
        raise control_plane.GatewayError(403, "HTTP 403: not allowed")

    monkeypatch.setattr(control_plane.ControlPlane, "complete", refuse)
    client = RolloutClient(
        stack, runner=BlackHoleRunner(), group_size=1, deadline=0.3, deadline_grace=0.2
    )
    (group,) = await client.arun([{"id": "t"}])
    (r,) = group.rollouts
    assert r.status == "failed" and r.reward == 0.0
    assert "no terminal record" in (r.error or "")


async def test_recording_a_failure_is_retried_on_transient_errors(
    stack: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = control_plane.ControlPlane.complete
    failures = {"left": 2}

    async def flaky(self: Any, session_id: str, **fields: Any) -> None:
        if failures["left"] > 0:
            failures["left"] -= 1
            raise control_plane.GatewayError(503, "HTTP 503: busy")
        await real(self, session_id, **fields)

    monkeypatch.setattr(control_plane.ControlPlane, "complete", flaky)
    client = RolloutClient(
        stack,
        runner=BlackHoleRunner(),
        group_size=1,
        deadline=0.3,
        deadline_grace=0.2,
        retry_backoff=0.05,
    )
    (group,) = await client.arun([{"id": "t"}])
    assert group.rollouts[0].status == "timeout" and failures["left"] == 0


# -- a session runs on one agent ------------------------------------------------------------------


class LostAnswerRunner:
    """The first delivery reaches agent A, which takes the rollout, but the answer is lost (a
    read timeout, a load balancer's 502); a retry would go to agent B."""

    def __init__(self, a: LocalRunner, b: LocalRunner, gateway: Any) -> None:
        self.a, self.b, self.gateway = a, b, gateway
        self.attempts: dict[str, int] = {}
        self.b_invoked: list[str] = []

    async def invoke(self, payload: Mapping[str, Any], session_id: str) -> None:
        n = self.attempts[session_id] = self.attempts.get(session_id, 0) + 1
        if n > 1:
            self.b_invoked.append(session_id)
            await self.b.invoke(payload, session_id)
            return
        await self.a.invoke(payload, session_id)
        gc = self.gateway.client()
        for _ in range(500):  # A is at work: it has called the model or already reported
            info = await asyncio.to_thread(gc.get_session, session_id)
            if info.num_calls > 0 or info.terminal:
                break
            await asyncio.sleep(0.01)
        raise RunnerError("read timeout (simulated): the answer was lost")

    async def drain(self) -> None:  # the older protocol, without the run's session ids
        await self.a.drain()
        await self.b.drain()

    async def aclose(self) -> None:
        await self.a.aclose()
        await self.b.aclose()


async def test_a_retry_never_runs_a_session_the_first_agent_took(stack: Any) -> None:
    second = RolloutApp(failure_reward=-1.5)
    second.rollout_entrypoint(wordle_app.handler)
    runner = LostAnswerRunner(LocalRunner(wordle_app), LocalRunner(second), stack)
    client = RolloutClient(
        stack, runner=runner, group_size=2, sampling={"max_tokens": 48}, retry_backoff=0.05
    )
    (group,) = await client.arun(make_tasks(1, seed=21))
    assert all(r.status == "completed" for r in group.rollouts)
    assert runner.b_invoked == [] and second.completed == 0


# -- rate limit, runner lifetime -----------------------------------------------------------------


async def test_rate_limit_spaces_rollout_starts_end_to_end(stack: Any) -> None:
    client = RolloutClient(stack, runner=LocalRunner(_delayed), group_size=3, rate_limit=10.0)
    groups = await client.arun([{"id": "a", "delay": 0}, {"id": "b", "delay": 0}])
    starts = sorted(r.created_at for g in groups for r in g.rollouts)
    assert len(starts) == 6
    assert starts[-1] - starts[0] >= 0.45  # 6 starts at 10/s: at least 5 intervals of 0.1 s


def test_a_runner_built_from_a_spec_is_kept_across_runs_and_closed_with_the_client(
    stack: Any,
) -> None:
    app = RolloutApp()
    app.rollout_entrypoint(_delayed)
    with RolloutClient(stack, runner="local", app=app, group_size=1) as client:
        client.run([{"id": "a", "delay": 0}])
        first = client._runner
        client.run([{"id": "b", "delay": 0}])
        assert first is not None and client._runner is first
    assert client._runner is None


# -- one local runner shared by concurrent runs ----------------------------------------------------


async def _sleeper(payload: dict[str, Any]) -> float:
    await asyncio.sleep(payload["sleep"])
    return 1.0


async def test_a_shared_local_runner_drains_only_its_own_run(stack: Any) -> None:
    """Two concurrent runs on one LocalRunner (as the slime hook and the rLLM flow share one): the
    fast run returns without waiting for the slow one, and its drain leaves the HTTP pool that
    the slow run still posts with open."""
    runner = LocalRunner(_sleeper)
    loop = asyncio.get_running_loop()

    async def one(sleep: float) -> tuple[float, str]:
        t0 = time.monotonic()
        client = RolloutClient(stack, runner=runner, group_size=1, deadline=60)
        (group,) = await client.arun([{"id": f"s{sleep}", "sleep": sleep}])
        return time.monotonic() - t0, group.rollouts[0].status

    slow = asyncio.create_task(one(3.0))
    fast_s, fast_status = await one(0.1)
    assert fast_status == "completed" and fast_s < 2.0  # not held up by the slow run's rollout
    assert not slow.done() and runner.app.running == 1
    pool = runner.app._http.get(loop)
    assert pool is not None and not pool.closed  # still the slow run's
    slow_s, slow_status = await slow
    assert slow_status == "completed" and 2.5 < slow_s < 10
    assert loop not in runner.app._http  # the last run on this loop closed the pool
    assert pool.closed
    await runner.aclose()


def test_a_shared_local_runner_serves_runs_on_several_event_loops(stack: Any) -> None:
    """The same runner from two threads, each with its own ``asyncio.run`` (rLLM runs a sync flow
    like that): every run gets its rollout, none waits on tasks of the other loop."""
    runner = LocalRunner(_sleeper)
    results: dict[float, tuple[float, str]] = {}

    def worker(sleep: float) -> None:
        t0 = time.monotonic()
        try:
            client = RolloutClient(stack, runner=runner, group_size=1, deadline=60)
            (group,) = asyncio.run(client.arun([{"id": f"t{sleep}", "sleep": sleep}]))
            results[sleep] = (time.monotonic() - t0, group.rollouts[0].status)
        except Exception as exc:  # the test fails on the missing result below
            results[sleep] = (time.monotonic() - t0, f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=worker, args=(s,)) for s in (0.2, 2.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results[0.2][1] == "completed" and results[0.2][0] < 1.5
    assert results[2.0][1] == "completed" and results[2.0][0] < 6
    assert runner.app.running == 0 and runner.app._http == {}  # each loop's pool was closed
    asyncio.run(runner.aclose())


# -- a handler's BaseException fails its rollout, never the trainer ------------------------------


class _Custom(BaseException):
    pass


def _aborting(payload: dict[str, Any]) -> float:
    kind = payload["kind"]
    if kind == "exit":
        sys.exit(3)
    if kind == "kbint":
        raise KeyboardInterrupt
    if kind == "custom":
        raise _Custom("custom")
    return 1.0


async def _aborting_async(payload: dict[str, Any]) -> float:
    await asyncio.sleep(0)
    return _aborting(payload)


@pytest.mark.parametrize("handler", [_aborting, _aborting_async], ids=["sync", "async"])
def test_a_handler_raising_system_exit_fails_its_rollout_not_the_run(
    stack: Any, handler: Any
) -> None:
    app = RolloutApp(failure_reward=-9.0)
    app.rollout_entrypoint(handler)
    tasks = [{"id": k, "kind": k} for k in ("ok", "exit", "kbint", "custom")]
    t0 = time.monotonic()
    with RolloutClient(
        stack, runner=LocalRunner(app), group_size=1, deadline=5.0, deadline_grace=5.0
    ) as client:
        groups = client.run(tasks)
    assert time.monotonic() - t0 < 4  # the app reported each, the client did not time out
    by_id = {g.task_id: g.rollouts[0] for g in groups}
    assert by_id["ok"].status == "completed" and by_id["ok"].reward == 1.0
    for kind, error in (
        ("exit", "SystemExit: 3"),
        ("kbint", "KeyboardInterrupt"),
        ("custom", "_Custom: custom"),
    ):
        r = by_id[kind]
        assert r.status == "failed" and r.reward == -9.0, kind
        assert error in (r.error or ""), (kind, r.error)
    assert client.stats.client_timeouts == 0
