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

from rollwire.app import SESSION_HEADER, InvocationContext, RolloutApp
from rollwire.serving import ServerThread

from .conftest import CompleteRecorder


def _invoke(url: str, payload: dict[str, Any], session: str = "s" * 40) -> httpx.Response:
    return httpx.post(
        f"{url}/invocations", json=payload, headers={SESSION_HEADER: session}, timeout=10
    )


def test_ping_is_busy_while_a_rollout_runs_and_reports_in_background(
    recorder: CompleteRecorder,
) -> None:
    release = threading.Event()
    app = RolloutApp()

    @app.rollout_entrypoint
    def handler(payload: dict[str, Any]) -> dict[str, Any]:
        release.wait(10)
        return {"reward": 0.75, "metrics": {"turns": 3, "note": "dropped"}}

    with ServerThread(app) as server:
        ping = httpx.get(f"{server.url}/ping").json()
        assert ping["status"] == "Healthy" and isinstance(ping["time_of_last_update"], int)
        t0 = time.monotonic()
        resp = _invoke(server.url, recorder.payload("s1", prompt="hi"))
        assert resp.status_code == 200
        assert resp.json() == {"status": "accepted", "session_id": "s1"}
        assert time.monotonic() - t0 < 2  # answered at once, the handler is still blocked
        assert httpx.get(f"{server.url}/ping").json()["status"] == "HealthyBusy"
        release.set()
        records = recorder.wait_for("s1")
        assert records == [{"status": "completed", "reward": 0.75, "metrics": {"turns": 3.0}}]
        assert recorder.auth["s1"] == "Bearer tok-s1"
        deadline = time.monotonic() + 5
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
        assert started.wait(5)
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
