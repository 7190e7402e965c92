"""Session tokens: ``<session_id>.<expiry>.<incarnation>.<hmac>``, url-safe, signed with the
gateway secret.

A token names exactly one session -- one incarnation of its id: a session deleted and created
again under the same id does not take the old tokens -- and cannot be forged without the secret;
it expires. Tokens of the older ``<session_id>.<expiry>.<hmac>`` form carry no incarnation.
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
        self._verified: dict[str, tuple[str, float, str | None]] = {}

    def _mac(self, payload: str) -> str:
        return _b64(hmac.new(self._key, payload.encode(), hashlib.sha256).digest())

    def issue(self, session_id: str, expires_at: float, incarnation: str | None = None) -> str:
        """A token for ``session_id`` (that ``incarnation`` of it, when given) valid until
        ``expires_at`` (unix seconds)."""
        payload = f"{_b64(session_id.encode())}.{int(expires_at)}"
        if incarnation is not None:
            payload += f".{_b64(incarnation.encode())}"
        return f"{payload}.{self._mac(payload)}"

    def verify(self, token: str, now: float | None = None) -> str:
        """The session id of a valid token; :class:`TokenError` otherwise."""
        return self.verify_full(token, now)[0]

    def verify_full(self, token: str, now: float | None = None) -> tuple[str, str | None]:
        """``(session id, incarnation or None)`` of a valid token; :class:`TokenError`
        otherwise."""
        now = time.time() if now is None else now
        hit = self._verified.get(token)
        if hit is not None:
            if hit[1] < now:
                raise TokenError("session token expired")
            return hit[0], hit[2]
        parts = token.split(".")
        if len(parts) not in (3, 4):
            raise TokenError("malformed session token")
        payload = ".".join(parts[:-1])
        if not hmac.compare_digest(self._mac(payload), parts[-1]):
            raise TokenError("invalid session token (bad signature)")
        try:
            session_id = _unb64(parts[0]).decode()
            expires = float(parts[1])
            incarnation = _unb64(parts[2]).decode() if len(parts) == 4 else None
        except (ValueError, UnicodeDecodeError) as exc:
            raise TokenError("malformed session token") from exc
        if expires < now:
            raise TokenError("session token expired")
        if len(self._verified) > 100_000:
            self._verified.clear()
        self._verified[token] = (session_id, expires, incarnation)
        return session_id, incarnation
