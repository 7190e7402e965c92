"""What the gateway keeps in memory about a live session, and how retries are matched."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from rollwire.store import SessionRecord
from rollwire.store.codec import request_key

__all__ = ["Attempt", "SessionState"]

_MAX_ATTEMPT_HASHES = 8
_UPSTREAM_HEADERS = b"Content-Type: application/json\r\nX-Session-ID: "


class Attempt:
    """One request of a session, registered when it starts, so an agent-side retry is matched
    with its original even while the original is still running."""

    __slots__ = ("call_id", "committed", "key", "prior", "retry_count", "superseded_by")

    def __init__(self, retry_count: int, prior: Attempt | None, key: str | None = None) -> None:
        self.retry_count = retry_count
        # Digest of the raw body: the store matches retries by it across restarts and gateways.
        self.key = key
        self.prior = prior  # the attempt this one retries (same body, retry header > 0)
        self.call_id: str | None = None
        self.committed = False
        self.superseded_by: str | None = None  # a retry of this one succeeded before it landed


class SessionState:
    """What the gateway keeps in memory about a live session."""

    __slots__ = (
        "attempts",
        "header_id",
        "in_flight",
        "record",
        "shared_backend",
        "state",
        "upstream_headers",
    )

    def __init__(self, record: SessionRecord) -> None:
        self.record = record
        self.state: dict[str, Any] = {}
        self.in_flight = 0
        self.attempts: OrderedDict[str, Attempt] = OrderedDict()  # request key -> attempt
        # The session's sticky backend as the store has it (shared by every gateway).
        self.shared_backend: str | None = None
        sid = record.session_id.encode("utf-8")
        if any(c < 0x20 or c == 0x7F for c in sid):
            sid = b""  # never put control characters (CR/LF) into a header line
        self.header_id = sid.decode("utf-8")
        # The header lines every forwarded call of this session carries (prefix-cache affinity).
        self.upstream_headers = _UPSTREAM_HEADERS + sid + b"\r\n"

    def register_attempt(self, raw: bytes, retry_count: int) -> Attempt:
        """Register a request (by the digest of its raw body) now, not at commit: a retry that
        lands before its original is still matched with it. The store matches retries whose
        original this process never saw (it ran elsewhere, or before a restart)."""
        raw_hash = request_key(raw)
        attempts = self.attempts
        prior = attempts.get(raw_hash) if retry_count > 0 else None
        attempt = Attempt(retry_count, prior, raw_hash)
        attempts[raw_hash] = attempt
        attempts.move_to_end(raw_hash)
        if len(attempts) > _MAX_ATTEMPT_HASHES:
            attempts.popitem(last=False)
        return attempt
