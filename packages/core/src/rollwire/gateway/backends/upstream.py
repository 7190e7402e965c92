"""A small keep-alive HTTP/1.1 client for the gateway's hot path (non-streaming POSTs upstream).

One ``asyncio.Protocol`` per connection with an ``httptools`` response parser, idle connections
kept per host. It does exactly what a forwarded model call needs — send one request with a known
body, get back the status and the whole body — at a fraction of a general client's cost (aiohttp
spends ~4x the CPU per request on features the data plane does not use). Passthrough calls and the
tokens mode's generation requests use it; streams and health checks keep using aiohttp.

Errors, in the gateway's terms:

- :class:`UpstreamConnectError`: the backend could not be reached, or closed the connection before
  answering anything (connection refused/reset, connect timeout). Route around it.
- :class:`UpstreamBrokenError`: the connection died mid-answer (some bytes arrived).
- :class:`asyncio.TimeoutError`: no complete answer within the request's timeout.
"""

from __future__ import annotations

import asyncio
import ssl as _ssl
from collections import deque
from typing import Any
from urllib.parse import urlsplit

import httptools

__all__ = ["UpstreamBrokenError", "UpstreamConnectError", "UpstreamError", "UpstreamPool"]


class UpstreamError(Exception):
    """A failed upstream request."""


class UpstreamConnectError(UpstreamError):
    """The backend could not be reached or hung up before answering."""


class UpstreamBrokenError(UpstreamError):
    """The connection broke while the backend was answering."""


class _Conn(asyncio.Protocol):
    """One HTTP/1.1 connection; one request at a time."""

    __slots__ = (
        "_body",
        "_framed",
        "_fut",
        "_got_bytes",
        "_parser",
        "_status",
        "closed",
        "host",
        "keep_alive",
        "transport",
    )

    def __init__(self, host: _Host) -> None:
        self.host = host
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._fut: asyncio.Future[tuple[int, bytes]] | None = None
        self._body: list[bytes] = []
        self._got_bytes = False
        self._status = 0
        self._framed = False  # content-length or chunked (else the body ends when the peer closes)
        self.closed = False
        self.keep_alive = True

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._fut is None:
            self.close()  # bytes nobody asked for: this connection is out of step
            return
        self._got_bytes = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(UpstreamBrokenError("backend tried to upgrade the connection"))
        except httptools.HttpParserError as exc:
            self._fail(UpstreamBrokenError(f"malformed HTTP response from backend: {exc}"))

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.host.discard(self)
        self.host.connection_closed()
        fut, self._fut = self._fut, None
        if fut is not None and not fut.done():
            if self._status and not self._framed and exc is None:
                # No content-length, not chunked: the body ended when the backend closed.
                body = self._body
                self._body = []
                fut.set_result((self._status, b"".join(body)))
                return
            if self._got_bytes:
                err: UpstreamError = UpstreamBrokenError(
                    f"backend closed the connection mid-answer ({exc or 'EOF'})"
                )
            else:
                err = UpstreamConnectError(
                    f"backend closed the connection before answering ({exc or 'EOF'})"
                )
            fut.set_exception(err)

    # -- httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) in (14, 17):
            lower = name.lower()
            if lower == b"content-length" or lower == b"transfer-encoding":
                self._framed = True

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()
        self.keep_alive = self._parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        fut, self._fut = self._fut, None
        body = self._body
        payload = body[0] if len(body) == 1 else b"".join(body)
        self._body = []
        if fut is not None and not fut.done():
            fut.set_result((self._status, payload))

    # -- use
    def start(self, data: bytes, fut: asyncio.Future[tuple[int, bytes]]) -> None:
        self._fut = fut
        self._got_bytes = False
        self._status = 0
        self._framed = False
        self._body = []
        assert self.transport is not None
        self.transport.write(data)

    def _fail(self, exc: Exception) -> None:
        fut = self._fut
        if fut is not None and not fut.done():
            fut.set_exception(exc)
        self.close()

    def close(self) -> None:
        """Drop the connection (it is never reused)."""
        self.closed = True
        self._fut = None
        self.host.discard(self)
        if self.transport is not None:
            self.transport.abort()


class _Host:
    """Idle keep-alive connections to one ``scheme://host:port``."""

    __slots__ = ("hostname", "idle", "open", "port", "ssl", "waiters")

    def __init__(self, hostname: str, port: int, ssl: _ssl.SSLContext | None) -> None:
        self.hostname = hostname
        self.port = port
        self.ssl = ssl
        self.idle: deque[_Conn] = deque()
        self.open = 0
        self.waiters: deque[asyncio.Future[None]] = deque()

    def discard(self, conn: _Conn) -> None:
        if conn in self.idle:
            self.idle.remove(conn)

    def connection_closed(self) -> None:
        """One of this host's open connections is gone: let a waiting request open another."""
        self.open -= 1
        self.wake_one()

    def wake_one(self) -> None:
        while self.waiters:
            w = self.waiters.popleft()
            if not w.done():
                w.set_result(None)
                return


