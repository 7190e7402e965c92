"""The lean upstream HTTP client: keep-alive, framing, and the three kinds of failure."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from rollwire.gateway.backends.upstream import (
    UpstreamBrokenError,
    UpstreamConnectError,
    UpstreamPool,
)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
HDRS = b"Content-Type: application/json\r\nX-Session-ID: s1\r\n"


async def _read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    body = await reader.readexactly(length)
    return head, body


class _Server:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.server: asyncio.AbstractServer | None = None

    async def _on_conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[_Server]]]:
    servers: list[_Server] = []

    async def start(handler: Handler) -> _Server:
        s = _Server(handler)
        s.server = await asyncio.start_server(s._on_conn, "127.0.0.1", 0)
        servers.append(s)
        return s

    yield start
    for s in servers:
        assert s.server is not None
        s.server.close()


async def test_keep_alive_reuses_one_connection(
    serve: Callable[[Handler], Awaitable[_Server]],
) -> None:
    seen: list[bytes] = []

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head, body = await _read_request(reader)
            seen.append(head)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            await writer.drain()

    s = await serve(echo)
    pool = UpstreamPool()
    for i in range(5):
        status, body = await pool.post(s.url + "/pre", "/v1/x", b'{"i":%d}' % i, HDRS, 5)
        assert status == 200 and body == b'{"i":%d}' % i
    assert s.connections == 1
    assert seen[0].startswith(b"POST /pre/v1/x HTTP/1.1\r\n")
    assert b"X-Session-ID: s1\r\n" in seen[0] and b"Host: 127.0.0.1:" in seen[0]
    await pool.close()


async def test_chunked_and_close_delimited_bodies(
    serve: Callable[[Handler], Awaitable[_Server]],
) -> None:
    async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(
            b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
        )
        await writer.drain()
        await _read_request(reader)  # still usable afterwards
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()

    async def until_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b'HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{"a": 1}')
        await writer.drain()

    pool = UpstreamPool()
    s = await serve(chunked)
    assert await pool.post(s.url, "/x", b"{}", HDRS, 5) == (201, b"abcde")
    assert await pool.post(s.url, "/x", b"{}", HDRS, 5) == (200, b"ok")
    assert s.connections == 1
    s2 = await serve(until_close)
    assert await pool.post(s2.url, "/x", b"{}", HDRS, 5) == (200, b'{"a": 1}')
    await pool.close()


async def test_server_closing_idle_connection_is_transparent(
    serve: Callable[[Handler], Awaitable[_Server]],
) -> None:
    async def one_per_connection(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        # then close without saying so (like a keep-alive timeout)

    s = await serve(one_per_connection)
    pool = UpstreamPool()
    for _ in range(3):
        assert await pool.post(s.url, "/x", b"{}", HDRS, 5) == (200, b"ok")
        await asyncio.sleep(0.05)
    assert s.connections == 3
    await pool.close()


async def test_refused_timeout_and_broken(serve: Callable[[Handler], Awaitable[_Server]]) -> None:
    pool = UpstreamPool(connect_timeout=2)
    s = await serve(lambda r, w: asyncio.sleep(0))
    url = s.url
    assert s.server is not None
    s.server.close()
    await s.server.wait_closed()
    with pytest.raises(UpstreamConnectError):
        await pool.post(url, "/x", b"{}", HDRS, 5)

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await asyncio.sleep(2)

    s = await serve(slow)
    with pytest.raises(asyncio.TimeoutError):
        await pool.post(s.url, "/x", b"{}", HDRS, 0.2)

    async def dies(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"partial')
        await writer.drain()

    s = await serve(dies)
    with pytest.raises(UpstreamBrokenError):
        await pool.post(s.url, "/x", b"{}", HDRS, 5)

    async def hangs_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)

    s = await serve(hangs_up)
    with pytest.raises(UpstreamConnectError):
        await pool.post(s.url, "/x", b"{}", HDRS, 5)
    await pool.close()


async def test_connection_limit_queues_requests(
    serve: Callable[[Handler], Awaitable[_Server]],
) -> None:
    async def slowish(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await _read_request(reader)
            await asyncio.sleep(0.01)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()

    s = await serve(slowish)
    pool = UpstreamPool(limit=2)
    got = await asyncio.gather(*(pool.post(s.url, "/x", b"{}", HDRS, 5) for _ in range(10)))
    assert got == [(200, b"ok")] * 10
    assert s.connections == 2
    await pool.close()
