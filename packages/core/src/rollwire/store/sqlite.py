"""SQLite store: WAL, one writer thread committing one batch per event-loop tick, pooled readers.

Writes from the event loop are queued; once per loop tick the pending ones go to the writer thread,
which runs everything queued in one transaction (a savepoint per operation, so one bad write fails
alone) and resolves the callers' futures after ``COMMIT``. Reads use separate connections on a
small thread pool, so they never wait for the writer. WAL checkpoints run on their own thread.
Prompts are stored as ``(parent_call_id, shared_prefix_len, new_prompt_ids)`` and messages as new
messages only (DESIGN §5); token ids, log-probs and routed experts as packed little-endian blobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import queue
import shutil
import sqlite3
import tempfile
import threading
import zlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar, cast

import numpy as np
import orjson

from rollwire.data.protocol import TERMINAL_STATUSES, ModelCall, find_parent
from rollwire.store.base import (
    CompletionConflict,
    SessionClosed,
    SessionExists,
    SessionNotFound,
    SessionRecord,
    same_outcome,
)

__all__ = ["SQLiteStore"]

T = TypeVar("T")

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
"""

# Fields of ModelCall kept in the ``meta`` JSON column (arrays and delta fields have columns).
_META_FIELDS = (
    "finish_reason",
    "status",
    "error",
    "sampling",
    "trainable",
    "off_policy",
    "flags",
    "retry_of",
    "retry_count",
    "policy_version",
    "backend",
    "logprobs_mode",
    "capture",
    "branch",
    "fork_reason",
    "stream",
    "started_at",
    "latency_ms",
    "response",
)
_SESSION_COLUMNS = ("session_id", "group_id", "task_id", "status", "created_at")
_RECENT_CALLS = 16  # earlier calls per session kept in memory for the prompt delta
_CACHED_SESSIONS = 4096
# Token ids held by that cache, all sessions together (int32: 4 bytes each). Least recently used
# sessions are dropped past it (they are re-read from the file if they get another call).
_CACHED_TOKENS = 4_000_000
_TERMINAL_SQL = ", ".join(f"'{s}'" for s in sorted(TERMINAL_STATUSES))


class _Tokens:
    """The part of a call ``find_parent`` reads (kept per session in the writer's cache)."""

    __slots__ = ("call_id", "completion_ids", "prompt_ids")

    def __init__(self, call_id: str, prompt_ids: np.ndarray, completion_ids: np.ndarray) -> None:
        self.call_id = call_id
        self.prompt_ids = prompt_ids
        self.completion_ids = completion_ids


class _SessionCache:
    __slots__ = ("last_messages", "next_index", "recent", "tokens")

    def __init__(self, next_index: int) -> None:
        self.next_index = next_index
        self.recent: list[_Tokens] = []
        self.last_messages: list[Any] = []
        self.tokens = 0  # token ids held in ``recent``


def _n_tokens(t: _Tokens) -> int:
    return int(t.prompt_ids.shape[0]) + int(t.completion_ids.shape[0])


def _i32(arr: Any) -> np.ndarray:
    return np.ascontiguousarray(arr, dtype="<i4")


def _shared_messages(prev: Sequence[Any], cur: Sequence[Any]) -> int:
    n = 0
    for a, b in zip(prev, cur):
        if a != b:
            break
        n += 1
    return n


