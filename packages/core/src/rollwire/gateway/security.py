"""Session tokens: ``<session_id>.<expiry>.<hmac>``, url-safe, signed with the gateway secret.

A token names exactly one session and cannot be forged without the secret; it expires.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time

__all__ = ["TokenError", "TokenSigner", "new_secret"]


class TokenError(ValueError):
    """A token that is malformed, forged or expired (the message says which)."""


def new_secret() -> str:
    """A fresh random secret (url-safe text)."""
    return secrets.token_urlsafe(32)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class TokenSigner:
    """Issues and verifies session tokens (HMAC-SHA256 over session id and expiry)."""

    def __init__(self, secret: str | bytes) -> None:
        self._key = secret.encode() if isinstance(secret, str) else secret
        self._verified: dict[str, tuple[str, float]] = {}

    def _mac(self, payload: str) -> str:
        return _b64(hmac.new(self._key, payload.encode(), hashlib.sha256).digest())

    def issue(self, session_id: str, expires_at: float) -> str:
        """A token for ``session_id`` valid until ``expires_at`` (unix seconds)."""
        payload = f"{_b64(session_id.encode())}.{int(expires_at)}"
        return f"{payload}.{self._mac(payload)}"

    def verify(self, token: str, now: float | None = None) -> str:
        """The session id of a valid token; :class:`TokenError` otherwise."""
        now = time.time() if now is None else now
        hit = self._verified.get(token)
        if hit is not None:
            if hit[1] < now:
                raise TokenError("session token expired")
            return hit[0]
        parts = token.split(".")
        if len(parts) != 3:
            raise TokenError("malformed session token")
        payload = f"{parts[0]}.{parts[1]}"
        if not hmac.compare_digest(self._mac(payload), parts[2]):
            raise TokenError("invalid session token (bad signature)")
        try:
            session_id = _unb64(parts[0]).decode()
            expires = float(parts[1])
        except (ValueError, UnicodeDecodeError) as exc:
            raise TokenError("malformed session token") from exc
        if expires < now:
            raise TokenError("session token expired")
        if len(self._verified) > 100_000:
            self._verified.clear()
        self._verified[token] = (session_id, expires)
        return session_id
