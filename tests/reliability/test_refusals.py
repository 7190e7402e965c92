"""A refused request (4xx) changes nothing; bad input is a clear 4xx, never a 500."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import orjson
import pytest

from rollwire.agent.serving import ServerThread
from rollwire.gateway import RunningGateway, serve_in_thread
from rollwire.testing.null_backend import NullBackend

KEY = "k"
ADMIN = {"authorization": f"Bearer {KEY}"}
MSG = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def gw() -> Iterator[RunningGateway]:
    with (
        ServerThread(NullBackend()) as b,
        serve_in_thread(backends=[(b.url, "vllm")], admin_key=KEY) as g,
    ):
        yield g


def api(gw: RunningGateway, method: str, path: str, **kw: object) -> httpx.Response:
    return httpx.request(method, gw.url + path, headers=ADMIN, timeout=30.0, **kw)  # type: ignore[arg-type]


def new_session(gw: RunningGateway, **fields: object) -> dict[str, str]:
    r = api(gw, "POST", "/api/sessions", json=fields)
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def test_pause_with_a_bad_timeout_pauses_nothing(gw: RunningGateway) -> None:
    r = api(gw, "POST", "/api/pause?wait=true&timeout=abc")
    assert r.status_code == 400 and "timeout" in r.json()["error"]["message"]
    assert api(gw, "GET", "/api/pause").json()["paused"] is False
    assert api(gw, "POST", "/api/pause?wait=maybe").status_code == 400
    assert api(gw, "GET", "/api/pause").json()["paused"] is False


def test_backends_are_validated_and_never_silently_replaced(gw: RunningGateway) -> None:
    before = api(gw, "GET", "/api/backends").json()["backends"]
    name = before[0]["name"]
    for url in ("file:///etc/passwd", "not a url", "http://", "ftp://x", "http://h:0"):
        r = api(gw, "POST", "/api/backends", json={"url": url, "name": "x"})
        assert r.status_code == 400, (url, r.text)
    r = api(gw, "POST", "/api/backends", json={"url": "http://127.0.0.1:9", "name": name})
    assert r.status_code == 409 and r.json()["error"]["code"] == "backend_exists"
    assert api(gw, "GET", "/api/backends").json()["backends"] == before


@pytest.mark.parametrize(
    "sid", ["a/b", "..", "x..y", "tab\there", "nul\x00", "del\x7f", "sp ace", "q?x", "#", "x" * 201]
)
def test_bad_session_ids_are_refused(gw: RunningGateway, sid: str) -> None:
    r = api(gw, "POST", "/api/sessions", json={"session_id": sid})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_session_id", r.text


def test_good_session_ids_round_trip(gw: RunningGateway) -> None:
    for sid in ("task-1:rollout@3", "a.b_c~d+e=f", "ünïcödé-ok"):
        s = new_session(gw, session_id=sid)
        r = httpx.post(s["base_url"] + "/chat/completions", json=MSG, timeout=30)
        assert r.status_code == 200
        done = httpx.post(s["complete_url"], json={"reward": 1}, headers=ADMIN, timeout=30)
        assert done.status_code == 200 and done.json()["reward"] == 1.0


def test_old_token_does_not_open_a_recreated_session(gw: RunningGateway) -> None:
    s = new_session(gw, session_id="reborn")
    assert api(gw, "DELETE", "/api/sessions/reborn").status_code == 204
    fresh = new_session(gw, session_id="reborn")
    old = httpx.post(s["base_url"] + "/chat/completions", json=MSG, timeout=30)
    assert old.status_code == 401 and "earlier session" in old.json()["error"]["message"]
    done = httpx.post(
        s["complete_url"], json={"reward": 1.0}, headers={"authorization": f"Bearer {s['token']}"}
    )
    assert done.status_code == 401
    assert httpx.post(fresh["base_url"] + "/chat/completions", json=MSG).status_code == 200
    calls = api(gw, "GET", "/api/sessions/reborn/calls").json()["calls"]
    assert len(calls) == 1


@pytest.mark.parametrize(
    "body",
    [
        {"reward": "1.0"},
        {"reward": True},
        b'{"reward": 1e400}',
        {"reward": [1]},
        {"metrics": {"a": "1"}},
        {"metrics": {f"m{i}": 1 for i in range(300)}},
        {"metrics": {"x" * 200: 1}},
        {"status": "running"},
        {"error": 3},
    ],
)
def test_bad_completions_change_nothing(
    gw: RunningGateway, body: dict[str, object] | bytes
) -> None:
    s = new_session(gw)
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    r = httpx.post(
        s["complete_url"], content=raw, headers={**ADMIN, "content-type": "application/json"}
    )
    assert r.status_code == 400, r.text
    assert api(gw, "GET", f"/api/sessions/{s['session_id']}").json()["status"] == "running"


def test_long_error_text_is_kept_bounded(gw: RunningGateway) -> None:
    s = new_session(gw)
    text = "start " + "x" * 100_000 + " end"
    r = httpx.post(s["complete_url"], json={"status": "failed", "error": text}, headers=ADMIN)
    assert r.status_code == 200
    kept = r.json()["error"]
    assert len(kept) < 17_000 and kept.startswith("start ") and kept.endswith(" end")


def test_session_fields_are_bounded(gw: RunningGateway) -> None:
    for body in (
        {"metadata": {"blob": "x" * 70_000}},
        {"group_id": "g" * 2000},
        {"sampling": {"stream": True}},
    ):
        r = api(gw, "POST", "/api/sessions", json=body)
        assert r.status_code == 400, (body.keys(), r.text)
    r = api(gw, "POST", "/api/policy_version", json={"version": "v" * 300})
    assert r.status_code == 400


def test_session_lists_page(gw: RunningGateway) -> None:
    group = "paged"
    sids = [new_session(gw, group_id=group)["session_id"] for _ in range(5)]
    first = api(gw, "GET", f"/api/sessions?group_id={group}&limit=2").json()
    assert [x["session_id"] for x in first["sessions"]] == sids[:2]
    second = api(gw, "GET", f"/api/sessions?group_id={group}&limit=2&offset={first['next_offset']}")
    assert [x["session_id"] for x in second.json()["sessions"]] == sids[2:4]
    assert api(gw, "GET", "/api/sessions?offset=-1").status_code == 400


def test_running_list_leaves_out_expired_sessions(gw: RunningGateway) -> None:
    group = "expiring"
    gone = new_session(gw, group_id=group, ttl=0.01)
    live = new_session(gw, group_id=group)
    httpx.get(gw.url + "/health")  # some time passes; the TTL of 10 ms is over
    import time

    time.sleep(0.05)  # nothing to wait on: the TTL is wall-clock time
    running = api(gw, "GET", f"/api/sessions?group_id={group}&status=running").json()["sessions"]
    assert [x["session_id"] for x in running] == [live["session_id"]]
    assert gone["session_id"] != live["session_id"]


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (orjson.dumps({**MSG, "stream": "yes"}), 400),
        (orjson.dumps({**MSG, "stream": 1}), 400),
        (b"[" * 5000 + b"]" * 5000, 400),
        (b'{"model": "p", "messages": ' + b"[" * 3000 + b"]" * 3000 + b"}", 400),
        (b"not json", 400),
        (b"[]", 400),
    ],
)
def test_bad_data_plane_bodies_are_400_and_store_nothing(
    gw: RunningGateway, raw: bytes, code: int
) -> None:
    s = new_session(gw)
    r = httpx.post(
        s["base_url"] + "/chat/completions",
        content=raw,
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert r.status_code == code, r.text
    assert "error" in r.json()
    assert api(gw, "GET", f"/api/sessions/{s['session_id']}/calls").json()["calls"] == []


def test_stream_answered_without_sse_is_a_clear_error() -> None:
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def chat(request: object) -> JSONResponse:
        return JSONResponse({"id": "x", "choices": []})

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    with ServerThread(app) as b, serve_in_thread(backends=[(b.url, "openai")], admin_key=KEY) as g:
        r = httpx.post(g.url + "/api/sessions", json={}, headers=ADMIN)
        s = r.json()
        r = httpx.post(s["base_url"] + "/chat/completions", json={**MSG, "stream": True})
        assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_not_sse"
        assert "text/event-stream" in r.json()["error"]["message"]
        calls = httpx.get(g.url + f"/api/sessions/{s['session_id']}/calls", headers=ADMIN)
        (call,) = calls.json()["calls"]
        assert call["status"] == "failed" and call["trainable"] is False


def test_abandoned_sessions_time_out_and_are_counted() -> None:
    import time

    with (
        ServerThread(NullBackend()) as b,
        serve_in_thread(backends=[(b.url, "vllm")], admin_key=KEY, sweep_interval=0.05) as g,
    ):
        s = httpx.post(
            g.url + "/api/sessions", json={"ttl": 600.0}, headers=ADMIN, timeout=30
        ).json()
        assert (
            httpx.post(s["base_url"] + "/chat/completions", json=MSG, timeout=30).status_code == 200
        )
        # The TTL runs out now, after the call, not on the machine's clock: a short TTL can
        # pass before the first call on a busy machine.
        g.gateway.sessions[s["session_id"]].record.expires_at = time.time() - 1
        deadline = time.monotonic() + 60  # bounds a hang; the sweep ends the wait
        status = "running"
        while status == "running" and time.monotonic() < deadline:
            time.sleep(0.05)  # the sweep runs on its own clock
            # A list does not time sessions out itself (a GET of the session would).
            info = httpx.get(
                g.url + "/api/sessions?status=timeout", headers=ADMIN, timeout=30
            ).json()
            status = "timeout" if info["sessions"] else "running"
        assert status == "timeout"
        assert not g.gateway.sessions  # gone from memory
        metrics = httpx.get(g.url + "/metrics", timeout=30).text
        assert "rollwire_sessions_expired_total 1" in metrics