class SQLiteStore:
    """The embedded default store (see the module docstring). ``path=":memory:"`` uses a
    temporary file that is removed on :meth:`close`, so readers and the writer share it."""

    def __init__(self, path: str, *, readers: int = 4, checkpoint_interval: float = 1.0) -> None:
        self._tmpdir: str | None = None
        if path in (":memory:", ""):
            self._tmpdir = tempfile.mkdtemp(prefix="rollwire-store-")
            path = os.path.join(self._tmpdir, "store.sqlite")
        self.path = path
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        init = self._connect()
        init.executescript(_SCHEMA)
        init.close()
        self._lock = threading.Lock()
        self._pending: list[tuple[Callable[[sqlite3.Connection], Any], asyncio.Future[Any]]] = []
        self._kick_scheduled = False
        self._queue: queue.SimpleQueue[list[Any] | None] = queue.SimpleQueue()
        self._cache: OrderedDict[str, _SessionCache] = OrderedDict()
        self._cached_tokens = 0
        self._counts: dict[str, list[int]] = {}  # per-batch call/token increments (writer only)
        self._known_blobs: set[str] = set()
        self._dirty = threading.Event()
        self._closed = False
        self._writer = threading.Thread(target=self._writer_main, name="rollwire-sqlite-writer")
        self._writer.daemon = True
        self._writer.start()
        self._local = threading.local()
        self._reader_conns: list[sqlite3.Connection] = []
        self._readers = ThreadPoolExecutor(readers, thread_name_prefix="rollwire-sqlite-read")
        self._stop_checkpoints = threading.Event()
        self._checkpoint_interval = checkpoint_interval
        self._checkpointer = threading.Thread(
            target=self._checkpoint_main, name="rollwire-sqlite-checkpoint", daemon=True
        )
        self._checkpointer.start()

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r})"

    # ----------------------------------------------------------------- connections
    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=10000")
        return conn

    def _reader(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
            with self._lock:
                self._reader_conns.append(conn)
        return conn

    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._readers, lambda: fn(self._reader()))

    # ----------------------------------------------------------------- writer
    def _submit(self, fn: Callable[[sqlite3.Connection], T]) -> asyncio.Future[T]:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        with self._lock:
            self._pending.append((fn, fut))
            schedule = not self._kick_scheduled
            self._kick_scheduled = True
        if schedule:
            loop.call_soon(self._kick)
        return fut

    def _kick(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
            self._kick_scheduled = False
        if batch:
            self._queue.put(batch)

    def _writer_main(self) -> None:
        conn = self._connect()
        conn.execute("PRAGMA wal_autocheckpoint=0")  # checkpoints run on their own thread
        stop = False
        while not stop:
            first = self._queue.get()
            if first is None:
                break
            items = list(first)
            while True:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                items.extend(more)
            self._run_batch(conn, items)
        conn.close()

    def _run_batch(self, conn: sqlite3.Connection, items: list[Any]) -> None:
        outcomes: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []
        self._counts = {}
        try:
            conn.execute("BEGIN IMMEDIATE")
            for fn, fut in items:
                outcomes.append((fut, fn(conn), None))
            self._flush_counts(conn)
            conn.execute("COMMIT")
        except Exception:
            # Rare: some operation failed. Roll back and run each one in its own transaction,
            # so only the failing ones fail.
            with contextlib.suppress(Exception):
                conn.execute("ROLLBACK")
            self._clear_cache()
            outcomes = [self._run_one(conn, fn, fut) for fn, fut in items]
        self._dirty.set()
        by_loop: dict[asyncio.AbstractEventLoop, list[Any]] = {}
        for outcome in outcomes:
            by_loop.setdefault(outcome[0].get_loop(), []).append(outcome)
        for loop, results in by_loop.items():
            with contextlib.suppress(RuntimeError):  # loop closed: nobody is waiting
                loop.call_soon_threadsafe(_resolve_all, results)

    def _run_one(
        self, conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], Any], fut: Any
    ) -> tuple[asyncio.Future[Any], Any, BaseException | None]:
        self._counts = {}
        try:
            conn.execute("BEGIN IMMEDIATE")
            result = fn(conn)
            self._flush_counts(conn)
            conn.execute("COMMIT")
        except Exception as exc:
            with contextlib.suppress(Exception):
                conn.execute("ROLLBACK")
            self._clear_cache()
            return fut, None, exc
        return fut, result, None

    def _flush_counts(self, conn: sqlite3.Connection) -> None:
        # One UPDATE per session per batch, not one per call. It also refuses calls to a
        # terminal session: a failure here rolls the batch back, and the one-by-one rerun fails
        # only the appends that came after the completion.
        for session_id, (calls, tokens) in self._counts.items():
            cur = conn.execute(
                "UPDATE sessions SET num_calls = num_calls + ?, num_tokens = num_tokens + ?"
                f" WHERE session_id = ? AND status NOT IN ({_TERMINAL_SQL})",
                (calls, tokens, session_id),
            )
            if cur.rowcount == 0:
                row = conn.execute(
                    "SELECT status FROM sessions WHERE session_id = ?", (session_id,)
                ).fetchone()
                if row is None:
                    raise SessionNotFound(
                        f"no session {session_id!r}: create it before adding calls"
                    )
                raise SessionClosed(
                    f"session {session_id!r} is {row[0]}: a terminal session accepts no more calls"
                )

    def _checkpoint_main(self) -> None:
        conn: sqlite3.Connection | None = None
        while not self._stop_checkpoints.wait(self._checkpoint_interval):
            if not self._dirty.is_set():
                continue
            self._dirty.clear()
            try:
                if conn is None:
                    conn = self._connect()
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
            except sqlite3.Error:
                pass
        if conn is not None:
            conn.close()

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

        return await self._submit(op)

    async def get_session(self, session_id: str) -> SessionRecord | None:
        """The session's record, or None."""

        def op(conn: sqlite3.Connection) -> SessionRecord | None:
            row = conn.execute(_SELECT_SESSION + " WHERE session_id = ?", (session_id,)).fetchone()
            return _session_from_row(row) if row else None

        return await self._read(op)

    async def list_sessions(
        self,
        group_id: str | None = None,
        status: str | None = None,
        limit: int | None = None,
    ) -> list[SessionRecord]:
        """Sessions, oldest first, optionally filtered by group and/or status."""
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
        sql += " ORDER BY created_at, rowid"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(int(limit))

        def op(conn: sqlite3.Connection) -> list[SessionRecord]:
            return [_session_from_row(r) for r in conn.execute(sql, args).fetchall()]

        return await self._read(op)

    async def delete_session(self, session_id: str) -> bool:
        """Remove a session and its calls; False when there was none."""

        def op(conn: sqlite3.Connection) -> bool:
            cur = conn.execute("DELETE FROM sessions WHERE session_id = ?", (session_id,))
            conn.execute("DELETE FROM calls WHERE session_id = ?", (session_id,))
            self._drop_cache(session_id)
            return cur.rowcount > 0

        return await self._submit(op)

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
        import time

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
            self._drop_cache(session_id)
            return rec, True

        return await self._submit(op)

    # ----------------------------------------------------------------- calls
    async def append_call(self, call: ModelCall) -> ModelCall:
        """Store ``call`` durably (see :class:`~rollwire.store.base.Store`)."""
        return await self._submit(lambda conn: self._append(conn, call))

    def _clear_cache(self) -> None:
        # After a rollback: blobs written in the rolled-back transaction are gone from the file.
        self._cache.clear()
        self._cached_tokens = 0
        self._known_blobs.clear()

    def _drop_cache(self, session_id: str) -> None:
        cache = self._cache.pop(session_id, None)
        if cache is not None:
            self._cached_tokens -= cache.tokens

    def _trim_cache(self) -> None:
        while len(self._cache) > 1 and (
            len(self._cache) > _CACHED_SESSIONS or self._cached_tokens > _CACHED_TOKENS
        ):
            _, old = self._cache.popitem(last=False)
            self._cached_tokens -= old.tokens

    def _session_cache(self, conn: sqlite3.Connection, session_id: str) -> _SessionCache:
        cache = self._cache.get(session_id)
        if cache is not None:
            self._cache.move_to_end(session_id)
            return cache
        row = conn.execute(
            "SELECT num_calls FROM sessions WHERE session_id = ?", (session_id,)
        ).fetchone()
        if row is None:
            raise SessionNotFound(f"no session {session_id!r}: create it before adding calls")
        cache = _SessionCache(int(row[0]))
        if cache.next_index:
            earlier = _read_calls(conn, session_id)
            cache.next_index = max(cache.next_index, earlier[-1].index + 1 if earlier else 0)
            cache.recent = [_Tokens(c.call_id, c.prompt_ids, c.completion_ids) for c in earlier][
                -_RECENT_CALLS:
            ]
            if earlier:
                cache.last_messages = list(earlier[-1].request.get("messages") or [])
            cache.tokens = sum(_n_tokens(t) for t in cache.recent)
            self._cached_tokens += cache.tokens
        self._cache[session_id] = cache
        return cache

    def _append(self, conn: sqlite3.Connection, call: ModelCall) -> ModelCall:
        cache = self._session_cache(conn, call.session_id)
        prompt = _i32(call.prompt_ids)
        completion = _i32(call.completion_ids)
        logprobs = np.ascontiguousarray(call.logprobs, dtype="<f4")
        parent, shared = find_parent(prompt, cast(Sequence[ModelCall], cache.recent))
        parent_id = parent.call_id if parent is not None else None
        request = dict(call.request)
        messages = request.pop("messages", None)
        shared_messages: int | None = None
        new_messages: bytes | None = None
        if isinstance(messages, list):
            shared_messages = _shared_messages(cache.last_messages, messages)
            new_messages = _pack_json(messages[shared_messages:])
        tools = request.get("tools")
        if isinstance(tools, list) and tools:
            request["tools"] = {"$blob": self._put_blob(conn, orjson.dumps(tools))}
        meta = {name: getattr(call, name) for name in _META_FIELDS}
        meta["request"] = request
        experts: bytes | None = None
        if call.routed_experts is not None:
            arr = np.ascontiguousarray(call.routed_experts, dtype="<i2")
            meta["experts_shape"] = list(arr.shape)
            experts = arr.tobytes()
        index = cache.next_index
        conn.execute(
            "INSERT INTO calls (session_id, idx, call_id, parent_call_id, shared_prefix_len,"
            " new_prompt, completion, logprobs, experts, shared_messages, new_messages, meta)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                call.session_id,
                index,
                call.call_id,
                parent_id,
                shared,
                prompt[shared:].tobytes(),
                completion.tobytes(),
                logprobs.tobytes(),
                experts,
                shared_messages,
                new_messages,
                _pack_json(meta),
            ),
        )
        counts = self._counts.get(call.session_id)
        if counts is None:
            counts = self._counts[call.session_id] = [0, 0]
        counts[0] += 1
        counts[1] += int(completion.shape[0])
        # Only now, with every statement done, touch the in-memory state.
        cache.next_index = index + 1
        cache.recent.append(_Tokens(call.call_id, prompt, completion))
        added = int(prompt.shape[0]) + int(completion.shape[0])
        if len(cache.recent) > _RECENT_CALLS:
            added -= _n_tokens(cache.recent.pop(0))
        cache.tokens += added
        self._cached_tokens += added
        if self._cached_tokens > _CACHED_TOKENS or len(self._cache) > _CACHED_SESSIONS:
            self._trim_cache()
        if isinstance(messages, list):
            cache.last_messages = messages
        call.index = index
        call.parent_call_id = parent_id
        call.shared_prefix_len = shared
        return call

    def _put_blob(self, conn: sqlite3.Connection, data: bytes) -> str:
        digest = hashlib.blake2b(data, digest_size=16).hexdigest()
        if digest not in self._known_blobs:
            conn.execute("INSERT OR IGNORE INTO blobs (hash, data) VALUES (?, ?)", (digest, data))
            self._known_blobs.add(digest)
        return digest

    async def mark_superseded(self, session_id: str, call_id: str, by: str) -> None:
        """Mark an earlier call non-trainable because the agent retried it as ``by``."""

        def op(conn: sqlite3.Connection) -> None:
            row = conn.execute(
                "SELECT idx, meta FROM calls WHERE session_id = ? AND call_id = ?",
                (session_id, call_id),
            ).fetchone()
            if row is None:
                return
            meta = _unpack_json(row[1])
            meta["trainable"] = False
            flags = list(meta.get("flags") or [])
            if "superseded_by_retry" not in flags:
                flags.append("superseded_by_retry")
            meta["flags"] = flags
            meta["superseded_by"] = by
            conn.execute(
                "UPDATE calls SET meta = ? WHERE session_id = ? AND idx = ?",
                (_pack_json(meta), session_id, row[0]),
            )

        await self._submit(op)

    async def calls(self, session_id: str) -> list[ModelCall]:
        """The session's calls in index order, with full prompts and messages rebuilt."""
        return await self._read(lambda conn: _read_calls(conn, session_id))

    # ----------------------------------------------------------------- measurements
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

        return await self._read(op)

    async def checkpoint(self) -> None:
        """Fold the WAL back into the database file (for measuring the file's size)."""
        await self._submit(lambda conn: None)
        await self._read(lambda conn: conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone())

    # ----------------------------------------------------------------- lifecycle
    async def close(self) -> None:
        """Finish queued writes, stop the threads and close every connection."""
        if self._closed:
            return
        await asyncio.get_running_loop().run_in_executor(None, self.close_sync)

    def close_sync(self) -> None:
        """Blocking :meth:`close` (safe to call from any thread, and twice)."""
        if self._closed:
            return
        self._kick()
        self._closed = True
        self._queue.put(None)
        self._writer.join()
        self._stop_checkpoints.set()
        self._checkpointer.join()
        self._readers.shutdown(wait=True)
        with self._lock:
            conns, self._reader_conns = self._reader_conns, []
        for conn in conns:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
        try:
            final = sqlite3.connect(self.path, isolation_level=None)
            final.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            final.close()
        except sqlite3.Error:
            pass
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)


