"""``/ui`` on the gateway: login form -> cookie (never the key, never in a URL), live figures,
a session's trajectory page."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from rollwire.agent.serving import ServerThread
from rollwire.gateway import RunningGateway, serve_in_thread
from rollwire.gateway.ui import COOKIE
from rollwire.report.html import read_report_data
from rollwire.testing.null_backend import NullBackend


@pytest.fixture
def gateway(tmp_path) -> Iterator[RunningGateway]:  # type: ignore[no-untyped-def]
    with (
        ServerThread(NullBackend(reply=lambda body: {"content": "hello there"})) as backend,
        serve_in_thread(
            backends=[(backend.url, "vllm")], store=f"sqlite:{tmp_path / 'gw.db'}"
        ) as gw,
    ):
        yield gw


def _login(gw: RunningGateway, key: str) -> httpx.Client:
    client = httpx.Client(base_url=gw.url, timeout=30)
    client.post("/ui/login", data={"key": key})
    return client


def _calls(gw: RunningGateway, n: int) -> str:
    with gw.client() as c:
        handle = c.create_session(group_id="g1")
        oai = openai.OpenAI(base_url=handle.base_url, api_key=handle.token)
        for i in range(n):
            oai.chat.completions.create(model="p", messages=[{"role": "user", "content": f"q{i}"}])
        c.complete(handle.session_id, reward=0.5)
    return handle.session_id


def test_login_sets_a_signed_cookie_not_the_key(gateway: RunningGateway) -> None:
    anon = httpx.Client(base_url=gateway.url, timeout=30)
    r = anon.get("/ui")
    assert r.status_code == 303 and r.headers["location"] == "/ui/login"
    assert anon.get("/ui/api/stats").status_code == 401
    form = anon.get("/ui/login")
    assert form.status_code == 200 and 'name="key"' in form.text and 'method="post"' in form.text
    bad = anon.post("/ui/login", data={"key": "wrong"})
    assert bad.status_code == 303 and bad.headers["location"] == "/ui/login?failed=1"
    assert COOKIE not in bad.cookies
    good = anon.post("/ui/login", data={"key": gateway.admin_key})
    assert good.status_code == 303 and good.headers["location"] == "/ui"
    set_cookie = good.headers["set-cookie"]
    assert "HttpOnly" in set_cookie and "SameSite=strict" in set_cookie and "Path=/ui" in set_cookie
    assert gateway.admin_key is not None and gateway.admin_key not in set_cookie
    page = anon.get("/ui")
    assert page.status_code == 200 and 'id="cards"' in page.text
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert gateway.admin_key not in page.text
    # a forged or stale cookie is refused; logging out clears it
    forged = httpx.Client(base_url=gateway.url, cookies={COOKIE: "9999999999.deadbeef"}, timeout=30)
    assert forged.get("/ui/api/stats").status_code == 401
    out = anon.post("/ui/logout")
    assert out.status_code == 303 and anon.get("/ui/api/stats").status_code == 401


def test_stats_follow_the_traffic(gateway: RunningGateway) -> None:
    assert gateway.admin_key is not None
    ui = _login(gateway, gateway.admin_key)
    first = ui.get("/ui/api/stats").json()
    assert first["calls"] == 0 and first["calls_per_s"] == 0.0
    with gateway.client() as c:
        running = c.create_session(group_id="g2")
    sid = _calls(gateway, 3)
    s = ui.get("/ui/api/stats").json()
    assert s["calls"] == 3 and s["calls_by_status"] == {"ok": 3}
    assert s["calls_per_s"] > 0 and s["tokens_per_s"] > 0
    assert s["tokens"]["completion"] > 0
    assert s["sessions"]["by_status"] == {"completed": 1, "running": 1}
    assert s["sessions"]["live"] == 1
    assert s["groups"] == {"total": 2, "completed": 1}
    assert s["latency_ms"]["p50"] is not None and s["latency_ms"]["p50"] > 0
    assert s["paused"] is False and s["store"]["kind"] == "SQLiteStore" and s["store"]["bytes"] > 0
    assert [r["id"] for r in s["recent"]] == [sid, running.session_id]
    assert s["recent"][0]["calls"] == 3
    with gateway.client() as c:
        c.pause()
        c.set_policy_version("v7")
    s = ui.get("/ui/api/stats").json()
    assert s["paused"] is True and s["policy_version"] == "v7"
    # refusals are counted by kind
    httpx.post(
        gateway.url + "/s/forged/v1/chat/completions",
        json={"model": "p", "messages": []},
        timeout=30,
    )
    s = ui.get("/ui/api/stats").json()
    assert s["errors"].get("unauthorized", 0) >= 1 and 0 < s["error_rate"] < 1


def test_session_page_is_the_trajectory_view(gateway: RunningGateway) -> None:
    assert gateway.admin_key is not None
    sid = _calls(gateway, 2)
    anon = httpx.Client(base_url=gateway.url, timeout=30)
    assert anon.get(f"/ui/sessions/{sid}").status_code == 303
    ui = _login(gateway, gateway.admin_key)
    page = ui.get(f"/ui/sessions/{sid}")
    assert page.status_code == 200
    index, _, payloads = read_report_data(page.text)
    assert index["summary"]["rollouts"] == 1 and index["summary"]["calls"] == 2
    assert payloads[0]["id"] == sid and payloads[0]["rows"]
    assert ui.get("/ui/sessions/nope").status_code == 404


def test_tool_call_health_on_the_dashboard_and_in_metrics(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A backend that answers tool-offering calls with tool-call text and no ``tool_calls`` (a
    parser that does not read the model's format) shows as none parsed."""
    drifted = '<tool_call>{"name": "guess", "arguments": {}}</tool_call>'
    tools = [{"type": "function", "function": {"name": "guess", "parameters": {}}}]
    with (
        ServerThread(NullBackend(reply=lambda body: {"content": drifted})) as backend,
        serve_in_thread(
            backends=[(backend.url, "vllm")], store=f"sqlite:{tmp_path / 'gw.db'}"
        ) as gw,
    ):
        assert gw.admin_key is not None
        with gw.client() as c:
            handle = c.create_session(group_id="g1")
            oai = openai.OpenAI(base_url=handle.base_url, api_key=handle.token)
            for _ in range(2):
                oai.chat.completions.create(
                    model="p",
                    messages=[{"role": "user", "content": "q"}],
                    tools=tools,  # type: ignore[arg-type]
                )
            c.complete(handle.session_id, reward=0.0)
        s = _login(gw, gw.admin_key).get("/ui/api/stats").json()
        assert s["tools"] == {"offered": 2, "parsed": 0, "unparsed": 2, "none_parsed": True}
        text = httpx.get(gw.url + "/metrics", headers={"authorization": f"Bearer {gw.admin_key}"},
                         timeout=30).text  # fmt: skip
        assert 'rollwire_tool_calls_total{kind="unparsed"} 2' in text
