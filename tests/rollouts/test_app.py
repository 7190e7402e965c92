"""RolloutApp speaks the AgentCore Runtime HTTP contract and always ends a rollout with exactly one
terminal record (reward, exception, deadline, bad reward, shutdown). Real HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import Any

import httpx
import pytest

from rollwire.agent.app import SESSION_HEADER, InvocationContext, RolloutApp
from rollwire.agent.serving import ServerThread
from rollwire.testing.recording import CompleteRecorder


def _invoke(url: str, payload: dict[str, Any], session: str = "s" * 40) -> httpx.Response:
    return httpx.post(
        f"{url}/invocations", json=payload, headers={SESSION_HEADER: session}, timeout=30
    )


def test_ping_is_busy_while_a_rollout_runs_and_reports_in_background(
    recorder: CompleteRecorder,
) -> None:
    release, returned = threading.Event(), threading.Event()
    app = RolloutApp()

    @app.rollout_entrypoint
    def handler(payload: dict[str, Any]) -> dict[str, Any]:
        release.wait(60)
        returned.set()
        return {"reward": 0.75, "metrics": {"turns": 3, "note": "dropped"}}

    with ServerThread(app) as server:
        ping = httpx.get(f"{server.url}/ping").json()
        assert ping["status"] == "Healthy" and isinstance(ping["time_of_last_update"], int)
        resp = _invoke(server.url, recorder.payload("s1", prompt="hi"))
        assert resp.status_code == 200
        assert resp.json() == {"status": "accepted", "session_id": "s1"}
        assert not returned.is_set()  # answered at once: the handler waits for the release
        assert httpx.get(f"{server.url}/ping").json()["status"] == "HealthyBusy"
        release.set()
        records = recorder.wait_for("s1")
        assert records == [{"status": "completed", "reward": 0.75, "metrics": {"turns": 3.0}}]
        assert recorder.auth["s1"] == "Bearer tok-s1"
        deadline = time.monotonic() + 60
        while app.busy and time.monotonic() < deadline:
            time.sleep(0.01)
        assert httpx.get(f"{server.url}/ping").json()["status"] == "Healthy"


def test_payload_without_rollwire_runs_in_the_foreground_like_production(
    recorder: CompleteRecorder,
) -> None:
    app = RolloutApp()
    seen: list[InvocationContext] = []

    @app.rollout_entrypoint
    async def handler(payload: dict[str, Any], context: InvocationContext) -> dict[str, Any]:
        seen.append(context)
        return {"answer": payload["prompt"].upper()}

    with ServerThread(app) as server:
        resp = _invoke(server.url, {"prompt": "hello"}, session="prod-session-1")
        assert resp.json() == {"answer": "HELLO"}
    assert seen[0].session_id == "prod-session-1" and seen[0].rollout is None
    assert recorder.records == {}


@pytest.mark.parametrize(
    ("result", "error_part"),
    [
        (RuntimeError("tool exploded"), "RuntimeError: tool exploded"),
        (float("nan"), "finite"),
        ({"metrics": {"x": 1}}, "without 'reward'"),
        (None, "no usable reward"),
        ("high", "must be a number"),
    ],
)
def test_exceptions_and_bad_rewards_become_one_failed_record(
    recorder: CompleteRecorder, result: Any, error_part: str
) -> None:
    app = RolloutApp(failure_reward=-1.0)

    @app.rollout_entrypoint
    async def handler(payload: dict[str, Any]) -> Any:
        if isinstance(result, Exception):
            raise result
        return result

    with ServerThread(app) as server:
        assert _invoke(server.url, recorder.payload("bad")).status_code == 200
        records = recorder.wait_for("bad")
        time.sleep(0.2)
        records = recorder.records["bad"]
    assert len(records) == 1
    assert records[0]["status"] == "failed" and records[0]["reward"] == -1.0
    assert error_part in records[0]["error"]


def test_deadline_overrun_is_a_failed_record(recorder: CompleteRecorder) -> None:
    app = RolloutApp(failure_reward=-2.0)

    @app.rollout_entrypoint
    def handler(payload: dict[str, Any]) -> float:
        time.sleep(3)
        return 1.0

    with ServerThread(app) as server:
        t0 = time.monotonic()
        _invoke(server.url, recorder.payload("slow", deadline_in=0.3))
        records = recorder.wait_for("slow")
        assert time.monotonic() - t0 < 2.5
    assert len(records) == 1 and records[0]["status"] == "failed" and records[0]["reward"] == -2.0
    assert "deadline" in records[0]["error"]


def test_shutdown_mid_rollout_posts_cancelled_for_each_running_rollout(
    recorder: CompleteRecorder,
) -> None:
    app = RolloutApp(failure_reward=-0.5)
    started = threading.Event()

    @app.rollout_entrypoint
    async def handler(payload: dict[str, Any]) -> float:
        started.set()
        await asyncio.sleep(60)
        return 1.0

    server = ServerThread(app).start()
    try:
        for sid in ("c1", "c2", "c3"):
            assert _invoke(server.url, recorder.payload(sid)).status_code == 200
        assert started.wait(60)
        assert app.running == 3
    finally:
        server.stop()  # lifespan shutdown: cancel, report, then exit
    for sid in ("c1", "c2", "c3"):
        assert recorder.records[sid] == [
            {
                "status": "cancelled",
                "reward": -0.5,
                "metrics": {},
                "error": "rollout cancelled: the agent process shut down",
            }
        ]


def test_a_duplicate_invocation_of_a_running_session_is_not_run_twice(
    recorder: CompleteRecorder,
) -> None:
    calls: list[str] = []
    app = RolloutApp()

    @app.rollout_entrypoint
    async def handler(payload: dict[str, Any]) -> float:
        calls.append(payload["_rollwire"]["session_id"])
        await asyncio.sleep(0.3)
        return 1.0

    with ServerThread(app) as server:
        p = recorder.payload("dup")
        assert _invoke(server.url, p).json()["status"] == "accepted"
        assert _invoke(server.url, p).json()["status"] == "accepted"
        assert recorder.wait_for("dup") == [{"status": "completed", "reward": 1.0, "metrics": {}}]
    assert calls == ["dup"]


def test_terminal_record_post_is_retried_with_backoff() -> None:
    rec = CompleteRecorder(fail_first=2)
    app = RolloutApp()
    app.rollout_entrypoint(lambda payload: 0.5)
    with rec.server, ServerThread(app) as server:
        _invoke(server.url, rec.payload("retry"))
        assert rec.wait_for("retry") == [{"status": "completed", "reward": 0.5, "metrics": {}}]


def test_invalid_rollwire_key_is_a_400_and_app_is_asgi_callable() -> None:
    app = RolloutApp()
    app.rollout_entrypoint(lambda payload: 1.0)
    assert callable(app) and app.asgi is not None
    with ServerThread(app) as server:
        resp = _invoke(server.url, {"_rollwire": {"session_id": "x"}})
        assert resp.status_code == 400 and "lacks" in resp.json()["error"]


def test_failure_reward_must_be_finite() -> None:
    with pytest.raises(ValueError):
        RolloutApp(failure_reward=math.inf)


# -- terminal record under shutdown, retries and budgets -----------------------------------------


async def test_shutdown_during_the_report_backoff_still_posts_the_result() -> None:
    # the gateway answers 503 once; the shutdown lands in the backoff before the retry
    rec = CompleteRecorder(fail_first=1)
    with rec.server:
        app = RolloutApp(failure_reward=-1.0)

        @app.rollout_entrypoint
        async def handler(payload: dict[str, Any]) -> float:
            return 1.0

        await app.start_rollout(rec.payload("z1"), "z1")
        for _ in range(200):  # until the first post was refused
            if rec.fail_first == 0:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        await app.shutdown()
        assert rec.records == {"z1": [{"status": "completed", "reward": 1.0, "metrics": {}}]}


async def test_shutdown_during_the_handler_posts_cancelled_even_when_cancelled_twice(
    recorder: CompleteRecorder,
) -> None:
    app = RolloutApp(failure_reward=-0.5)

    @app.rollout_entrypoint
    async def handler(payload: dict[str, Any]) -> float:
        await asyncio.sleep(60)
        return 1.0

    await app.start_rollout(recorder.payload("c9"), "c9")
    await asyncio.sleep(0.05)
    task = app._running["c9"]
    task.cancel()
    await asyncio.sleep(0)
    task.cancel()  # a second cancel while the record is being posted
    await asyncio.gather(task, return_exceptions=True)
    (record,) = await asyncio.to_thread(recorder.wait_for, "c9")
    assert record["status"] == "cancelled" and record["reward"] == -0.5


def test_the_record_is_retried_until_the_deadline_not_just_post_retries_times() -> None:
    rec = CompleteRecorder(fail_first=4)  # the gateway is away for about 3 s
    app = RolloutApp(post_retries=1)
    app.rollout_entrypoint(lambda payload: 0.25)
    with rec.server, ServerThread(app) as server:
        _invoke(server.url, rec.payload("late", deadline_in=30))
        assert rec.wait_for("late") == [{"status": "completed", "reward": 0.25, "metrics": {}}]


class _HangingGateway:
    """A ``complete_url`` that never answers in time (a gateway stuck under load)."""

    def __init__(self) -> None:
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        async def complete(request: Any) -> Any:
            await asyncio.sleep(30)
            return JSONResponse({})

        self.server = ServerThread(
            Starlette(routes=[Route("/api/sessions/{sid}/complete", complete, methods=["POST"])])
        )


async def test_all_shutdown_posts_share_one_time_budget() -> None:
    hanging = _HangingGateway()
    with hanging.server:
        app = RolloutApp(shutdown_timeout=1.0, post_timeout=10.0)

        @app.rollout_entrypoint
        async def handler(payload: dict[str, Any]) -> float:
            await asyncio.sleep(60)
            return 1.0

        rec = CompleteRecorder()
        for sid in ("h1", "h2", "h3"):
            payload = rec.payload(sid)
            payload["_rollwire"]["complete_url"] = (
                f"{hanging.server.url}/api/sessions/{sid}/complete"
            )
            await app.start_rollout(payload, sid)
        await asyncio.sleep(0.05)
        t0 = time.monotonic()
        await app.shutdown()
        assert time.monotonic() - t0 < 3.0  # not 3 x post_timeout x retries
        assert not app.busy


def test_shutdown_with_a_sync_handler_does_not_wait_for_its_thread(
    recorder: CompleteRecorder,
) -> None:
    release = threading.Event()
    app = RolloutApp(failure_reward=-0.5)

    @app.rollout_entrypoint
    def handler(payload: dict[str, Any]) -> float:
        release.wait(30)  # a sync agent blocked in a long model call
        return 1.0

    try:
        server = ServerThread(app).start()
        try:
            assert _invoke(server.url, recorder.payload("sync1")).status_code == 200
            time.sleep(0.2)
        finally:
            t0 = time.monotonic()
            server.stop()
            assert time.monotonic() - t0 < 5
        assert recorder.records["sync1"][0]["status"] == "cancelled"
        threads = [t for t in threading.enumerate() if t.name == "rollout-handler"]
        assert threads and all(t.daemon for t in threads)  # they do not hold up process exit
    finally:
        release.set()


def test_a_process_with_a_stuck_sync_handler_exits_after_shutdown(tmp_path: Any) -> None:
    import subprocess
    import sys

    script = tmp_path / "stuck.py"
    script.write_text(
        "import asyncio, time\n"
        "from rollwire.agent.app import RolloutApp\n"
        "app = RolloutApp(shutdown_timeout=1.0)\n"
        "app.rollout_entrypoint(lambda payload: time.sleep(60))\n"
        "payload = {'_rollwire': {'session_id': 's', 'base_url': 'http://127.0.0.1:9/v1',\n"
        "    'api_key': 't', 'complete_url': 'http://127.0.0.1:9/api/sessions/s/complete'}}\n"
        "async def main():\n"
        "    await app.start_rollout(payload)\n"
        "    await asyncio.sleep(0.2)\n"
        "    await app.shutdown()\n"
        "asyncio.run(main())\n"
    )
    t0 = time.monotonic()
    subprocess.run([sys.executable, str(script)], check=True, timeout=30)
    assert time.monotonic() - t0 < 20  # not the handler's 60 s


async def test_max_threads_bounds_sync_handlers(recorder: CompleteRecorder) -> None:
    running: list[int] = []
    peak: list[int] = []
    lock = threading.Lock()
    app = RolloutApp(max_threads=2)

    @app.rollout_entrypoint
    def handler(payload: dict[str, Any]) -> float:
        with lock:
            running.append(1)
            peak.append(len(running))
        time.sleep(0.2)
        with lock:
            running.pop()
        return 1.0

    for i in range(5):
        await app.start_rollout(recorder.payload(f"m{i}"), f"m{i}")
    await app.wait_idle(10)
    assert max(peak) == 2 and len(peak) == 5


def test_a_second_invocation_after_the_session_finished_is_not_run_again(
    recorder: CompleteRecorder,
) -> None:
    calls: list[str] = []
    app = RolloutApp()

    @app.rollout_entrypoint
    async def handler(payload: dict[str, Any]) -> float:
        calls.append(payload["_rollwire"]["session_id"])
        return 1.0

    with ServerThread(app) as server:
        p = recorder.payload("once")
        assert _invoke(server.url, p).json()["status"] == "accepted"
        recorder.wait_for("once")
        deadline = time.monotonic() + 60
        while app.busy and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _invoke(server.url, p).json() == {"status": "accepted", "session_id": "once"}
        time.sleep(0.2)
    assert calls == ["once"]
    assert recorder.records["once"] == [{"status": "completed", "reward": 1.0, "metrics": {}}]


# -- generator (streaming) entrypoints ---------------------------------------------------------


def test_an_async_generator_entrypoint_streams_sse_in_production_and_reports_in_a_rollout(
    recorder: CompleteRecorder,
) -> None:
    app = RolloutApp()

    @app.entrypoint
    async def handler(payload: dict[str, Any]) -> Any:
        yield {"response": "thinking"}
        yield {"reward": 0.5, "metrics": {"turns": 2}}
        yield {"response": "done"}  # progress after the reward does not replace it

    with ServerThread(app) as server:
        resp = _invoke(server.url, {"prompt": "x"})
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert resp.text == (
            'data: {"response": "thinking"}\n\n'
            'data: {"reward": 0.5, "metrics": {"turns": 2}}\n\n'
            'data: {"response": "done"}\n\n'
        )
        _invoke(server.url, recorder.payload("gen"))
        assert recorder.wait_for("gen") == [
            {"status": "completed", "reward": 0.5, "metrics": {"turns": 2.0}}
        ]


def test_a_sync_generator_entrypoint_streams_and_reports(recorder: CompleteRecorder) -> None:
    app = RolloutApp(failure_reward=-1.0)

    @app.entrypoint
    def handler(payload: dict[str, Any]) -> Any:
        yield "step"
        yield 0.75
        if payload.get("boom"):
            raise RuntimeError("stream broke")

    with ServerThread(app) as server:
        resp = _invoke(server.url, {"prompt": "x"})
        assert resp.text == 'data: "step"\n\ndata: 0.75\n\n'
        resp = _invoke(server.url, {"boom": True})
        assert '"error_type": "RuntimeError"' in resp.text
        _invoke(server.url, recorder.payload("sgen"))
        _invoke(server.url, recorder.payload("sgen-boom", boom=True))
        assert recorder.wait_for("sgen") == [{"status": "completed", "reward": 0.75, "metrics": {}}]
        (failed,) = recorder.wait_for("sgen-boom")
    assert failed["status"] == "failed" and "stream broke" in failed["error"]


def test_a_generator_that_yields_no_reward_is_a_failed_rollout(recorder: CompleteRecorder) -> None:
    app = RolloutApp()

    @app.entrypoint
    async def handler(payload: dict[str, Any]) -> Any:
        yield {"response": "no reward here"}

    with ServerThread(app) as server:
        _invoke(server.url, recorder.payload("noreward"))
        (record,) = recorder.wait_for("noreward")
    assert record["status"] == "failed" and "no usable reward" in record["error"]


# -- payload validation --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"deadline": "soon"}, "finite epoch time"),
        ({"deadline": [1]}, "finite epoch time"),
        ({"version": 2}, "reads version 1"),
        ({"version": "two"}, "reads version 1"),
    ],
)
def test_bad_rollwire_fields_are_a_400_with_a_clear_error(
    recorder: CompleteRecorder, change: dict[str, Any], message: str
) -> None:
    app = RolloutApp()
    app.rollout_entrypoint(lambda payload: 1.0)
    payload = recorder.payload("bad-field")
    payload["_rollwire"].update(change)
    with ServerThread(app) as server:
        resp = _invoke(server.url, payload)
    assert resp.status_code == 400 and message in resp.json()["error"]


class _NotAnException(BaseException):
    pass


@pytest.mark.parametrize(
    ("exc", "error"),
    [
        (SystemExit(3), "SystemExit: 3"),
        (KeyboardInterrupt(), "KeyboardInterrupt"),
        (_NotAnException("custom"), "_NotAnException: custom"),
    ],
    ids=["system-exit", "keyboard-interrupt", "custom"],
)
@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
async def test_a_base_exception_from_the_handler_is_one_failed_record(
    recorder: CompleteRecorder, exc: BaseException, error: str, sync: bool
) -> None:
    app = RolloutApp(failure_reward=-4.0)

    def handler(payload: dict[str, Any]) -> float:
        raise exc

    async def async_handler(payload: dict[str, Any]) -> float:
        await asyncio.sleep(0)
        raise exc

    app.rollout_entrypoint(handler if sync else async_handler)
    await app.start_rollout(recorder.payload("be"), "be")
    assert await app.wait_sessions(["be"], 10)  # the loop lives on: nothing reached it
    (record,) = await asyncio.to_thread(recorder.wait_for, "be")
    assert record["status"] == "failed" and record["reward"] == -4.0
    assert error in record["error"]
    await app.shutdown()
