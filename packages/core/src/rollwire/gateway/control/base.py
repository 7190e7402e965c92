"""What every control-plane route shares: JSON bodies and answers, admin auth, session lookup."""

from __future__ import annotations

import hmac
import math
import time
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from rollwire.gateway.errors import GatewayError
from rollwire.gateway.ports import GatewayPort
from rollwire.store import SessionRecord

__all__ = ["ControlRoutes"]


def json_response(data: Any, status: int = 200) -> Response:
    return Response(
        orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY),
        status_code=status,
        media_type="application/json",
    )


def too_large(limit: int) -> GatewayError:
    return GatewayError(
        413,
        f"request body exceeds the gateway limit of {limit} bytes",
        "invalid_request_error",
        "request_too_large",
    )


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw:
        return {}
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise GatewayError(400, f"request body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise GatewayError(400, "request body must be a JSON object")
    return data


def positive_int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if type(value) is not int or value < 1:
        raise GatewayError(
            400, f"{key} must be a positive integer, got {value!r}", code="invalid_field"
        )
    return value


def positive_seconds(value: Any, key: str) -> float:
    if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:
        raise GatewayError(
            400, f"{key} must be a positive number of seconds, got {value!r}", code="invalid_field"
        )
    return float(value)


def query_number(request: Request, key: str, default: float) -> float:
    raw = request.query_params.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise GatewayError(
            400, f"{key} must be a non-negative number, got {raw!r}", code="invalid_query"
        )
    return value


MAX_ID = 200  # characters of a session id (it is part of URLs)
MAX_LABEL = 1024  # characters of a group or task id
MAX_METADATA = 64 * 1024  # bytes of a session's metadata, as JSON
MAX_METRICS = 256  # metrics of one completion
MAX_METRIC_KEY = 128  # characters of a metric name
MAX_ERROR = 16 * 1024  # characters of an error text kept (longer ones are cut in the middle)
_ID_FORBIDDEN = frozenset('/\\?#%"<>|*') | frozenset(" \t\r\n")


def check_session_id(value: str) -> str:
    """A session id usable in every URL and header (400 otherwise): 1 to ``MAX_ID``
    characters, printable, none of ``/ \\ ? # % " < > | *`` or spaces, no ``..``."""
    if not value or len(value) > MAX_ID:
        raise GatewayError(
            400,
            f"session_id must be 1 to {MAX_ID} characters, got {len(value)}",
            code="invalid_session_id",
        )
    bad = sorted({c for c in value if c in _ID_FORBIDDEN or not c.isprintable()})
    if bad or ".." in value:
        what = f"characters {bad!r}" if bad else "'..'"
        raise GatewayError(
            400,
            f"session_id {value[:80]!r} contains {what}: use letters, digits and '-_.:@+=~'",
            code="invalid_session_id",
        )
    return value


def json_number(value: Any, what: str) -> float:
    """A JSON number that is finite (400 for strings, booleans, NaN, infinities)."""
    if type(value) not in (int, float) or not math.isfinite(value):
        raise GatewayError(400, f"{what} must be a finite JSON number, got {value!r}")
    return float(value)


def cut_text(text: str, limit: int = MAX_ERROR) -> str:
    """``text`` cut to about ``limit`` characters, keeping its start and its end."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n... [{len(text) - 2 * half} characters cut] ...\n{text[-half:]}"


def same_key(given: str, key: str) -> bool:
    """Constant-time comparison of a presented key with the admin key."""
    return hmac.compare_digest(given.encode("utf-8"), key.encode("utf-8"))


def finite(value: Any, what: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError) as exc:
        raise GatewayError(400, f"{what} must be a number, got {value!r}") from exc
    if type(value) is bool or not math.isfinite(number):
        raise GatewayError(400, f"{what} must be a finite number, got {value!r}")
    return number


class ControlRoutes:
    """Base of the control plane's route groups: the gateway and the helpers they share."""

    def __init__(self, gw: GatewayPort) -> None:
        self.gw = gw

    def require_admin(self, request: Request) -> None:
        if self.gw.admin_key is None:
            return  # open mode without an admin key: local development
        auth = request.headers.get("authorization", "")
        if auth[:7].lower() == "bearer " and same_key(auth[7:].strip(), self.gw.admin_key):
            return
        self.gw.metrics.error("unauthorized_admin")
        raise GatewayError(
            401,
            "the control plane needs 'Authorization: Bearer <admin key>'",
            "authentication_error",
            "invalid_admin_key",
        )

    async def load(self, session_id: str) -> SessionRecord:
        rec = await self.gw.store.get_session(session_id)
        if rec is None:
            raise GatewayError(
                404,
                f"session {session_id!r} not found",
                "invalid_request_error",
                "session_not_found",
            )
        if not rec.terminal and rec.expires_at is not None and rec.expires_at < time.time():
            rec = await self.gw.expire(rec)  # past its TTL: it becomes ``timeout`` when looked at
        return rec

    async def body_of(self, request: Request) -> dict[str, Any]:
        return await read_json(request, self.gw.config.max_body_bytes)

    def public_url(self, request: Request) -> str:
        if self.gw.config.public_url:
            return self.gw.config.public_url.rstrip("/")
        return str(request.base_url).rstrip("/")
