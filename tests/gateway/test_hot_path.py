"""Per-call shortcuts of the data plane behave as what they replace."""

from __future__ import annotations

import asyncio
import re
import socket
from typing import Any

import numpy as np
import pytest

from rollwire.agent.serving import ServerThread
from rollwire.data.protocol import ModelCall
from rollwire.gateway import asgi
from rollwire.gateway.dataplane import capture, commit, hangups


class _Flow:
    def __init__(self) -> None:
        self.resumed = 0

    def resume_reading(self) -> None:
        self.resumed += 1


class _Cycle:
    """The part of uvicorn's request cycle the hang-up check reads."""

    def __init__(self) -> None:
        self.disconnected = False
        self.flow = _Flow()

    async def receive(self) -> dict[str, Any]:
        raise AssertionError("the connection's own flag is read: receive() is never called")


async def test_uvicorn_cycle_flag_needs_no_task_per_call() -> None:
    cycle = _Cycle()
    tasks = len(asyncio.all_tasks())
    hangup = hangups.watch(cycle.receive)
    assert len(asyncio.all_tasks()) == tasks
    assert cycle.flow.resumed == 1  # a paused transport would never see the agent go
    assert not hangup.is_set()
    cycle.disconnected = True  # what uvicorn's connection_lost does
    assert hangup.is_set()
    hangup.stop()


async def test_other_servers_get_a_watcher_on_receive() -> None:
    gone = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await gone.wait()
        return {"type": "http.disconnect"}

    hangup = hangups.watch(receive)
    await asyncio.sleep(0)
    assert not hangup.is_set()
    gone.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert hangup.is_set()
    hangup.stop()
    stopped = hangups.watch(receive)
    stopped.stop()
    await asyncio.sleep(0)
    assert not stopped.is_set()


def test_new_call_is_model_construct_with_every_field() -> None:
    fields = {"call_id": "c", "session_id": "s", "index": 0, "sampling": {"t": 1}, "stream": True}
    fast = commit.new_call(**fields)
    slow = ModelCall.model_construct(None, **{**commit._CALL_DEFAULTS, **fields})
    assert list(fast.__dict__) == list(slow.__dict__)
    for name, value in slow.__dict__.items():
        got = fast.__dict__[name]
        assert np.array_equal(got, value) if isinstance(value, np.ndarray) else got == value
    assert fast.model_fields_set == slow.model_fields_set
    assert fast.model_dump_json() == slow.model_dump_json()
    # Mutable defaults are the call's own.
    fast.flags.append("x")
    fast.request["k"] = 1
    again = commit.new_call(**fields)
    assert again.flags == [] and again.request == {}
    fast.latency_ms = 2.5  # assignment goes through pydantic as on any model
    assert fast.latency_ms == 2.5 and "latency_ms" in fast.model_fields_set


@pytest.mark.parametrize(
    "ids",
    [[1, 2, 3], [-(2**31), 0, 2**31 - 1], [1.5, True, 7], ["5"], [[1, 2], [3, 4]], (4, 5)],
)
def test_captured_ids_are_what_numpy_makes_of_them(ids: object) -> None:
    got = capture.extract({"prompt_token_ids": ids, "choices": [{"token_ids": [9]}]}).prompt_ids
    want = np.array(ids, dtype=np.int32)
    assert got.dtype == np.int32 and got.shape == want.shape and np.array_equal(got, want)
    assert got.flags.writeable
    with pytest.raises(OverflowError):
        capture.extract({"prompt_token_ids": [1, 2**31], "choices": []})


