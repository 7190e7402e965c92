"""RolloutApp's BedrockAgentCoreApp surface: async handlers off the server loop (``/ping`` stays
fast), HealthyBusy at the concurrency limit, ping overrides, tracked tasks, debug actions,
lifespan, middleware, ``/ws`` and the handler's ``context``. Real HTTP on 127.0.0.1."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware

from rollwire.agent.app import SESSION_HEADER, InvocationContext, PingStatus, RolloutApp
from rollwire.agent.serving import ServerThread
from rollwire.testing.recording import CompleteRecorder


def test_ping_answers_while_an_async_handler_blocks_its_loop() -> None:
    app = RolloutApp()
    started, release = threading.Event(), threading.Event()

    @app.entrypoint
    async def handler(payload: dict[str, Any]) -> dict[str, Any]:
        started.set()
        release.wait(60)  # blocks the loop it runs on: that must not be the server's
        return {"done": True}

    with ServerThread(app) as server:
        answers: list[httpx.Response] = []
        caller = threading.Thread(
            target=lambda: answers.append(
                httpx.post(f"{server.url}/invocations", json={"q": 1}, timeout=90)
            )
        )
        caller.start()
        times: list[float] = []
        try:
            assert started.wait(60)
            with httpx.Client(timeout=30) as http:
                for _ in range(20):
                    t0 = time.perf_counter()
                    assert http.get(f"{server.url}/ping").status_code == 200
                    times.append(time.perf_counter() - t0)
        finally:
            release.set()
            caller.join(90)
    assert answers[0].json() == {"done": True}
    # Every ping was answered while the handler held its loop (one on that loop would wait for
    # the release and time out); the median, with room for a loaded machine, says promptly.
    assert sorted(times)[len(times) // 2] < 0.25, times


def test_rollouts_of_async_handlers_run_off_the_server_loop(recorder: CompleteRecorder) -> None:
    app = RolloutApp()
    threads: list[str] = []
    started, release = threading.Event(), threading.Event()

    @app.rollout_entrypoint
    async def handler(payload: dict[str, Any]) -> float:
        threads.append(threading.current_thread().name)
        started.set()
        release.wait(60)  # blocks the loop it runs on until the ping below has answered
        return 0.5

    with ServerThread(app) as server:
        try:
            with httpx.Client(timeout=30) as http:
                http.post(f"{server.url}/invocations", json=recorder.payload("w1"))
                assert started.wait(60)
                # Answered while the handler still blocks its loop: a ping on that loop would
                # wait for the release and time out.
                status = http.get(f"{server.url}/ping").json()["status"]
                assert status == "HealthyBusy"
        finally:
            release.set()
        assert recorder.wait_for("w1")[0]["reward"] == 0.5
    assert threads == ["rollwire-worker-loop"]


def test_ping_is_busy_while_every_handler_thread_is_stuck_past_its_deadline(
    recorder: CompleteRecorder,
) -> None:
    release, started = threading.Event(), threading.Event()
    app = RolloutApp(max_threads=1)

    @app.rollout_entrypoint
    def handler(payload: dict[str, Any]) -> float:
        started.set()
        release.wait(20)
        return 1.0

    with ServerThread(app) as server:
        # A deadline long enough for the handler to start on a loaded machine, short enough to
        # pass while it still holds its thread.
        httpx.post(f"{server.url}/invocations", json=recorder.payload("st1", deadline_in=2.0))
        assert started.wait(60)
        record = recorder.wait_for("st1")[0]
        assert record["status"] == "failed" and "deadline" in record["error"]
        end = time.monotonic() + 60
        while app.busy and time.monotonic() < end:
            time.sleep(0.01)
        assert not app.busy  # no rollout runs, but the only thread is still held
        assert httpx.get(f"{server.url}/ping").json()["status"] == "HealthyBusy"
        release.set()
        end = time.monotonic() + 60
        while app.saturated and time.monotonic() < end:
            time.sleep(0.01)
        assert httpx.get(f"{server.url}/ping").json()["status"] == "Healthy"


def test_forced_custom_and_tracked_ping_statuses() -> None:
    app = RolloutApp()
    custom: list[Any] = []

    @app.entrypoint
    def handler(payload: dict[str, Any]) -> dict[str, Any]:
        return {}

    assert app.get_current_ping_status() is PingStatus.HEALTHY
    task_id = app.add_async_task("indexing", {"file": "a.csv"})
    assert app.get_current_ping_status() is PingStatus.HEALTHY_BUSY
    info = app.get_async_task_info()
    assert info["active_count"] == 1 and info["running_jobs"][0]["name"] == "indexing"
    assert app.complete_async_task(task_id) and not app.complete_async_task(task_id)
    assert app.get_current_ping_status() is PingStatus.HEALTHY

    @app.ping
    def status() -> Any:
        return custom[-1] if custom else "HealthyBusy"

    assert app.get_current_ping_status() is PingStatus.HEALTHY_BUSY
    custom.append(PingStatus.HEALTHY)
    assert app.get_current_ping_status() is PingStatus.HEALTHY
    app.force_ping_status(PingStatus.HEALTHY_BUSY)
    assert app.ping_status()["status"] == "HealthyBusy"
    app.clear_forced_ping_status()
    assert app.ping_status()["status"] == "Healthy"
    custom.append("not a status")  # a broken ping handler falls back to the app's own status
    assert app.get_current_ping_status() is PingStatus.HEALTHY


async def test_async_task_decorator_tracks_the_call() -> None:
    app = RolloutApp()
    seen: list[PingStatus] = []

    @app.async_task
    async def work(x: int) -> int:
        seen.append(app.get_current_ping_status())
        return x * 2

    assert await work(21) == 42
    assert seen == [PingStatus.HEALTHY_BUSY]
    assert app.get_current_ping_status() is PingStatus.HEALTHY
    with pytest.raises(ValueError, match="async functions"):
        app.async_task(lambda: None)  # type: ignore[arg-type, return-value]


def test_debug_actions_lifespan_middleware_context_and_websocket() -> None:
    events: list[str] = []

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        events.append("startup")
        yield
        events.append("shutdown")

    class Stamp(BaseHTTPMiddleware):
        async def dispatch(self, request: Any, call_next: Any) -> Any:
            response = await call_next(request)
            response.headers["x-stamp"] = "yes"
            return response

    app = RolloutApp(debug=True, lifespan=lifespan, middleware=[Middleware(Stamp)])
    contexts: list[InvocationContext] = []

    @app.entrypoint
    def handler(payload: dict[str, Any], context: InvocationContext) -> dict[str, Any]:
        contexts.append(context)
        return {"echo": payload["q"]}

    @app.websocket
    async def ws(websocket: Any, context: InvocationContext) -> None:
        await websocket.accept()
        text = await websocket.receive_text()
        await websocket.send_text(f"{context.session_id}:{text}")
        await websocket.close()

    with ServerThread(app) as server:
        assert events == ["startup"]
        resp = httpx.post(
            f"{server.url}/invocations",
            json={"q": 7},
            headers={SESSION_HEADER: "sess-1", "x-custom": "v"},
        )
        assert resp.json() == {"echo": 7} and resp.headers["x-stamp"] == "yes"
        ctx = contexts[0]
        assert ctx.session_id == "sess-1" and ctx.request_headers["x-custom"] == "v"
        assert ctx.request is not None and ctx.request.url.path == "/invocations"

        def action(name: str) -> Any:
            body = {"_agent_core_app_action": name}
            return httpx.post(f"{server.url}/invocations", json=body).json()

        assert action("force_busy") == {"forced_status": "HealthyBusy"}
        assert action("ping_status")["status"] == "HealthyBusy"
        assert action("clear_forced_status") == {"forced_status": "Cleared"}
        assert action("job_status") == {"active_count": 0, "running_jobs": []}
        assert "Unknown action" in action("nope")["error"]

        from websockets.sync.client import connect

        with connect(
            server.url.replace("http", "ws") + "/ws", additional_headers={SESSION_HEADER: "w9"}
        ) as sock:
            sock.send("hello")
            assert sock.recv(timeout=5) == "w9:hello"
    assert events == ["startup", "shutdown"]
