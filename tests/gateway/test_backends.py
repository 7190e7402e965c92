"""Backend kinds, failover, timeouts, restarts and storage cost."""

from __future__ import annotations

import os
import socket
import sqlite3
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import openai
import orjson
import pytest

from rollwire.agent.serving import ServerThread
from rollwire.gateway import serve_in_thread
from rollwire.testing.null_backend import NullBackend, render_ids
from rollwire.testing.waiting import until

MSGS = [{"role": "user", "content": "hi"}]


def test_sglang_backend_ids(tmp_path: Path) -> None:
    nb = NullBackend(kind="sglang")
    with (
        ServerThread(nb) as server,
        serve_in_thread(backends=[(server.url, "sglang")]) as gw,
        gw.client() as c,
    ):
        h = c.create_session()
        oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
        r = oai.chat.completions.create(model="p", messages=MSGS, tools=[])
        assert "response_token_ids" not in r.choices[0].model_dump()
        stream = oai.chat.completions.create(model="p", messages=MSGS, stream=True)
        chunks = [ch.model_dump() for ch in stream]
        assert all("sglext" not in ch for ch in chunks)
        assert nb.requests[-1][0]["return_output_ids_in_sglext"] is True
        a, b = c.calls(h.session_id)
        np.testing.assert_array_equal(a.prompt_ids, render_ids(MSGS))
        np.testing.assert_array_equal(a.completion_ids, b.completion_ids)
        np.testing.assert_array_equal(a.prompt_ids, b.prompt_ids)
        assert a.trainable and b.trainable and a.logprobs_mode == "processed"


def test_openai_backend_is_not_trainable() -> None:
    nb = NullBackend()
    with (
        ServerThread(nb) as server,
        serve_in_thread(backends=[(server.url, "openai")]) as gw,
        gw.client() as c,
    ):
        h = c.create_session()
        oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
        oai.chat.completions.create(model="p", messages=MSGS)
        assert "return_token_ids" not in nb.requests[-1][0]
        (call,) = c.calls(h.session_id)
        assert not call.trainable and "no_token_ids" in call.flags


def test_killed_backend_is_routed_around() -> None:
    a, b = NullBackend(), NullBackend()
    sa, sb = ServerThread(a).start(), ServerThread(b).start()
    try:
        with (
            serve_in_thread(
                backends=[(sa.url, "vllm"), (sb.url, "vllm")], health_interval=0.2
            ) as gw,
            gw.client() as c,
        ):
            h = c.create_session()
            oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
            oai.chat.completions.create(model="p", messages=MSGS)
            first = a if a.calls else b
            second, first_server = (b, sa) if first is a else (a, sb)
            first_server.stop()
            for _ in range(3):
                oai.chat.completions.create(model="p", messages=MSGS)
            assert second.calls == 3
            calls = c.calls(h.session_id)
            assert [x.status for x in calls] == ["ok"] * 4
            down = [x for x in c.backends() if not x["healthy"]]
            assert len(down) == 1 and down[0]["url"] == first_server.url
            # The other one dies too: an OpenAI-shaped 502 and a failed call record.
            (sb if first_server is sa else sa).stop()
            with pytest.raises(openai.InternalServerError) as exc:
                oai.chat.completions.create(model="p", messages=MSGS)
            assert exc.value.status_code == 502
            last = c.calls(h.session_id)[-1]
            assert last.status == "failed" and not last.trainable and last.error
            # A fresh backend added at run time takes over.
            nb = NullBackend()
            with ServerThread(nb) as sn:
                c.add_backend(sn.url, name="fresh")
                oai.chat.completions.create(model="p", messages=MSGS)
                assert nb.calls == 1
                c.remove_backend("fresh")
    finally:
        sa.stop()
        sb.stop()


