"""Backend faults: 5xx, 429, timeout, connection reset, truncated stream, missing token ids,
a stream answered without SSE, the agent hanging up mid-stream. Each time the call is recorded
failed or non-trainable, the agent gets a clear error, and the session goes on."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from rollwire.agent.serving import ServerThread
from rollwire.gateway import RunningGateway, serve_in_thread

MSG = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
FAULT: dict[str, str] = {"mode": "ok"}


def _answer(with_ids: bool = True) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": "ok"},
        "finish_reason": "stop",
        "logprobs": {"content": [{"token": "o", "logprob": -0.1}, {"token": "k", "logprob": -0.2}]},
    }
    out: dict[str, Any] = {
        "id": "c",
        "object": "chat.completion",
        "model": "m",
        "choices": [choice],
    }
    if with_ids:
        out["prompt_token_ids"] = [1, 2, 3]
        choice["token_ids"] = [7, 8]
    return out


def _chunk(content: str, ids: list[int], finish: str | None = None) -> bytes:
    return (
        b"data: "
        + orjson.dumps(
            {
                "id": "c",
                "object": "chat.completion.chunk",
                "model": "m",
                "prompt_token_ids": [1, 2, 3],
                "choices": [
                    {
                        "index": 0,
                        "delta": {"content": content},
                        "token_ids": ids,
                        "logprobs": {"content": [{"token": content, "logprob": -0.1}] * len(ids)},
                        "finish_reason": finish,
                    }
                ],
            }
        )
        + b"\n\n"
    )


async def backend(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A vLLM-shaped backend whose next answers follow ``FAULT["mode"]``."""
    if scope["type"] != "http":
        return
    raw = b""
    while True:
        msg = await receive()
        raw += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    if scope["path"] in ("/health", "/v1/models"):
        body = b'{"data": [{"id": "m"}]}' if scope["path"] == "/v1/models" else b"{}"
        await _send(send, 200, body)
        return
    stream = bool(orjson.loads(raw).get("stream")) if raw else False
    mode = FAULT["mode"]
    if mode in ("500", "429"):
        await _send(send, int(mode), b'{"error": {"message": "backend says no"}}')
    elif mode == "hang":
        await asyncio.sleep(30)
    elif mode == "no_ids":
        await _send(send, 200, orjson.dumps(_answer(with_ids=False)))
    elif mode == "not_sse" and stream:
        await _send(send, 200, orjson.dumps(_answer()))
    elif stream:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        await send({"type": "http.response.body", "body": _chunk("o", [7]), "more_body": True})
        if mode == "truncated":
            await send({"type": "http.response.body", "body": b""})  # ends: no finish, no DONE
            return
        if mode == "slow_stream":
            for _ in range(100):
                await asyncio.sleep(0.05)
                await send({"type": "http.response.body", "body": b": ping\n\n", "more_body": True})
        await send(
            {"type": "http.response.body", "body": _chunk("k", [8], "stop") + b"data: [DONE]\n\n"}
        )
    else:
        await _send(send, 200, orjson.dumps(_answer()))


async def _send(send: Any, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})


