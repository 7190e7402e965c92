"""Retry matching for the SQLite store: a call's request key lives in its own ``calls`` row.

The key (a digest of the request body as received) is written with the call, in the same INSERT,
so matching costs no statement of its own on a first attempt. A retry (``retry_count`` > 0) looks
for the latest call of its session with the same key, newest first (the original is almost
always among the last few); a first attempt looks only when this process stored an early ok
retry of its body. Files written before the key had its column keep their ``call_keys`` rows,
read when the session's rows have no match.
"""

from __future__ import annotations

import sqlite3
from typing import NamedTuple

from rollwire.data.protocol import ModelCall
from rollwire.store import codec

__all__ = ["RetryMatcher", "add_request_key_column"]

_LATEST_WITH_KEY = (
    "SELECT call_id, meta FROM calls WHERE session_id = ? AND request_key = ?"
    " ORDER BY idx DESC LIMIT 1"
)
_OLD_KEY = (
    "SELECT call_id, retry_count, ok, matched FROM call_keys"
    " WHERE session_id = ? AND request_key = ?"
)


class _Prior(NamedTuple):
    call_id: str
    retry_count: int
    ok: bool
    matched: bool  # a retry that found its original


def add_request_key_column(conn: sqlite3.Connection) -> None:
    """Give a file written before keys lived in ``calls`` the column (cheap: no row rewrite)."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(calls)")}
    if "request_key" not in columns:
        conn.execute("ALTER TABLE calls ADD COLUMN request_key TEXT")


def _prior(conn: sqlite3.Connection, session_id: str, key: str) -> _Prior | None:
    row = conn.execute(_LATEST_WITH_KEY, (session_id, key)).fetchone()
    if row is not None:
        meta = codec.unpack_json(row[1])
        rc = int(meta.get("retry_count") or 0)
        return _Prior(row[0], rc, meta.get("status") == "ok", rc > 0 and bool(meta.get("retry_of")))
    old = conn.execute(_OLD_KEY, (session_id, key)).fetchone()
    return None if old is None else _Prior(old[0], int(old[1]), bool(old[2]), bool(old[3]))


class RetryMatcher:
    """The retry rule of :meth:`Store.append_call` (the Redis script has the same), run on the
    writer thread inside the call's transaction."""

    def __init__(self) -> None:
        # (session, request key) of ok retries this process stored before their original: the
        # only rows a first attempt can match. One stored before a restart cannot be waiting
        # for its original (that died with the old process; one file has one gateway process).
        self._early: set[tuple[str, str]] = set()

    def match(self, conn: sqlite3.Connection, call: ModelCall, key: str | None) -> str | None:
        """Link ``call`` with the earlier attempt of its body; returns the earlier call this one
        supersedes (a successful retry), or None."""
        rc = int(call.retry_count)
        ok = call.status == "ok"
        if key is not None:
            sid = call.session_id
            prev = _prior(conn, sid, key) if rc > 0 or (sid, key) in self._early else None
            if prev is not None:
                if rc > 0 and not call.retry_of:
                    call.retry_of = prev.call_id
                elif rc == 0 and prev.retry_count > 0 and not prev.matched and prev.ok:
                    # The retry landed first (this original was still running).
                    call.trainable = False
                    if codec.SUPERSEDED_FLAG not in call.flags:
                        call.flags.append(codec.SUPERSEDED_FLAG)
            if rc > 0 and ok and not call.retry_of:
                # Kept on rollback too: an extra entry costs one SELECT, never a wrong answer.
                self._early.add((sid, key))
        if rc > 0 and call.retry_of and ok:
            return call.retry_of
        return None
