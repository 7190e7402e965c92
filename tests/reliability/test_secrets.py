"""Secrets: the admin key from a file or the environment, tokens never logged, /metrics and
/health behind the key when asked, no internal exception text in error bodies."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from typer.testing import CliRunner

from rollwire.agent.serving import ServerThread, free_port
from rollwire.gateway import serve_in_thread
from rollwire.testing.null_backend import NullBackend

MSG = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}


def _served(monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str]) -> Any:
    import uvicorn

    from rollwire.cli.gateway import gateway_app

    seen: dict[str, Any] = {}

    def run(server: Any, sockets: Any = None) -> None:
        seen["app"] = server.config.app
        for sock in sockets or ():
            sock.close()

    monkeypatch.setattr(uvicorn.Server, "run", run)
    result = CliRunner().invoke(
        gateway_app, ["--store", "sqlite::memory:", "--port", str(free_port()), *args], env=env
    )
    assert result.exit_code == 0, result.output
    return seen["app"]


def test_admin_key_from_a_file_or_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    key_file = tmp_path / "admin.key"
    key_file.write_text("from-the-file\n")
    gw = _served(monkeypatch, ["--admin-key-file", str(key_file)], {})
    assert gw.admin_key == "from-the-file"
    gw = _served(monkeypatch, [], {"ROLLWIRE_ADMIN_KEY": "from-the-env"})
    assert gw.admin_key == "from-the-env"
    gw = _served(monkeypatch, ["--private-metrics"], {"ROLLWIRE_ADMIN_KEY": "k"})
    assert gw.config.private_metrics is True


def test_tokens_and_keys_are_never_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="rollwire")
    with (
        ServerThread(NullBackend()) as b,
        serve_in_thread(
            backends=[(b.url, "vllm"), ("http://127.0.0.1:9", "vllm")], admin_key="admin-secret-1"
        ) as gw,
        gw.client() as c,
    ):
        h = c.create_session()
        good = httpx.post(h.base_url + "/chat/completions", json=MSG, timeout=30)
        assert good.status_code == 200
        forged = h.token[:-4] + "AAAA"
        for base in (h.base_url, h.base_url.replace(h.token, forged)):
            httpx.post(base + "/chat/completions", content=b"{bad json", timeout=30)
            httpx.post(base + "/chat/completions", json={**MSG, "stream": True}, timeout=30)
        httpx.post(
            gw.url + "/v1/chat/completions",
            json=MSG,
            headers={"authorization": f"Bearer {forged}"},
            timeout=30,
        )
        httpx.get(
            gw.url + "/api/sessions", headers={"authorization": "Bearer wrong-admin"}, timeout=30
        )
        c.complete(h.session_id, reward=1.0)
    # The gateway's own logs and its server's (the test's httpx client logs its URLs itself).
    mine = [r for r in caplog.records if r.name.startswith(("rollwire", "uvicorn", "aiohttp"))]
    text = "\n".join(r.getMessage() + str(r.args) for r in mine)
    assert any(r.name.startswith("rollwire") for r in mine), (
        "no gateway log: the check proves nothing"
    )
    for secret in (h.token, forged, "admin-secret-1", h.token.rsplit(".", 1)[-1]):
        assert secret not in text


def test_metrics_and_health_can_require_the_key() -> None:
    with (
        ServerThread(NullBackend()) as b,
        serve_in_thread(backends=[(b.url, "vllm")], admin_key="k", private_metrics=True) as gw,
    ):
        for path in ("/metrics", "/health"):
            assert httpx.get(gw.url + path, timeout=30).status_code == 401
            r = httpx.get(gw.url + path, headers={"authorization": "Bearer k"}, timeout=30)
            assert r.status_code == 200


def test_error_bodies_do_not_echo_internal_exceptions(monkeypatch: pytest.MonkeyPatch) -> None:
    from rollwire.gateway.dataplane import calls

    async def broken(*args: object, **kw: object) -> object:
        raise RuntimeError("internal detail /srv/secret/path")

    with (
        ServerThread(NullBackend()) as b,
        serve_in_thread(backends=[(b.url, "vllm")], admin_key="k") as gw,
        gw.client() as c,
    ):
        h = c.create_session()
        monkeypatch.setattr(calls, "forward", broken)
        r = httpx.post(h.base_url + "/chat/completions", json=MSG, timeout=30)
        assert r.status_code == 500
        assert "secret" not in r.text and "RuntimeError" not in r.text
        assert "gateway's log" in r.json()["error"]["message"]
        monkeypatch.setattr(gw.gateway.store, "calls", broken)
        r = httpx.get(
            f"{gw.url}/api/sessions/{h.session_id}/calls",
            headers={"authorization": "Bearer k"},
            timeout=30,
        )
        assert r.status_code == 500 and "secret" not in r.text
        # The failed attempt itself is recorded with the detail, for whoever reads the store.
        monkeypatch.undo()
        (call,) = c.calls(h.session_id)
        assert call.status == "failed" and "internal detail" in (call.error or "")
        assert orjson.loads(r.content)["error"]["code"] == "internal_error"
