"""The gateway's live sessions: tokens checked, state loaded from the store on first use, kept in
a bounded LRU, expired past their TTL and dropped once terminal."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from rollwire.gateway.backends.pool import BackendPool
from rollwire.gateway.config import GatewayConfig
from rollwire.gateway.dataplane.answer import MEMOS
from rollwire.gateway.dataplane.sessions import SessionState
from rollwire.gateway.errors import GatewayError
from rollwire.gateway.metrics import GatewayMetrics
from rollwire.gateway.security import TokenError, TokenSigner
from rollwire.store import SessionNotFound, SessionRecord, Store

__all__ = ["LiveSessions"]

_NO_TOKEN = (
    "missing session token: use base_url {gateway}/s/<token>/v1 or "
    "'Authorization: Bearer <token>' on /v1"
)
_MAX_CACHED_SESSIONS = 65_536  # live sessions kept in memory; idle ones past it are evicted


class LiveSessions:
    """The session half of :class:`~rollwire.gateway.app.Gateway` (a mixin: it sets the fields)."""

    config: GatewayConfig
    store: Store
    signer: TokenSigner
    pool: BackendPool
    metrics: GatewayMetrics
    sessions: OrderedDict[str, SessionState]
    waiters: dict[str, asyncio.Event]

    if TYPE_CHECKING:

        def spawn(self, coro: Coroutine[Any, Any, Any]) -> None: ...

    def authenticate(self, token: str | None) -> str:
        """The session id a data-plane token names (401 otherwise)."""
        return self.authenticate_full(token)[0]

    def authenticate_full(self, token: str | None) -> tuple[str, str | None]:
        """``(session id, incarnation or None)`` a data-plane token names (401 otherwise)."""
        if not token:
            raise GatewayError(401, _NO_TOKEN, "authentication_error", "missing_token")
        try:
            return self.signer.verify_full(token)
        except TokenError as exc:
            if self.config.open:
                return token, None
            self.metrics.error("unauthorized")
            raise GatewayError(401, str(exc), "authentication_error", "invalid_token") from exc

    async def session_state(self, session_id: str) -> SessionState:
        """The live state of a session (loaded from the store on first use)."""
        st = self.sessions.get(session_id)
        if st is not None:
            self.sessions.move_to_end(session_id)
            return st
        rec = await self.store.get_session(session_id)
        if rec is None:
            if not self.config.open:
                raise GatewayError(
                    404,
                    f"session {session_id!r} not found",
                    "invalid_request_error",
                    "session_not_found",
                )
            rec = SessionRecord(session_id=session_id)
            with contextlib.suppress(ValueError):
                await self.store.create_session(rec)
            rec = await self.store.get_session(session_id) or rec
        shared: Any = None
        if not rec.terminal:
            # Another gateway (or this one before a restart) may have routed it already.
            shared = await self.store.get_setting(f"sticky:{session_id}")
        st = self.sessions.get(session_id)
        if st is None:
            st = SessionState(rec)
            if isinstance(shared, str) and self.pool.stick(session_id, shared):
                st.shared_backend = shared
            if not rec.terminal:  # a closed session needs no state: its calls get 409
                self.sessions[session_id] = st
                if len(self.sessions) > _MAX_CACHED_SESSIONS:
                    for old in self._evict(time.time()):
                        self.spawn(self.expire(old))
        return st

    def _evict(self, now: float) -> list[SessionRecord]:
        """Drop expired sessions (returned, to be timed out), then least recently used idle ones
        past the bound."""
        expired = []
        for sid, st in list(self.sessions.items()):
            exp = st.record.expires_at
            if st.in_flight == 0 and exp is not None and exp < now:
                del self.sessions[sid]
                expired.append(st.record)
        # Down to 90% of the bound, so a gateway at the bound does not scan on every new session.
        excess = len(self.sessions) - _MAX_CACHED_SESSIONS * 9 // 10
        if excess > 0:
            for sid in [sid for sid, st in self.sessions.items() if st.in_flight == 0][:excess]:
                del self.sessions[sid]
                self.metrics.sessions_evicted += 1
        return expired

    async def _sweep_sessions(self) -> None:
        while True:
            await asyncio.sleep(self.config.sweep_interval)
            for rec in self._evict(time.time()):
                # Abandoned: nobody completed it before its TTL. It becomes ``timeout`` now,
                # not whenever someone happens to read it.
                with contextlib.suppress(Exception):
                    await self.expire(rec)

    async def expire(self, rec: SessionRecord) -> SessionRecord:
        """Give a running session past its TTL the status ``timeout`` (returns the record)."""
        if rec.terminal or rec.expires_at is None or rec.expires_at >= time.time():
            return rec
        from rollwire.store import CompletionConflict

        try:
            new, changed = await self.store.complete(
                rec.session_id, status="timeout", error="session expired (ttl passed)"
            )
        except CompletionConflict as exc:
            return exc.record  # completed meanwhile
        except SessionNotFound:
            return rec
        if changed:
            self.metrics.sessions_expired += 1
            self.session_finished(new)
        return new

    def issue_token(self, rec: SessionRecord) -> str:
        """A signed data-plane token for the session."""
        return self.signer.issue(
            rec.session_id, rec.expires_at or (time.time() + 3600), rec.incarnation
        )

    def check_incarnation(self, rec: SessionRecord, incarnation: str | None) -> None:
        """Refuse (401) a token issued for an earlier session that had this id."""
        if incarnation is not None and incarnation != rec.incarnation:
            self.metrics.error("unauthorized")
            raise GatewayError(
                401,
                f"this token was issued for an earlier session {rec.session_id!r} that was "
                "deleted; the session now under that id has its own token",
                "authentication_error",
                "invalid_token",
            )

    def session_finished(self, rec: SessionRecord) -> None:
        """Called when a session became terminal: wake waiters, drop routing affinity and the
        memo of its last prompt."""
        st = self.sessions.get(rec.session_id)
        if st is not None:
            st.record = rec
            if st.in_flight == 0:
                del self.sessions[rec.session_id]
        ev = self.waiters.get(rec.session_id)
        if ev is not None:
            ev.set()
        self.pool.forget(rec.session_id)
        MEMOS.drop(rec.session_id)