def test_upstream_timeout_is_504() -> None:
    nb = NullBackend(delay=1.0)
    with (
        ServerThread(nb) as server,
        serve_in_thread(backends=[(server.url, "vllm")], upstream_timeout=0.2) as gw,
        gw.client() as c,
    ):
        h = c.create_session()
        r = httpx.post(
            h.base_url + "/chat/completions", json={"model": "p", "messages": MSGS}, timeout=30
        )
        assert r.status_code == 504 and r.json()["error"]["code"] == "upstream_timeout"
        (call,) = c.calls(h.session_id)
        assert call.status == "failed" and not call.trainable


def test_calls_survive_gateway_restart(tmp_path: Path) -> None:
    path = tmp_path / "gw.sqlite"
    nb = NullBackend()
    with ServerThread(nb) as server:
        with (
            serve_in_thread(
                backends=[(server.url, "vllm")], store=f"sqlite:{path}", secret="s3cret"
            ) as gw,
            gw.client() as c,
        ):
            h = c.create_session()
            oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
            for _ in range(5):
                oai.chat.completions.create(model="p", messages=MSGS)
            before = c.calls(h.session_id)
        with (
            serve_in_thread(
                backends=[(server.url, "vllm")], store=f"sqlite:{path}", secret="s3cret"
            ) as gw2,
            gw2.client() as c2,
        ):
            after = c2.calls(h.session_id)
            assert [x.call_id for x in after] == [x.call_id for x in before]
            for x, y in zip(before, after):
                np.testing.assert_array_equal(x.prompt_ids, y.prompt_ids)
                np.testing.assert_array_equal(x.logprobs, y.logprobs)
            # The same token keeps working (same secret) and indices continue.
            base = h.base_url.replace(gw.url, gw2.url)
            openai.OpenAI(base_url=base, api_key="x", max_retries=0).chat.completions.create(
                model="p", messages=MSGS
            )
            assert [x.index for x in c2.calls(h.session_id)] == list(range(6))


def test_storage_grows_linearly(tmp_path: Path) -> None:
    """40 turns, ~200 new tokens a turn: the store holds about the final context, not 40x it."""
    path = tmp_path / "lin.sqlite"
    nb = NullBackend(reply=lambda body: {"content": "w" * 100})
    with (
        ServerThread(nb) as server,
        serve_in_thread(backends=[(server.url, "vllm")], store=f"sqlite:{path}") as gw,
        gw.client() as c,
    ):
        h = c.create_session()
        oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
        tools = [
            {
                "type": "function",
                "function": {
                    "name": f"tool{i}",
                    "description": "d" * 200,
                    "parameters": {"type": "object"},
                },
            }
            for i in range(4)
        ]
        messages: list[dict] = [{"role": "system", "content": "s" * 300}]
        for turn in range(40):
            messages.append({"role": "user", "content": f"turn {turn} " + "u" * 92})
            r = oai.chat.completions.create(model="p", messages=messages, tools=tools)
            messages.append({"role": "assistant", "content": r.choices[0].message.content})
        calls = c.calls(h.session_id)
        final = calls[-1]
        final_tokens = final.prompt_ids.shape[0] + final.completion_ids.shape[0]
        final_request = len(orjson.dumps(final.request))
        budget = 2 * (final_tokens * 4 + final_request)
        used = gw.gateway.store.session_bytes(h.session_id)  # type: ignore[attr-defined]
        import asyncio

        used = asyncio.run(used) if asyncio.iscoroutine(used) else used
    conn = sqlite3.connect(path)
    pages = (
        conn.execute("PRAGMA page_count").fetchone()[0]
        * conn.execute("PRAGMA page_size").fetchone()[0]
    )
    conn.close()
    assert final_tokens > 40 * 200
    assert used < budget, (used, budget)
    assert pages < budget + 64 * 1024, (pages, budget)  # the whole file, schema pages included
    assert os.path.getsize(path) == pages
    print(
        f"\nfinal context {final_tokens} tokens; store {used} B payload, {pages} B file; "
        f"budget {budget} B; per-call JSON store would be ~"
        f"{sum(len(orjson.dumps(x.request)) for x in calls)} B of requests alone"
    )
    _ = time


