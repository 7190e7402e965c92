"""Security, budgets, completion and waiting, pause/drain — over real HTTP."""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from rollwire.agent.serving import ServerThread
from rollwire.gateway import RunningGateway, serve_in_thread
from rollwire.testing.null_backend import NullBackend
from rollwire.trainer.gateway_client import GatewayAPIError, GatewayClient

MSGS = [{"role": "user", "content": "hi"}]


def _post(url: str, token: str | None = None, json: dict | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.post(url, json=json or {"model": "p", "messages": MSGS}, headers=headers)


def test_missing_forged_expired_tokens_are_refused(
    gateway: RunningGateway, client: GatewayClient
) -> None:
    h = client.create_session()
    cases = {
        "missing": gateway.url + "/v1/chat/completions",
        "forged": h.base_url.replace(h.token, h.token[:-4] + "AAAA") + "/chat/completions",
        "garbage": gateway.url + "/s/not-a-token/v1/chat/completions",
        "expired": gateway.url
        + f"/s/{gateway.gateway.signer.issue(h.session_id, time.time() - 1)}/v1/chat/completions",
    }
    for name, url in cases.items():
        r = _post(url)
        assert r.status_code == 401, name
        err = r.json()["error"]
        assert err["type"] == "authentication_error" and err["message"], name
    r = _post(gateway.url + "/v1/chat/completions", token="forged.123.abc")
    assert r.status_code == 401
    assert client.get_session(h.session_id).num_calls == 0


def test_admin_key_and_session_token_scope(gateway: RunningGateway, client: GatewayClient) -> None:
    r = httpx.post(gateway.url + "/api/sessions", json={})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_admin_key"
    a = client.create_session()
    b = client.create_session()
    # A session's own token may complete it, but not another session, nor read anything.
    r = _post(gateway.url + f"/api/sessions/{b.session_id}/complete", a.token, {"reward": 1})
    assert r.status_code == 401
    r = httpx.get(
        gateway.url + f"/api/sessions/{a.session_id}",
        headers={"authorization": f"Bearer {a.token}"},
    )
    assert r.status_code == 401
    info = client.complete(a.session_id, reward=0.5, token=a.token)
    assert info.status == "completed" and info.reward == 0.5


def test_open_mode_accepts_any_session_id(backend: tuple[NullBackend, ServerThread]) -> None:
    with serve_in_thread(backends=[(backend[1].url, "vllm")], open=True) as gw:
        oai = openai.OpenAI(base_url=gw.url + "/s/my-run-1/v1", api_key="x", max_retries=0)
        oai.chat.completions.create(model="p", messages=MSGS)
        with gw.client() as c:
            assert c.get_session("my-run-1").num_calls == 1


def test_body_size_limit(backend: tuple[NullBackend, ServerThread]) -> None:
    with (
        serve_in_thread(backends=[(backend[1].url, "vllm")], max_body_bytes=1000) as gw,
        gw.client() as c,
    ):
        h = c.create_session()
        big = {"model": "p", "messages": [{"role": "user", "content": "x" * 2000}]}
        r = _post(h.base_url + "/chat/completions", json=big)
        assert r.status_code == 413 and "1000" in r.json()["error"]["message"]


def test_call_and_token_budgets(client: GatewayClient) -> None:
    h = client.create_session(max_calls=2)
    oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
    for _ in range(2):
        oai.chat.completions.create(model="p", messages=MSGS)
    with pytest.raises(openai.RateLimitError, match="budget of 2 model calls"):
        oai.chat.completions.create(model="p", messages=MSGS)
    t = client.create_session(max_tokens=20)
    oai = openai.OpenAI(base_url=t.base_url, api_key="x", max_retries=0)
    r = oai.chat.completions.create(model="p", messages=MSGS)
    assert r.usage is not None and r.usage.completion_tokens == 20  # clamped to the budget
    with pytest.raises(openai.RateLimitError, match="budget of 20 tokens"):
        oai.chat.completions.create(model="p", messages=MSGS)


def test_complete_is_idempotent_and_conflicts(client: GatewayClient) -> None:
    h = client.create_session(group_id="grp-c")
    oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
    oai.chat.completions.create(model="p", messages=MSGS)
    first = client.complete(h.session_id, reward=1.0, metrics={"acc": 1.0})
    again = client.complete(h.session_id, reward=1.0, metrics={"acc": 1.0})
    assert first == again and first.num_calls == 1
    with pytest.raises(GatewayAPIError) as exc:
        client.complete(h.session_id, reward=0.0)
    assert exc.value.status_code == 409 and exc.value.code == "completion_conflict"
    with pytest.raises(openai.ConflictError, match="accepts no more model calls"):
        oai.chat.completions.create(model="p", messages=MSGS)
    assert [s.session_id for s in client.list_sessions(group_id="grp-c")] == [h.session_id]
    assert client.list_sessions(group_id="grp-c", status="running") == []
    with pytest.raises(GatewayAPIError) as exc:
        client.complete(h.session_id, status="weird")
    assert exc.value.status_code == 400


def test_wait_long_polls_until_complete(client: GatewayClient) -> None:
    h = client.create_session()
    t0 = time.monotonic()
    assert client.wait(h.session_id, timeout=0.3).status == "running"
    assert time.monotonic() - t0 >= 0.25
    timer = threading.Timer(0.3, lambda: client.complete(h.session_id, reward=2.0))
    timer.start()
    try:
        t0 = time.monotonic()
        info = client.wait(h.session_id, timeout=20)
        assert info.status == "completed" and info.reward == 2.0
        assert time.monotonic() - t0 < 5
    finally:
        timer.join()
    with pytest.raises(GatewayAPIError) as exc:
        client.wait("no-such-session", timeout=0.1)
    assert exc.value.status_code == 404


def test_delete_session(client: GatewayClient) -> None:
    h = client.create_session()
    client.delete_session(h.session_id)
    with pytest.raises(GatewayAPIError) as exc:
        client.get_session(h.session_id)
    assert exc.value.status_code == 404
    r = _post(h.base_url + "/chat/completions")
    assert r.status_code == 404


def test_pause_holds_new_calls_and_drains(
    backend: tuple[NullBackend, ServerThread],
) -> None:
    slow = NullBackend(delay=0.4)
    with (
        ServerThread(slow) as server,
        serve_in_thread(backends=[(server.url, "vllm")]) as gw,
        gw.client() as c,
    ):
        h = c.create_session()
        url = h.base_url + "/chat/completions"
        results: list[int] = []
        inflight = threading.Thread(target=lambda: results.append(_post(url).status_code))
        inflight.start()
        deadline = time.monotonic() + 60
        while gw.gateway.in_flight == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        t0 = time.monotonic()
        state = c.pause(wait=True)
        assert state == {"paused": True, "in_flight": 0}
        assert time.monotonic() - t0 >= 0.05
        assert c.get_session(h.session_id).num_calls == 1  # drained: committed already
        inflight.join(60)
        assert results == [200]
        held = threading.Thread(target=lambda: results.append(_post(url).status_code))
        held.start()
        time.sleep(0.3)
        assert results == [200] and c.pause_status()["paused"]
        assert c.resume()["paused"] is False
        held.join(60)
        assert results == [200, 200]


def test_create_session_validates(client: GatewayClient) -> None:
    for bad in (
        {"capture": "magic"},
        {"sampling_policy": {"temperature": "both"}},
        {"unknown_field": 1},
    ):
        with pytest.raises(GatewayAPIError) as exc:
            client.create_session(**bad)
        assert exc.value.status_code == 400


def test_wait_leaves_no_waiter_behind(gateway: RunningGateway, client: GatewayClient) -> None:
    """Every ``/wait`` removes its entry when the last waiter leaves: after completion, after a
    timeout, and when the session is deleted under it."""
    gw = gateway.gateway
    for _ in range(5):
        h = client.create_session()
        client.complete(h.session_id, reward=1.0)
        client.wait(h.session_id, timeout=1)
    h = client.create_session()
    assert client.wait(h.session_id, timeout=0.1).status == "running"
    assert gw.waiters == {} and gw.waiter_counts == {}

    # Two waiters on one session; the first to time out must not take the other's entry.
    results: list[str] = []
    slow = threading.Thread(
        target=lambda: results.append(client.wait(h.session_id, timeout=20).status)
    )
    slow.start()
    deadline = time.monotonic() + 60
    while h.session_id not in gw.waiters and time.monotonic() < deadline:
        time.sleep(0.01)
    assert client.wait(h.session_id, timeout=0.1).status == "running"
    assert gw.waiter_counts.get(h.session_id) == 1
    client.complete(h.session_id, reward=1.0)
    slow.join(60)
    assert results == ["completed"] and gw.waiters == {} and gw.waiter_counts == {}

    # Deleted while waited on: the waiter is woken (404) and nothing is left.
    h = client.create_session()
    errors: list[int] = []

    def waiter() -> None:
        try:
            client.wait(h.session_id, timeout=20)
        except GatewayAPIError as exc:
            errors.append(exc.status_code)

    t = threading.Thread(target=waiter)
    t.start()
    deadline = time.monotonic() + 60
    while h.session_id not in gw.waiters and time.monotonic() < deadline:
        time.sleep(0.01)
    t0 = time.monotonic()
    client.delete_session(h.session_id)
    t.join(60)
    # Woken by the delete, not by its 20 s timeout (slack for a busy machine).
    assert errors == [404] and time.monotonic() - t0 < 10
    assert gw.waiters == {} and gw.waiter_counts == {}


def test_control_plane_errors_are_openai_shaped(gateway: RunningGateway) -> None:
    headers = {"authorization": f"Bearer {gateway.admin_key}"}
    api = gateway.url + "/api"
    sid = httpx.post(api + "/sessions", json={}, headers=headers).json()["session_id"]
    for bad in (["completed"], 1, {"x": 1}, "weird"):
        r = httpx.post(f"{api}/sessions/{sid}/complete", json={"status": bad}, headers=headers)
        assert r.status_code == 400, (bad, r.text)
        assert r.headers["content-type"] == "application/json"
        assert "status must be one of" in r.json()["error"]["message"]
    for limit in ("9" * 24, "100001", "0", "-1", "x", "１"):
        r = httpx.get(api + "/sessions", params={"limit": limit}, headers=headers)
        assert r.status_code == 400, (limit, r.text)
        assert r.json()["error"]["code"] == "invalid_query"
    r = httpx.get(api + "/sessions", params={"limit": "100000"}, headers=headers)
    assert r.status_code == 200


def test_control_plane_unexpected_error_is_openai_shaped(
    gateway: RunningGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("store exploded")

    monkeypatch.setattr(gateway.gateway.store, "list_sessions", broken)
    r = httpx.get(
        gateway.url + "/api/sessions",
        headers={"authorization": f"Bearer {gateway.admin_key}"},
    )
    assert r.status_code == 500 and r.headers["content-type"] == "application/json"
    err = r.json()["error"]
    assert err["type"] == "server_error" and err["code"] == "internal_error"
    # The exception text stays in the gateway's log, not in the body (it may show internals).
    assert "store exploded" not in err["message"] and "log" in err["message"]
