"""OpenAI-shaped error bodies: every refusal the gateway sends looks like an OpenAI API error."""

from __future__ import annotations

import orjson
from starlette.responses import Response

__all__ = ["GatewayError", "error_body", "error_response"]


def error_body(message: str, type: str = "invalid_request_error", code: str | None = None) -> bytes:
    """``{"error": {"message", "type", "code", "param": null}}`` as JSON bytes."""
    return orjson.dumps({"error": {"message": message, "type": type, "code": code, "param": None}})


def error_response(
    status: int,
    message: str,
    type: str = "invalid_request_error",
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    """A Starlette response carrying an OpenAI-shaped error."""
    return Response(
        error_body(message, type, code),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


class GatewayError(Exception):
    """Raised inside handlers; turned into an OpenAI-shaped error response."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code

    def response(self) -> Response:
        """This error as a response."""
        return error_response(self.status, self.message, self.type, self.code)