class ResetServer:
    """Accepts a connection, reads the request, then resets it (RST)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        import struct

        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.recv(65536)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()


@pytest.fixture(scope="module")
def gw() -> Iterator[RunningGateway]:
    with (
        ServerThread(backend) as b,
        serve_in_thread(backends=[(b.url, "vllm")], admin_key="k", upstream_timeout=1.0) as g,
    ):
        yield g


def _post(base: str, stream: bool = False) -> httpx.Response:
    return httpx.post(base + "/chat/completions", json={**MSG, "stream": stream}, timeout=30)


@pytest.mark.parametrize(
    ("mode", "stream", "status"),
    [
        ("500", False, 500),
        ("429", False, 429),
        ("500", True, 500),
        ("hang", False, 504),
        ("hang", True, 504),
        ("not_sse", True, 502),
    ],
)
def test_backend_fault_is_a_clear_error_and_a_failed_call(
    gw: RunningGateway, mode: str, stream: bool, status: int
) -> None:
    with gw.client() as c:
        h = c.create_session()
        FAULT["mode"] = mode
        try:
            r = _post(h.base_url, stream)
        finally:
            FAULT["mode"] = "ok"
        assert r.status_code == status, r.text
        assert r.json()["error"]["message"]
        (failed,) = c.calls(h.session_id)
        assert failed.status == "failed" and not failed.trainable and failed.error
        # The session goes on.
        assert _post(h.base_url, stream).status_code == 200
        assert [x.status for x in c.calls(h.session_id)] == ["failed", "ok"]


def test_truncated_stream_is_recorded_failed(gw: RunningGateway) -> None:
    with gw.client() as c:
        h = c.create_session()
        FAULT["mode"] = "truncated"
        try:
            r = _post(h.base_url, stream=True)
        finally:
            FAULT["mode"] = "ok"
        assert r.status_code == 200  # the headers were out before the stream broke off
        (call,) = c.calls(h.session_id)
        assert call.status == "failed" and not call.trainable
        assert _post(h.base_url).status_code == 200


def test_missing_token_ids_make_a_call_non_trainable(gw: RunningGateway) -> None:
    with gw.client() as c:
        h = c.create_session()
        FAULT["mode"] = "no_ids"
        try:
            r = _post(h.base_url)
        finally:
            FAULT["mode"] = "ok"
        assert r.status_code == 200  # the agent has its answer
        (call,) = c.calls(h.session_id)
        assert not call.trainable and call.completion_ids.shape[0] == 0


def test_connection_reset_is_a_502_and_recorded() -> None:
    reset = ResetServer()
    with serve_in_thread(backends=[(reset.url, "vllm")], admin_key="k") as g, g.client() as c:
        h = c.create_session()
        r = _post(h.base_url)
        assert r.status_code in (502, 503), r.text
        assert r.json()["error"]["message"]
        calls = c.calls(h.session_id)
        assert all(x.status == "failed" and not x.trainable for x in calls)
    reset.sock.close()


def test_agent_hanging_up_mid_stream_is_recorded(gw: RunningGateway) -> None:
    with gw.client() as c:
        h = c.create_session()
        FAULT["mode"] = "slow_stream"
        try:
            with (
                httpx.Client(timeout=30) as http,
                http.stream(
                    "POST", h.base_url + "/chat/completions", json={**MSG, "stream": True}
                ) as r,
            ):
                for _ in r.iter_bytes():
                    break  # the first bytes, then hang up
        finally:
            FAULT["mode"] = "ok"
        deadline = time.monotonic() + 60
        calls = c.calls(h.session_id)
        while not calls and time.monotonic() < deadline:
            time.sleep(0.05)  # recorded in the background once the relay notices
            calls = c.calls(h.session_id)
        (call,) = calls
        assert call.status == "failed" and not call.trainable
        assert "disconnect" in (call.error or "")
        assert _post(h.base_url).status_code == 200


def test_agent_hanging_up_on_a_non_stream_call_is_recorded() -> None:
    from rollwire.testing.null_backend import NullBackend

    with (
        ServerThread(NullBackend(delay=1.0)) as b,
        serve_in_thread(backends=[(b.url, "vllm")], admin_key="k") as g,
        g.client() as c,
    ):
        h = c.create_session()
        with pytest.raises(httpx.TimeoutException):
            httpx.post(h.base_url + "/chat/completions", json=MSG, timeout=0.3)
        deadline = time.monotonic() + 60
        calls = c.calls(h.session_id)
        while not calls and time.monotonic() < deadline:
            time.sleep(0.05)  # committed once the backend answers, after the hang-up
            calls = c.calls(h.session_id)
        (call,) = calls
        assert not call.trainable and "client_disconnected" in call.flags
        ok = httpx.post(h.base_url + "/chat/completions", json=MSG, timeout=30)
        assert ok.status_code == 200
        assert c.calls(h.session_id)[1].trainable