def _pack_json(obj: Any) -> bytes:
    """JSON, zlib-compressed when that pays (text in messages and responses compresses ~3x)."""
    raw = orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)
    if len(raw) < 128:
        return raw
    packed = zlib.compress(raw, 1)
    return packed if len(packed) < len(raw) else raw


def _unpack_json(data: bytes) -> Any:
    if data[:1] == b"x":  # zlib header; JSON starts with '{' or '['
        data = zlib.decompress(data)
    return orjson.loads(data)


def _resolve_all(results: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    for fut, value, exc in results:
        if fut.done():
            continue
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(value)


_SELECT_SESSION = (
    "SELECT session_id, group_id, task_id, status, created_at, num_calls, num_tokens, data"
    " FROM sessions"
)


def _session_data(rec: SessionRecord) -> bytes:
    d = rec.to_dict()
    for name in (*_SESSION_COLUMNS, "num_calls", "num_tokens"):
        d.pop(name, None)
    return orjson.dumps(d)


def _session_from_row(row: Sequence[Any]) -> SessionRecord:
    data = orjson.loads(row[7])
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
    rows = conn.execute(
        "SELECT idx, call_id, parent_call_id, shared_prefix_len, new_prompt, completion,"
        " logprobs, experts, shared_messages, new_messages, meta FROM calls"
        " WHERE session_id = ? ORDER BY idx",
        (session_id,),
    ).fetchall()
    blobs: dict[str, Any] = {}
    full: dict[str, np.ndarray] = {}
    calls: list[ModelCall] = []
    prev_messages: list[Any] = []
    for (
        idx,
        call_id,
        parent_id,
        shared,
        new_prompt,
        completion,
        logprobs,
        experts,
        sm,
        nm,
        m,
    ) in rows:
        new_ids = np.frombuffer(new_prompt, dtype="<i4").astype(np.int32)
        if parent_id is not None and shared:
            prompt = np.concatenate([full[parent_id][:shared], new_ids])
        else:
            prompt = new_ids
        comp = np.frombuffer(completion, dtype="<i4").astype(np.int32)
        full[call_id] = np.concatenate([prompt, comp])
        meta = _unpack_json(m)
        request = dict(meta.pop("request", None) or {})
        tools = request.get("tools")
        if isinstance(tools, dict) and "$blob" in tools:
            key = tools["$blob"]
            if key not in blobs:
                got = conn.execute("SELECT data FROM blobs WHERE hash = ?", (key,)).fetchone()
                if got is None:
                    raise LookupError(
                        f"call {call_id!r} (index {idx}) of session {session_id!r} refers to "
                        f"tool schemas {key!r} that are missing from the store file; the file "
                        "is damaged"
                    )
                blobs[key] = orjson.loads(got[0])
            request["tools"] = blobs[key]
        if nm is not None:
            messages = prev_messages[: int(sm or 0)] + _unpack_json(nm)
            request["messages"] = messages
            prev_messages = messages
        shape = meta.pop("experts_shape", None)
        meta.pop("superseded_by", None)
        routed = None
        if experts is not None:
            routed = np.frombuffer(experts, dtype="<i2").astype(np.int16).reshape(shape)
        calls.append(
            ModelCall.model_construct(
                call_id=call_id,
                session_id=session_id,
                index=idx,
                prompt_ids=prompt,
                completion_ids=comp,
                logprobs=np.frombuffer(logprobs, dtype="<f4").astype(np.float32),
                routed_experts=routed,
                parent_call_id=parent_id,
                shared_prefix_len=shared,
                request=request,
                **meta,
            )
        )
    return calls
