"""OpenAI-shaped error bodies: every refusal the gateway sends looks like an OpenAI API error."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

__all__ = ["GatewayError", "error_body", "error_response", "upstream_error_body"]


def error_body(
    message: str,
    type: str = "invalid_request_error",
    code: str | None = None,
    details: dict[str, Any] | None = None,
) -> bytes:
    """``{"error": {"message", "type", "code", "param": null}}`` as JSON bytes (with
    ``"details"``, what a program may read of the error, when there are any)."""
    error: dict[str, Any] = {"message": message, "type": type, "code": code, "param": None}
    if details is not None:
        error["details"] = details
    return orjson.dumps({"error": error})


def upstream_error_body(status: int, payload: bytes, limit: int = 500) -> bytes:
    """What the agent gets for a backend's non-200 answer ``payload``: the backend's body when it
    already is an OpenAI-shaped error (``{"error": {...}}``), else the gateway's error body
    quoting (the start of) what the backend said, so the agent's SDK can read it either way."""
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        return payload
    if isinstance(data, dict) and isinstance(data.get("message"), str):
        said = data["message"]  # vLLM / SGLang's flat {"object": "error", "message": ...}
    else:
        said = payload.decode("utf-8", errors="replace")
    said = said.strip()
    if len(said) > limit:
        said = said[:limit] + "..."
    return error_body(
        f"inference backend answered {status}: {said or '(empty body)'}",
        "server_error" if status >= 500 else "invalid_request_error",
        "upstream_error",
    )


def error_response(
    status: int,
    message: str,
    type: str = "invalid_request_error",
    code: str | None = None,
    headers: dict[str, str] | None = None,
    details: dict[str, Any] | None = None,
) -> Response:
    """A Starlette response carrying an OpenAI-shaped error."""
    return Response(
        error_body(message, type, code, details),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


class GatewayError(Exception):
    """Raised inside handlers; turned into an OpenAI-shaped error response (``details``: what a
    program may read of it, beside the message for people)."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        code: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.details = details

    def response(self) -> Response:
        """This error as a response."""
        return error_response(self.status, self.message, self.type, self.code, details=self.details)