_CALLS = [
    ("/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}),
    (
        "/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True},
    ),
    ("/completions", {"prompt": "hi", "max_tokens": 8}),
    ("/responses", {"input": "hi", "max_output_tokens": 8}),
    ("/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}),
]


def test_a_served_call_leaves_no_reference_cycle(client: Any) -> None:
    """Each call's objects go when it ends (by reference count), not at the next cyclic
    collection: a request kept alive by a loop (its scope holding the connection's request
    cycle, which holds the scope) is 8 kB+ of garbage a call, piling up between collections."""
    import gc

    import httpx

    h = client.create_session()
    with httpx.Client(timeout=30) as http:
        for route, body in _CALLS:  # warm-up: first-use imports and caches
            assert http.post(h.base_url + route, json={"model": "policy", **body}).is_success
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for _ in range(3):
                for route, body in _CALLS:
                    r = http.post(h.base_url + route, json={"model": "policy", **body})
                    assert r.is_success, r.text
            gc.collect()
            leaked = [
                type(o).__module__ + "." + type(o).__qualname__
                for o in gc.garbage
                if type(o).__module__.split(".")[0] in ("rollwire", "uvicorn", "starlette")
            ]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
    assert leaked == []


def test_freed_heap_goes_back_to_the_os() -> None:
    """``malloc_trim`` (what the CLI's gateway calls every 2 s) returns freed C-heap pages: RSS
    after freeing many mid-sized blocks (numpy arrays, as the delta cache drops them) falls."""
    import gc
    from pathlib import Path

    from rollwire.gateway import process

    trim = process.malloc_trim()
    if trim is None:
        pytest.skip("this C library has no malloc_trim (not glibc): the trim is a no-op here")

    def rss_mb() -> float:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    # Below the mmap threshold (so on the heap), every other one kept: free holes, no free top.
    blocks = [np.ones(12_000, dtype=np.int32) for _ in range(4_000)]
    keep = blocks[1::2]
    del blocks
    gc.collect()
    before = rss_mb()
    trim(0)
    assert rss_mb() < before - 40, (before, rss_mb())
    assert len(keep) == 2_000


async def _one_write_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """``RawResponse`` as the data plane sends it; under ``/plain/`` through a ``send`` that is
    not uvicorn's own (so uvicorn writes it, as it writes every other response)."""
    if scope["type"] == "lifespan":
        await asgi.lifespan(receive, send, _nothing, _nothing)
        return
    await asgi.read_body(scope, receive, 1 << 30)
    size = int(scope["path"].rsplit("/", 1)[1])
    response = asgi.RawResponse(b"x" * size, status=201 if size % 2 else 200)
    if scope["path"].startswith("/plain/"):

        async def plain_send(message: dict[str, Any]) -> None:
            await send(message)

        await response(scope, receive, plain_send)
    else:
        await response(scope, receive, send)


async def _nothing() -> None:
    pass


def _exchange(url: str, raw: bytes) -> bytes:
    """Send ``raw`` on one connection and read until the server closes it."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(raw)
        got = []
        while chunk := sock.recv(1 << 20):
            got.append(chunk)
    return b"".join(got)


def _request(path: str, method: str = "GET", close: bool = False) -> bytes:
    conn = b"connection: close\r\n" if close else b""
    return f"{method} {path} HTTP/1.1\r\nhost: t\r\n".encode() + conn + b"\r\n"


def _dateless(raw: bytes) -> bytes:
    return re.sub(rb"date: [^\r]*\r\n", b"", raw)


def test_one_write_response_is_the_bytes_uvicorn_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pipelined keep-alive requests, a connection closed by the agent, HEAD, a body past the
    join limit: each answered byte for byte as uvicorn's own send answers it (the date aside),
    and the one-write path taken wherever it applies."""
    whole: list[bool] = []
    write_whole = asgi.RawResponse._write_whole

    def counted(self: asgi.RawResponse, cycle: Any) -> bool:
        whole.append(write_whole(self, cycle))
        return whole[-1]

    monkeypatch.setattr(asgi.RawResponse, "_write_whole", counted)
    sizes = [0, 7, 8400, asgi._JOIN_LIMIT + 1]
    with ServerThread(_one_write_app) as server:
        for prefix in ("/plain/", "/"):
            asked = b"".join(_request(f"{prefix}{n}") for n in sizes)
            asked += _request(f"{prefix}5", "HEAD") + _request(f"{prefix}3", close=True)
            got = _exchange(server.url, asked)
            if prefix == "/plain/":
                plain = got
                assert whole == []
        assert whole == [True] * len(sizes) + [False, True]  # HEAD goes through uvicorn's send
    assert _dateless(got) == _dateless(plain)
    assert got.count(b"HTTP/1.1 200 OK\r\n") == 2 and got.count(b"HTTP/1.1 201 Created\r\n") == 4
    assert got.endswith(b"connection: close\r\n\r\nxxx")  # and the server closed the connection
    assert b"x" * (asgi._JOIN_LIMIT + 1) in got
