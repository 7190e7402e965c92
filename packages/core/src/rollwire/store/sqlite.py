"""SQLite store: the embedded default (WAL, one writer thread, pooled readers: ``sqlite_writer``).

Prompts are stored as ``(parent_call_id, shared_prefix_len, new_prompt_ids)`` and messages as new
messages only (DESIGN §5, ``codec``); token ids, log-probs and routed experts as packed
little-endian blobs. A call is committed before :meth:`SQLiteStore.append_call` returns; the
terminal-session check and the retry matching (``sqlite_retries``: the request key is a column of
the call's row) run inside that same transaction.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import orjson

from rollwire.data.protocol import TERMINAL_STATUSES, ModelCall
from rollwire.store import codec
from rollwire.store.base import (
    CompletionConflict,
    SessionClosed,
    SessionExists,
    SessionNotFound,
    SessionRecord,
    same_outcome,
)
from rollwire.store.sqlite_retries import RetryMatcher, add_request_key_column
from rollwire.store.sqlite_writer import SQLiteConnections, WriteBatch

__all__ = ["SQLiteStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    group_id TEXT,
    task_id TEXT,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    num_calls INTEGER NOT NULL DEFAULT 0,
    num_tokens INTEGER NOT NULL DEFAULT 0,
    data BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_by_group ON sessions(group_id);
CREATE INDEX IF NOT EXISTS sessions_by_status ON sessions(status);
CREATE TABLE IF NOT EXISTS calls (
    session_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    call_id TEXT NOT NULL,
    request_key TEXT,
    parent_call_id TEXT,
    shared_prefix_len INTEGER NOT NULL,
    new_prompt BLOB NOT NULL,
    completion BLOB NOT NULL,
    logprobs BLOB NOT NULL,
    experts BLOB,
    shared_messages INTEGER,
    new_messages BLOB,
    meta BLOB NOT NULL,
    PRIMARY KEY (session_id, idx)
);
CREATE TABLE IF NOT EXISTS blobs (hash TEXT PRIMARY KEY, data BLOB NOT NULL);
-- Request keys of calls stored before they had their column in ``calls`` (read, never written).
CREATE TABLE IF NOT EXISTS call_keys (
    session_id TEXT NOT NULL,
    request_key TEXT NOT NULL,
    call_id TEXT NOT NULL,
    retry_count INTEGER NOT NULL,
    ok INTEGER NOT NULL,
    matched INTEGER NOT NULL,
    PRIMARY KEY (session_id, request_key)
);
CREATE TABLE IF NOT EXISTS settings (name TEXT PRIMARY KEY, value BLOB NOT NULL, expires_at REAL);
"""

_SESSION_COLUMNS = ("session_id", "group_id", "task_id", "status", "created_at")
_TERMINAL_SQL = ", ".join(f"'{s}'" for s in sorted(TERMINAL_STATUSES))
_SELECT_SESSION = (
    "SELECT session_id, group_id, task_id, status, created_at, num_calls, num_tokens, data"
    " FROM sessions"
)
_SELECT_CALLS = (
    "SELECT idx, call_id, parent_call_id, shared_prefix_len, new_prompt, completion,"
    " logprobs, experts, shared_messages, new_messages, meta FROM calls"
    " WHERE session_id = ? ORDER BY idx"
)


