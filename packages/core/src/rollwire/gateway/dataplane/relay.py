"""The stream relay: SSE from the backend to the agent, captured on the way, committed at the end.

The call is committed when the backend's ``[DONE]`` arrives (before ``[DONE]`` is relayed), or at
the end of a stream that finished without it; a stream that broke off, carried an error event or
lost its agent is still recorded, as a failed call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
from starlette.responses import StreamingResponse

from rollwire.data.protocol import ModelCall
from rollwire.gateway.asgi import ASGIResponse, RawResponse
from rollwire.gateway.backends.pool import Backend
from rollwire.gateway.dataplane.capture import Asked, StreamAccumulator, strip_chunk
from rollwire.gateway.dataplane.dispatch import (
    LOGPROBS_MODE,
    Commit,
    fail_call,
    fill_call,
    forward,
    open_stream,
    upstream_refused,
)
from rollwire.gateway.dataplane.sessions import SessionState
from rollwire.gateway.errors import GatewayError, error_body
from rollwire.gateway.ports import GatewayPort
from rollwire.gateway.tokens.response import iterate, sse_chunks

__all__ = ["StreamRelay", "forward_stream", "restream"]

log = logging.getLogger("rollwire.gateway")

_DONE = b"data: [DONE]\n\n"


async def forward_stream(
    gw: GatewayPort,
    st: SessionState,
    call: ModelCall,
    fwd: dict[str, Any],
    asked: Asked,
    chat: bool,
    path: str,
    headers: dict[str, str],
    t0: float,
    commit: Commit,
) -> ASGIResponse:
    """Open the backend's stream and answer the agent with its relay (or the failure)."""
    try:
        backend, resp = await open_stream(gw, st, path, fwd, headers)
    except GatewayError as exc:
        return await fail_call(gw, call, commit, exc.status, exc.message, exc.code or "", t0)
    except asyncio.TimeoutError:
        message = "inference backend timed out"
        return await fail_call(gw, call, commit, 504, message, "upstream_timeout", t0)
    call.backend = backend.name
    call.logprobs_mode = LOGPROBS_MODE.get(backend.kind)  # type: ignore[assignment]
    if resp.status != 200:
        try:
            payload = await resp.read()
        finally:
            resp.release()
            backend.in_flight -= 1
        return await upstream_refused(gw, call, commit, resp.status, payload, t0)
    if resp.content_type != "text/event-stream":
        # Not a stream at all (a proxy's JSON or HTML page): say so, never an empty 200 stream.
        try:
            head = (await resp.content.read(300)).decode("utf-8", "replace")
        finally:
            resp.release()
            backend.in_flight -= 1
        message = (
            f"inference backend {backend.name} answered a stream request with "
            f"{resp.content_type or 'no content type'}, not text/event-stream: {head!r}"
        )
        return await fail_call(gw, call, commit, 502, message, "upstream_not_sse", t0)
    relay = StreamRelay(gw, call, resp, backend, asked, chat, t0, commit)
    return StreamingResponse(
        relay.run(), media_type="text/event-stream", headers={"cache-control": "no-cache"}
    )


async def restream(
    gw: GatewayPort,
    st: SessionState,
    call: ModelCall,
    fwd: dict[str, Any],
    asked: Asked,
    body: dict[str, Any],
    path: str,
    t0: float,
    commit: Commit,
) -> ASGIResponse:
    """A streamed call asked of the backend non-streamed, then streamed to the agent.

    vLLM and SGLang return routed experts only on a whole response, never on stream chunks, so a
    session that wants routing gets it this way (as tokens mode streams a finished generation):
    the call is captured and committed like any non-streamed one, and the agent still sees a
    ``chat.completion.chunk`` stream of the same message. A refusal or failure is answered as
    the non-streamed path answers it.
    """
    once = {k: v for k, v in fwd.items() if k not in ("stream", "stream_options")}
    answer = await forward(gw, st, call, once, asked, path, st.upstream_headers, t0, commit)
    if not isinstance(answer, RawResponse) or answer.status != 200:
        return answer
    opts = body.get("stream_options")
    usage = bool(isinstance(opts, dict) and opts.get("include_usage"))
    chunks = sse_chunks(_chunkable(orjson.loads(answer.body)), usage)
    return StreamingResponse(
        iterate(chunks), media_type="text/event-stream", headers={"cache-control": "no-cache"}
    )


def _chunkable(data: dict[str, Any]) -> dict[str, Any]:
    """A backend's ``chat.completion`` with what :func:`sse_chunks` reads always present."""
    out = dict(data)
    out.setdefault("id", f"chatcmpl-{int(time.time() * 1e6):x}")
    out.setdefault("created", int(time.time()))
    out.setdefault("model", "")
    out.setdefault("usage", None)
    choice = dict((out.get("choices") or [{}])[0])
    message = dict(choice.get("message") or {})
    if not message.get("reasoning") and message.get("reasoning_content"):
        message["reasoning"] = message["reasoning_content"]
    choice["message"] = message
    choice.setdefault("finish_reason", None)
    out["choices"] = [choice]
    return out