class _DiesMidAnswer:
    """A backend that accepts a request, sends the status line, headers and part of the body,
    then drops the connection (a crashed inference server)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.sock.settimeout(0.05)
        self.requests = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(5)
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                self.requests += 1
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b'Content-Length: 4000\r\n\r\n{"id": "chatcmpl-half", "choices": [{"ind'
                )

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


def test_backend_dying_mid_answer_is_retried_on_a_healthy_one() -> None:
    dying = _DiesMidAnswer()
    good = NullBackend()
    try:
        with (
            ServerThread(good) as sg,
            serve_in_thread(backends=[(dying.url, "vllm"), (sg.url, "vllm")]) as gw,
            gw.client() as c,
        ):
            h = c.create_session()
            oai = openai.OpenAI(base_url=h.base_url, api_key="x", max_retries=0)
            r = oai.chat.completions.create(model="p", messages=MSGS)
            assert r.choices[0].message.content
            assert dying.requests >= 1 and good.calls == 1
            calls = c.calls(h.session_id)
            assert [x.status for x in calls] == ["ok"]
            assert sum(x.trainable for x in calls) == 1
            assert calls[0].backend == "b1"
            assert {b["name"]: b["healthy"] for b in c.backends()}["b0"] is False
    finally:
        dying.close()


class _RenamedBackend(NullBackend):
    """A NullBackend whose ``GET /v1/models`` answers ``served`` (changeable, like a restart
    under another served model name)."""

    served = "served-a"

    async def __call__(self, scope: dict, receive: object, send: object) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" and scope["path"] == "/v1/models":
            body = orjson.dumps({"object": "list", "data": [{"id": self.served}]})
            await send(  # type: ignore[operator]
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": body})  # type: ignore[operator]
            return
        await super().__call__(scope, receive, send)  # type: ignore[arg-type]


def test_served_model_name_is_rediscovered_unless_pinned() -> None:
    """A backend restarted under a new served name is followed at the next health check; a
    name pinned with ``add_backend(model=...)`` is never replaced."""
    nb, pinned = _RenamedBackend(), _RenamedBackend()
    with (
        ServerThread(nb) as server,
        ServerThread(pinned) as pinned_server,
        serve_in_thread(backends=[(server.url, "vllm")], health_interval=0.1) as gw,
        gw.client() as c,
    ):
        until("served-a is followed", lambda: c.backends()[0]["model"] == "served-a", 60)
        h = c.create_session()
        body = {"model": "policy", "messages": MSGS}
        assert (
            httpx.post(h.base_url + "/chat/completions", json=body, timeout=30).status_code == 200
        )
        assert nb.requests[-1][0]["model"] == "served-a"
        nb.served = "served-b"
        until("served-b is followed", lambda: c.backends()[0]["model"] == "served-b", 60)
        assert (
            httpx.post(h.base_url + "/chat/completions", json=body, timeout=30).status_code == 200
        )
        assert nb.requests[-1][0]["model"] == "served-b"
        info = c.backends()[0]
        assert info["model_pinned"] is False

        c.remove_backend(info["name"])
        listed = c.add_backend(pinned_server.url, name="pinned", model="fixed-name")
        assert listed[0]["model"] == "fixed-name" and listed[0]["model_pinned"] is True
        pinned.served = "served-c"
        time.sleep(0.4)  # a few health checks
        assert c.backends()[0]["model"] == "fixed-name"
        h = c.create_session()
        assert (
            httpx.post(h.base_url + "/chat/completions", json=body, timeout=30).status_code == 200
        )
        assert pinned.requests[-1][0]["model"] == "fixed-name"


async def test_async_add_backend_pins_model() -> None:
    from rollwire.trainer.gateway_client import AsyncGatewayClient

    with ServerThread(NullBackend()) as server, serve_in_thread(backends=[]) as gw:
        async with AsyncGatewayClient(gw.url, admin_key=gw.admin_key) as c:
            listed = await c.add_backend(server.url, name="x", model="pinned-name")
            assert listed[0]["model"] == "pinned-name" and listed[0]["model_pinned"] is True