class SQLiteStore(WriteBatch):
    """The embedded default store (see the module docstring). ``path=":memory:"`` uses a
    temporary file that is removed on :meth:`close`, so readers and the writer share it.
    ``wal_limit_bytes`` bounds the WAL file between checkpoints; ``max_bytes`` caps the database
    file (a write past it is refused as on a full disk: :class:`StoreUnavailable`, a 503)."""

    def __init__(
        self,
        path: str,
        *,
        readers: int = 4,
        checkpoint_interval: float = 1.0,
        wal_limit_bytes: int = 64 * 1024 * 1024,
        max_bytes: int | None = None,
    ) -> None:
        self._tmpdir: str | None = None
        if path in (":memory:", ""):
            self._tmpdir = tempfile.mkdtemp(prefix="rollwire-store-")
            path = os.path.join(self._tmpdir, "store.sqlite")
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._deltas = codec.DeltaCache()
        self._counts: dict[str, list[int]] = {}  # per-batch call/token increments (writer only)
        self._known_blobs: set[str] = set()
        self._retries = RetryMatcher()  # writer thread only
        self._db = SQLiteConnections(
            path,
            self,
            _SCHEMA,
            migrate=add_request_key_column,
            readers=readers,
            checkpoint_interval=checkpoint_interval,
            wal_limit_bytes=wal_limit_bytes,
            max_bytes=max_bytes,
        )

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r})"

    # ----------------------------------------------------------------- batch hooks
    def begin(self) -> None:
        """Writer thread: a transaction starts (no counter increments yet)."""
        self._counts = {}

    def before_commit(self, conn: sqlite3.Connection) -> None:
        """Writer thread: the counter UPDATE of each session of the batch (one executemany), which
        also refuses calls to a terminal session (raising rolls the batch back; the one-by-one
        rerun then fails only the appends that came after the completion)."""
        counts = self._counts
        if not counts:
            return
        cur = conn.executemany(
            "UPDATE sessions SET num_calls = num_calls + ?, num_tokens = num_tokens + ?"
            f" WHERE session_id = ? AND status NOT IN ({_TERMINAL_SQL})",
            [(calls, tokens, session_id) for session_id, (calls, tokens) in counts.items()],
        )
        if cur.rowcount == len(counts):  # one statement for the batch: every session took it
            return
        for session_id in counts:  # the first session that refused, as the appends came
            row = conn.execute(
                "SELECT status FROM sessions WHERE session_id = ?", (session_id,)
            ).fetchone()
            if row is None:
                raise SessionNotFound(f"no session {session_id!r}: create it before adding calls")
            if row[0] in TERMINAL_STATUSES:
                raise SessionClosed(
                    f"session {session_id!r} is {row[0]}: a terminal session accepts no more calls"
                )
        raise AssertionError("a session counter UPDATE changed no row, yet every session is open")

    def rolled_back(self) -> None:
        """Writer thread: blobs and deltas of the rolled-back transaction are gone."""
        self._deltas.clear()
        self._known_blobs.clear()

    # ----------------------------------------------------------------- sessions
    async def create_session(self, record: SessionRecord) -> SessionRecord:
        """Persist a new session; :class:`SessionExists` when the id is taken."""

        def op(conn: sqlite3.Connection) -> SessionRecord:
            try:
                conn.execute(
                    "INSERT INTO sessions (session_id, group_id, task_id, status, created_at,"
                    " num_calls, num_tokens, data) VALUES (?,?,?,?,?,?,?,?)",
                    (
                        record.session_id,
                        record.group_id,
                        record.task_id,
                        record.status,
                        record.created_at,
                        record.num_calls,
                        record.num_tokens,
                        _session_data(record),
                    ),
                )
            except sqlite3.IntegrityError as exc:
                raise SessionExists(f"session {record.session_id!r} exists already") from exc
            return record

        return await self._db.submit(op)

    async def get_session(self, session_id: str) -> SessionRecord | None:
        """The session's record, or None."""

        def op(conn: sqlite3.Connection) -> SessionRecord | None:
            row = conn.execute(_SELECT_SESSION + " WHERE session_id = ?", (session_id,)).fetchone()
            return _session_from_row(row) if row else None

        return await self._db.read(op)

    async def list_sessions(
        self,
        group_id: str | None = None,
        status: str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[SessionRecord]:
        """Sessions, oldest first, optionally filtered by group and/or status; paged by
        ``offset`` and ``limit``."""
        where: list[str] = []
        args: list[Any] = []
        if group_id is not None:
            where.append("group_id = ?")
            args.append(group_id)
        if status is not None:
            where.append("status = ?")
            args.append(status)
        sql = _SELECT_SESSION
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created_at, rowid LIMIT ? OFFSET ?"
        args += [-1 if limit is None else max(0, int(limit)), max(0, int(offset))]

        def op(conn: sqlite3.Connection) -> list[SessionRecord]:
            return [_session_from_row(r) for r in conn.execute(sql, args).fetchall()]

        return await self._db.read(op)

    async def delete_session(self, session_id: str) -> bool:
        """Remove a session and its calls; False when there was none."""

        def op(conn: sqlite3.Connection) -> bool:
            cur = conn.execute("DELETE FROM sessions WHERE session_id = ?", (session_id,))
            conn.execute("DELETE FROM calls WHERE session_id = ?", (session_id,))
            conn.execute("DELETE FROM call_keys WHERE session_id = ?", (session_id,))
            self._deltas.drop(session_id)
            return cur.rowcount > 0

        return await self._db.submit(op)

    async def complete(
        self,
        session_id: str,
        *,
        status: str = "completed",
        reward: float | None = None,
        metrics: dict[str, float] | None = None,
        error: str | None = None,
    ) -> tuple[SessionRecord, bool]:
        """Set the terminal outcome once; the same again is a no-op, a different one conflicts."""
        _check_terminal(status)

        def op(conn: sqlite3.Connection) -> tuple[SessionRecord, bool]:
            row = conn.execute(_SELECT_SESSION + " WHERE session_id = ?", (session_id,)).fetchone()
            if row is None:
                raise SessionNotFound(session_id)
            rec = _session_from_row(row)
            pending = self._counts.get(session_id)
            if pending is not None:  # calls earlier in this same batch
                rec.num_calls += pending[0]
                rec.num_tokens += pending[1]
            if rec.terminal:
                if same_outcome(rec, status, reward, metrics, error):
                    return rec, False
                raise CompletionConflict(
                    f"session {session_id!r} was already completed with status={rec.status!r} "
                    f"reward={rec.reward!r}; refusing status={status!r} reward={reward!r}",
                    rec,
                )
            rec.status = status
            rec.reward = reward
            rec.metrics = dict(metrics or {})
            rec.error = error
            rec.completed_at = time.time()
            conn.execute(
                "UPDATE sessions SET status = ?, data = ? WHERE session_id = ?",
                (status, _session_data(rec), session_id),
            )
            self._deltas.drop(session_id)
            return rec, True

        return await self._db.submit(op)

    # ----------------------------------------------------------------- calls
    async def append_call(self, call: ModelCall, *, request_key: str | None = None) -> ModelCall:
        """Store ``call`` durably (see :class:`~rollwire.store.base.Store`)."""
        return await self._db.submit(lambda conn: self._append(conn, call, request_key))

    def _session_deltas(self, conn: sqlite3.Connection, session_id: str) -> codec.SessionDeltas:
        deltas = self._deltas.get(session_id)
        if deltas is not None:
            return deltas
        row = conn.execute(
            "SELECT num_calls FROM sessions WHERE session_id = ?", (session_id,)
        ).fetchone()
        if row is None:
            raise SessionNotFound(f"no session {session_id!r}: create it before adding calls")
        deltas = codec.SessionDeltas(int(row[0]))
        if int(row[0]):
            rows = conn.execute(_SELECT_CALLS, (session_id,)).fetchall()
            codec.deltas_from_rows(session_id, rows, deltas)
        self._deltas.put(session_id, deltas)
        return deltas

    def _append(self, conn: sqlite3.Connection, call: ModelCall, key: str | None) -> ModelCall:
        deltas = self._session_deltas(conn, call.session_id)
        earlier = self._retries.match(conn, call, key)
        enc = codec.encode_call(call, deltas, key)
        if enc.tools is not None and enc.tools_hash is not None:
            self._put_blob(conn, enc.tools_hash, enc.tools)
        conn.execute(
            "INSERT INTO calls (session_id, idx, call_id, request_key, parent_call_id,"
            " shared_prefix_len, new_prompt, completion, logprobs, experts, shared_messages,"
            " new_messages, meta) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                call.session_id,
                enc.index,
                enc.call_id,
                key,
                enc.parent_call_id,
                enc.shared_prefix_len,
                enc.new_prompt,
                enc.completion,
                enc.logprobs,
                enc.experts,
                enc.shared_messages,
                enc.new_messages,
                enc.meta_bytes(),
            ),
        )
        if earlier is not None:
            _supersede(conn, call.session_id, earlier, call.call_id)
        counts = self._counts.get(call.session_id)
        if counts is None:
            counts = self._counts[call.session_id] = [0, 0]
        counts[0] += 1
        counts[1] += enc.n_completion
        # Only now, with every statement done, touch the in-memory state.
        codec.remember_encoded(call, enc, deltas, self._deltas)
        codec.committed(call, enc)
        return call

    def _put_blob(self, conn: sqlite3.Connection, digest: str, data: bytes) -> None:
        if digest not in self._known_blobs:
            conn.execute("INSERT OR IGNORE INTO blobs (hash, data) VALUES (?, ?)", (digest, data))
            self._known_blobs.add(digest)

    async def mark_superseded(self, session_id: str, call_id: str, by: str) -> None:
        """Mark an earlier call non-trainable because the agent retried it as ``by``."""
        await self._db.submit(lambda conn: _supersede(conn, session_id, call_id, by))

    async def calls(self, session_id: str) -> list[ModelCall]:
        """The session's calls in index order, with full prompts and messages rebuilt."""
        return await self._db.read(lambda conn: _read_calls(conn, session_id))

    # ----------------------------------------------------------------- settings
    async def get_setting(self, name: str) -> Any:
        """A shared setting (JSON value), or None when unset or expired."""
        return (await self.get_settings((name,))).get(name)

    async def get_settings(self, names: Sequence[str]) -> dict[str, Any]:
        """The set, unexpired settings among ``names`` (one statement: one snapshot)."""
        args = [*names, time.time()]
        sql = (
            f"SELECT name, value FROM settings WHERE name IN ({','.join('?' * len(names))})"
            " AND (expires_at IS NULL OR expires_at > ?)"
        )

        def op(conn: sqlite3.Connection) -> dict[str, Any]:
            return {name: orjson.loads(value) for name, value in conn.execute(sql, args)}

        return await self._db.read(op) if names else {}

    async def set_setting(self, name: str, value: Any, *, ttl: float | None = None) -> None:
        """Set (``None``: remove) a setting, optionally expiring after ``ttl`` seconds."""
        now = time.time()
        data = None if value is None else orjson.dumps(value)

        def op(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM settings WHERE expires_at <= ?", (now,))
            if data is None:
                conn.execute("DELETE FROM settings WHERE name = ?", (name,))
            else:
                conn.execute(
                    "INSERT OR REPLACE INTO settings (name, value, expires_at) VALUES (?,?,?)",
                    (name, data, None if ttl is None else now + ttl),
                )

        await self._db.submit(op)

    async def settings_with_prefix(self, prefix: str) -> dict[str, Any]:
        """Every unexpired setting whose name starts with ``prefix``."""

        def op(conn: sqlite3.Connection) -> dict[str, Any]:
            rows = conn.execute(
                "SELECT name, value FROM settings WHERE substr(name, 1, ?) = ?"
                " AND (expires_at IS NULL OR expires_at > ?)",
                (len(prefix), prefix, time.time()),
            ).fetchall()
            return {name: orjson.loads(value) for name, value in rows}

        return await self._db.read(op)

    # ----------------------------------------------------------------- measurements
    async def ping(self) -> None:
        """Raise :class:`StoreUnavailable` when the file cannot be read."""
        await self._db.read(lambda conn: conn.execute("SELECT 1").fetchone())

    async def session_bytes(self, session_id: str) -> int:
        """Bytes of stored payload (blobs and JSON) of a session's calls and shared blobs."""

        def op(conn: sqlite3.Connection) -> int:
            row = conn.execute(
                "SELECT COALESCE(SUM(length(call_id) + COALESCE(length(parent_call_id), 0)"
                " + length(new_prompt) + length(completion) + length(logprobs)"
                " + COALESCE(length(experts), 0) + COALESCE(length(new_messages), 0)"
                " + length(meta) + 16), 0) FROM calls WHERE session_id = ?",
                (session_id,),
            ).fetchone()
            blobs = conn.execute("SELECT COALESCE(SUM(length(data)), 0) FROM blobs").fetchone()
            return int(row[0]) + int(blobs[0])

        return await self._db.read(op)

    async def checkpoint(self) -> None:
        """Fold the WAL back into the database file (for measuring the file's size)."""
        await self._db.submit(lambda conn: None)
        await self._db.read(lambda conn: conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone())

    # ----------------------------------------------------------------- lifecycle
    async def close(self) -> None:
        """Finish queued writes, stop the threads and close every connection."""
        if self._db.closed:
            return
        import asyncio

        await asyncio.get_running_loop().run_in_executor(None, self.close_sync)

    def close_sync(self) -> None:
        """Blocking :meth:`close` (safe to call from any thread, and twice)."""
        self._db.close()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)