class StreamRelay:
    """One streamed call on its way from the backend to the agent."""

    def __init__(
        self,
        gw: GatewayPort,
        call: ModelCall,
        resp: aiohttp.ClientResponse,
        backend: Backend,
        asked: Asked,
        chat: bool,
        t0: float,
        commit: Commit,
    ) -> None:
        self.gw, self.call, self.resp, self.backend = gw, call, resp, backend
        self.asked, self.chat, self.t0, self._commit = asked, chat, t0, commit
        self.acc = StreamAccumulator()
        self.committed = False
        self.error: str | None = None

    def _add_error(self, reason: str) -> None:
        self.error = f"{self.error}; {reason}" if self.error else reason

    async def finish(self, ok: bool) -> bytes | None:
        """Commit the call. None when it landed as it was; else the SSE event(s) to end the
        stream with: an error event (the call was refused, or the backend's stream could not
        be read), then ``[DONE]`` where the stream may still go on."""
        call = self.call
        tail: bytes | None = None
        try:
            fill_call(self.gw, call, self.acc.captured(), self.backend)
            call.response = self.acc.response(self.chat)
        except Exception as exc:  # malformed ids, log-probs, ... from the backend
            log.warning("could not read the stream of call %s: %r", call.call_id, exc)
            reason = f"inference backend sent a malformed stream: {type(exc).__name__}: {exc}"
            self._add_error(reason)
            ok = False
            call.response = {}
            tail = b"data: " + error_body(reason, "server_error", "bad_gateway") + b"\n\n" + _DONE
        call.latency_ms = (time.perf_counter() - self.t0) * 1000.0
        if not ok:
            call.status = "failed"
            call.trainable = False
            call.error = self.error or "stream ended before [DONE]"
        try:
            await self._commit(call)
        except GatewayError as exc:  # the session was closed or deleted meanwhile: final
            self.committed = True
            return b"data: " + error_body(exc.message, exc.type, exc.code) + b"\n\n"
        self.committed = True
        self.gw.metrics.latency.observe(time.perf_counter() - self.t0)
        return tail

    async def _finish_late(self) -> None:
        with contextlib.suppress(Exception):
            await self.finish(False)

    async def _on_data(self, payload: bytes) -> tuple[list[bytes], bool]:
        """What one ``data:`` payload sends on to the agent, and whether the relay ends."""
        if payload == b"[DONE]":
            if self.committed:
                return [], False
            # A stream that carried an error event is not a good call.
            refused = await self.finish(self.error is None)
            if refused is not None:
                return [refused], True
            return [_DONE], False
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return [], False
        if not isinstance(chunk, dict):
            return [], False
        if "error" in chunk and "choices" not in chunk:
            self.error = f"backend stream error: {chunk['error']}"
            return [b"data: " + payload + b"\n\n"], False
        self.acc.add(chunk)
        if self.asked.everything:
            return [b"data: " + payload + b"\n\n"], False
        if strip_chunk(chunk, self.asked):
            return [b"data: " + orjson.dumps(chunk) + b"\n\n"], False
        return [], False

    async def _relay(self) -> AsyncIterator[bytes]:
        buf = b""
        async for data in self.resp.content.iter_any():
            buf += data
            while True:
                end = buf.find(b"\n\n")
                if end < 0:
                    break
                event, buf = buf[:end], buf[end + 2 :]
                for line in event.split(b"\n"):
                    line = line.rstrip(b"\r")
                    if not line.startswith(b"data:"):
                        continue
                    out, stop = await self._on_data(line[5:].strip())
                    for piece in out:
                        yield piece
                    if stop:
                        return
        if not self.committed:
            # A server that ends without [DONE] after a finish reason is still a good call.
            refused = await self.finish(self.acc.finish_reason is not None and self.error is None)
            if refused is not None:
                yield refused

    async def run(self) -> AsyncIterator[bytes]:
        """The SSE bytes for the agent; the call is recorded whatever happens."""
        try:
            async for piece in self._relay():
                yield piece
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            self.error = f"inference backend stream failed: {exc!r}"
            if not self.committed:
                await self.finish(False)
            yield b"data: " + error_body(self.error, "server_error", "bad_gateway") + b"\n\n"
        except Exception as exc:
            # Anything else (a chunk of the wrong shape): record the call, tell the agent.
            log.warning("relaying the stream of call %s failed: %r", self.call.call_id, exc)
            told = "internal gateway error while relaying the stream; the call is recorded failed"
            # Recorded with the call in full; the agent is told no internals.
            self._add_error(f"{told}: {type(exc).__name__}: {exc}")
            if not self.committed:
                await self.finish(False)
            yield b"data: " + error_body(told, "server_error", "internal_error") + b"\n\n" + _DONE
        finally:
            self.resp.release()
            self.backend.in_flight -= 1
            if not self.committed:
                # The agent went away mid-stream (or the commit failed): still record the
                # (failed) attempt.
                self.error = self.error or "client disconnected during the stream"
                self.gw.spawn(self._finish_late())