class UpstreamPool:
    """Keep-alive connection pools per backend origin, at most ``limit`` connections each."""

    def __init__(self, *, limit: int = 1024, connect_timeout: float = 10.0) -> None:
        self.limit = max(1, limit)
        self.connect_timeout = connect_timeout
        self._hosts: dict[str, tuple[_Host, str, bytes]] = {}
        self._ssl: _ssl.SSLContext | None = None
        self._closed = False

    def _origin(self, base: str) -> tuple[_Host, str, bytes]:
        got = self._hosts.get(base)
        if got is not None:
            return got
        u = urlsplit(base)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise UpstreamConnectError(f"unsupported backend URL {base!r}")
        https = u.scheme == "https"
        port = u.port or (443 if https else 80)
        ssl_ctx = None
        if https:
            if self._ssl is None:
                self._ssl = _ssl.create_default_context()
            ssl_ctx = self._ssl
        default_port = (https and port == 443) or (not https and port == 80)
        host_header = u.hostname if default_port else f"{u.hostname}:{port}"
        if ":" in u.hostname and not default_port:  # IPv6 literal
            host_header = f"[{u.hostname}]:{port}"
        got = (_Host(u.hostname, port, ssl_ctx), u.path.rstrip("/"), host_header.encode("ascii"))
        self._hosts[base] = got
        return got

    @staticmethod
    def _take_idle(host: _Host) -> _Conn | None:
        while host.idle:
            conn = host.idle.pop()  # most recently used: least likely to have timed out
            tr = conn.transport
            if not conn.closed and tr is not None and not tr.is_closing():
                return conn
        return None

    async def _connect(self, host: _Host) -> tuple[_Conn, bool]:
        """An idle connection (reused: True) or a new one, waiting while ``limit`` are open."""
        while True:
            conn = self._take_idle(host)
            if conn is not None:
                return conn, True
            if host.open < self.limit:
                break
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            host.waiters.append(waiter)
            await waiter
        host.open += 1  # from here on connection_lost gives it back
        loop = asyncio.get_running_loop()
        try:
            _, proto = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Conn(host),
                    host.hostname,
                    host.port,
                    ssl=host.ssl,
                    server_hostname=host.hostname if host.ssl is not None else None,
                ),
                self.connect_timeout,
            )
        except asyncio.TimeoutError as exc:
            host.connection_closed()
            raise UpstreamConnectError(
                f"connect to {host.hostname}:{host.port} timed out after {self.connect_timeout}s"
            ) from exc
        except OSError as exc:
            host.connection_closed()
            raise UpstreamConnectError(
                f"cannot connect to {host.hostname}:{host.port}: {exc}"
            ) from exc
        except BaseException:
            host.connection_closed()
            raise
        return proto, False

    def _release(self, host: _Host, conn: _Conn, reusable: bool) -> None:
        if reusable and not self._closed and not conn.closed and conn.keep_alive:
            host.idle.append(conn)
            host.wake_one()
        elif not conn.closed:
            conn.close()  # connection_lost gives its slot back

    async def post(
        self, base: str, path: str, body: bytes, headers: bytes, timeout: float | None
    ) -> tuple[int, bytes]:
        """POST ``body`` to ``base + path``; ``(status, body)``.

        ``headers``: extra header lines, each ending in CRLF (no Host or Content-Length).
        """
        host, prefix, host_header = self._origin(base)
        head = (
            b"POST "
            + (prefix + path).encode("latin-1")
            + b" HTTP/1.1\r\nHost: "
            + host_header
            + b"\r\n"
            + headers
            + b"Content-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
        )
        data = head + body
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        for attempt in range(2):
            idle = self._take_idle(host)
            if idle is not None:
                conn, reused = idle, True
            elif deadline is None:
                conn, reused = await self._connect(host)
            else:
                left = deadline - loop.time()
                if left <= 0:
                    raise asyncio.TimeoutError
                conn, reused = await asyncio.wait_for(self._connect(host), left)
            fut: asyncio.Future[tuple[int, bytes]] = loop.create_future()
            timer = None
            if deadline is not None:
                timer = loop.call_at(deadline, _expire, fut)
            ok = False
            try:
                conn.start(data, fut)
                result = await fut
                ok = True
                return result
            except UpstreamConnectError:
                if reused and attempt == 0:
                    continue  # a kept-alive connection the server had just closed: once more
                raise
            finally:
                if timer is not None:
                    timer.cancel()
                self._release(host, conn, ok)
        raise AssertionError("unreachable")  # pragma: no cover

    async def close(self) -> None:
        """Close every idle connection (in-flight ones close when they finish)."""
        self._closed = True
        for host, _, _ in self._hosts.values():
            while host.idle:
                host.idle.pop().close()
            for w in host.waiters:
                if not w.done():
                    w.cancel()


def _expire(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_exception(asyncio.TimeoutError())