def _check_terminal(status: str) -> None:
    if status not in TERMINAL_STATUSES:
        raise ValueError(
            f"status {status!r} is not a terminal status: use one of {sorted(TERMINAL_STATUSES)}"
        )


def _supersede(conn: sqlite3.Connection, session_id: str, call_id: str, by: str) -> None:
    row = conn.execute(
        "SELECT idx, meta FROM calls WHERE session_id = ? AND call_id = ?", (session_id, call_id)
    ).fetchone()
    if row is None:
        return
    meta = codec.unpack_json(row[1])
    codec.mark_superseded_meta(meta, by)
    conn.execute(
        "UPDATE calls SET meta = ? WHERE session_id = ? AND idx = ?",
        (codec.pack_json(meta), session_id, row[0]),
    )


def _session_data(rec: SessionRecord) -> bytes:
    d = rec.to_dict()
    for name in (*_SESSION_COLUMNS, "num_calls", "num_tokens"):
        d.pop(name, None)
    return orjson.dumps(d)


def _session_from_row(row: Sequence[Any]) -> SessionRecord:
    data = orjson.loads(row[7])
    # Files written before sessions had incarnations: a stable one from the creation time.
    data.setdefault("incarnation", f"t{row[4]!r}")
    data.update(
        session_id=row[0],
        group_id=row[1],
        task_id=row[2],
        status=row[3],
        created_at=row[4],
        num_calls=row[5],
        num_tokens=row[6],
    )
    return SessionRecord.from_dict(data)


def _read_calls(conn: sqlite3.Connection, session_id: str) -> list[ModelCall]:
    rows = conn.execute(_SELECT_CALLS, (session_id,)).fetchall()

    def tool(key: str) -> bytes | None:
        got = conn.execute("SELECT data FROM blobs WHERE hash = ?", (key,)).fetchone()
        return None if got is None else bytes(got[0])

    return codec.decode_calls(session_id, rows, tool)
