"""Bare ASGI pieces of the data plane: a two-message response, header lookup, body reading.

The data plane is dispatched by hand, without a router or header objects on the hot path.

Under uvicorn's httptools protocol (how the gateway CLI serves) a complete response is written
to the connection in one piece: uvicorn's ``send`` writes the head and the body separately, two
socket writes (two trips through the loopback TCP stack) and two ASGI messages per call. The
bytes are the ones uvicorn writes, and its request cycle ends in the same state.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE as _STATUS_LINE
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle as _HttpToolsCycle

from rollwire.gateway.errors import GatewayError

__all__ = [
    "CHAT_PATH",
    "COMPLETIONS_PATH",
    "MODELS_PATH",
    "ASGIResponse",
    "RawResponse",
    "bearer",
    "header",
    "lifespan",
    "read_body",
]

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
MODELS_PATH = "/v1/models"

ASGIResponse = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


class RawResponse:
    """A complete response body: two ASGI messages, or one write under uvicorn's httptools
    protocol (no header objects on the hot path)."""

    __slots__ = ("body", "content_type", "status")

    def __init__(self, body: bytes, status: int = 200, content_type: bytes = b"application/json"):
        self.body = body
        self.status = status
        self.content_type = content_type

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        cycle = getattr(send, "__self__", None)
        if type(cycle) is _HttpToolsCycle and self._write_whole(cycle):
            return
        await send(
            {
                "type": "http.response.start",
                "status": self.status,
                "headers": [
                    (b"content-type", self.content_type),
                    (b"content-length", str(len(self.body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": self.body})

    def _write_whole(self, cycle: Any) -> bool:
        """Write head and body in one piece and end uvicorn's request cycle as its ``send``
        would; False (nothing done) where ``send`` must run: a response begun already, a
        HEAD request, a gone or paused connection."""
        if (
            cycle.response_started
            or cycle.disconnected
            or cycle.flow.write_paused
            or cycle.scope["method"] == "HEAD"
        ):
            return False
        cycle.response_started = True
        cycle.waiting_for_100_continue = False
        body = self.body
        parts = [_STATUS_LINE[self.status]]
        for name, value in cycle.default_headers:  # server, date: as uvicorn sends them
            parts += (name, b": ", value, b"\r\n")
        parts += (b"content-type: ", self.content_type, b"\r\ncontent-length: ")
        parts += (str(len(body)).encode(), b"\r\n")
        if not cycle.keep_alive:
            parts.append(b"connection: close\r\n")
        parts.append(b"\r\n")
        if len(body) <= _JOIN_LIMIT:
            parts.append(body)
            cycle.transport.write(b"".join(parts))
        else:  # not copied to join it: the copy grows with the body, the write saved does not
            cycle.transport.write(b"".join(parts))
            cycle.transport.write(body)
        cycle.response_complete = True
        cycle.message_event.set()
        if not cycle.keep_alive:
            cycle.transport.close()
        cycle.on_response()
        return True


#: Bodies up to this size are joined to their head for the one write.
_JOIN_LIMIT = 256 * 1024


def bearer(value: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value."""
    if value and value[:7].lower() == "bearer ":
        return value[7:].strip()
    return None


def header(scope: dict[str, Any], name: bytes) -> str | None:
    """The first value of header ``name`` (lower-case bytes) in an ASGI scope."""
    for k, v in scope["headers"]:
        if k == name:
            return str(v.decode("latin-1"))
    return None


async def read_body(scope: dict[str, Any], receive: Any, limit: int) -> bytes:
    """The whole request body; 413 past ``limit`` bytes, 400 when the client went away."""
    length = header(scope, b"content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise GatewayError(
            413,
            f"request body of {length} bytes exceeds the gateway limit of {limit} bytes",
            "invalid_request_error",
            "request_too_large",
        )
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise GatewayError(400, "client disconnected", "invalid_request_error", "disconnected")
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise GatewayError(
                    413,
                    f"request body exceeds the gateway limit of {limit} bytes",
                    "invalid_request_error",
                    "request_too_large",
                )
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def lifespan(
    receive: Any,
    send: Any,
    startup: Callable[[], Awaitable[None]],
    shutdown: Callable[[], Awaitable[None]],
) -> None:
    """Serve the ASGI lifespan protocol with ``startup`` and ``shutdown``."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            try:
                await startup()
            except Exception as exc:
                await send({"type": "lifespan.startup.failed", "message": str(exc)})
                return
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await shutdown()
            await send({"type": "lifespan.shutdown.complete"})
            return
