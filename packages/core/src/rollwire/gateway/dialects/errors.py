"""The one error a dialect converter raises: a request the gateway cannot serve faithfully."""

from __future__ import annotations

__all__ = ["DialectError"]


class DialectError(ValueError):
    """A request (or response) a dialect converter refuses, with the HTTP status to answer.

    ``param`` names the offending field (``"input[3].type"``) so the client's error says where.
    """

    def __init__(self, message: str, *, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
