"""HTTP plumbing shared by the engine's route modules: errors in the OpenAI shape, JSON and SSE
responses, request bodies, and the endpoint wrapper that turns errors into responses."""

from __future__ import annotations

import base64
import io
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Send

if TYPE_CHECKING:
    from .runtime import Engine

logger = logging.getLogger("rollwire.engine.server")

#: A route handler of the engine: ``async fn(engine, request) -> Response``.
Handler = Callable[["Engine", Request], Awaitable[Response]]


class _HTTPError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.headers = headers or {}


_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    429: "RateLimitError",
    500: "InternalServerError",
}


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def _error(
    status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None
) -> Response:
    body = {
        "error": {
            "message": message,
            "type": _ERROR_TYPES.get(status, "Error"),
            "param": param,
            "code": status,
        }
    }
    return _json(body, status, headers)


class _CutStream(Exception):
    """Raised by a stream body to drop the connection mid-body (the truncated-stream fault)."""


class _SSEResponse(StreamingResponse):
    """A streaming response that can end without its final chunk: on :class:`_CutStream` it stops
    sending, the server closes the connection, and the client sees an incomplete chunked body,
    as when a real server dies mid-stream."""

    async def stream_response(self, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        try:
            async for chunk in self.body_iterator:
                data = (
                    chunk if isinstance(chunk, bytes | memoryview) else chunk.encode(self.charset)
                )
                await send({"type": "http.response.body", "body": data, "more_body": True})
        except _CutStream:
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _sse(data: Any) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


def _npy_b64(arr: np.ndarray) -> str:
    buf = io.BytesIO()
    np.save(buf, arr.astype(np.int32), allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode()


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        data = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError as exc:
        raise _HTTPError(400, f"request body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise _HTTPError(400, f"request body must be a JSON object, got {type(data).__name__}")
    return data


def _session_id(request: Request, body: dict[str, Any]) -> str | None:
    sid = request.headers.get("x-session-id") or body.get("session_id")
    return None if sid is None else str(sid)


def endpoint(engine: Engine, fn: Handler) -> Callable[[Request], Awaitable[Response]]:
    """A Starlette endpoint running ``fn(engine, request)``; ``_HTTPError`` becomes its OpenAI-
    shaped response, anything else a logged 500 in the same shape."""

    async def wrapped(request: Request) -> Response:
        try:
            return await fn(engine, request)
        except _HTTPError as exc:
            return _error(exc.status, exc.message, exc.param, exc.headers)
        except Exception as exc:  # a bug: say so in the OpenAI shape, and log it
            logger.exception("engine: %s %s failed", request.method, request.url.path)
            return _error(500, f"internal error: {type(exc).__name__}: {exc}")

    return wrapped


def _strip_ids(obj: dict[str, Any]) -> None:
    obj.pop("prompt_token_ids", None)
    for ch in obj.get("choices") or []:
        ch.pop("token_ids", None)
        ch.pop("prompt_token_ids", None)
        ch.pop("response_token_ids", None)
