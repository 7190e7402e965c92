"""The SQLite store's connections: one writer committing the writes of a loop iteration or two
as one batch, pooled readers, and WAL checkpoints on their own thread.

Writes from the event loop are queued; one loop iteration after the first of them (so that the
answers of the next I/O poll join it: group commit), everything queued runs in one transaction (a
failure reruns each operation alone, so one bad write fails alone) and the callers' futures
resolve after ``COMMIT``. The batch commits right there on the event loop when the writer is free
and the file's write lock can be taken at once: a commit to the WAL is a write to the page cache
(``synchronous=NORMAL``: no fsync), cheaper than handing the batch to a thread and its answer
back. Otherwise (the writer thread still busy with earlier batches, another connection holding
the lock, or any error) the batch goes to the writer thread, in order, which waits for the lock
and does the one-by-one rerun. Reads use separate connections on a small thread pool, so they
never wait for the writer.

The WAL stays bounded without blocking a request: the checkpoint thread runs ``PASSIVE``
checkpoints (they never wait for the writer or readers) once the WAL passes 1/8 of its bound (at
the latest every ten intervals, and at once past the bound), and ``journal_size_limit`` (1/8 of
the bound) makes SQLite truncate the WAL file each time the writer restarts it after a complete
checkpoint. Once the writer has been quiet for a whole interval, a ``TRUNCATE`` checkpoint folds
the WAL back and empties the file, so an idle store does not keep a WAL of its last burst.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from rollwire.store.base import StoreUnavailable

__all__ = ["SQLiteConnections", "WriteBatch"]

T = TypeVar("T")
Op = Callable[[sqlite3.Connection], Any]
_Outcome = tuple[asyncio.Future[Any], Any, BaseException | None]  # (future, result, error)
# Seconds between the writer's looks at the WAL's size (far less than the bound is written in it).
_WAL_CHECK_INTERVAL = 0.05
_IDLE_CHECKPOINT_ROUNDS = 10  # a WAL under 1/8 of its bound is checkpointed every 10 intervals
_OUTAGE_MESSAGES = ("disk is full", "disk i/o error", "unable to open", "readonly database")


class WriteBatch:
    """Hooks the store runs around each batch transaction on the writer thread."""

    def begin(self) -> None:
        """Called before the operations of a transaction run."""

    def before_commit(self, conn: sqlite3.Connection) -> None:
        """Last statements of the transaction (raising rolls it back)."""

    def rolled_back(self) -> None:
        """The transaction was rolled back: forget in-memory state it changed."""


def unavailable(path: str, exc: BaseException) -> BaseException:
    """A :class:`StoreUnavailable` for errors that mean the file cannot take writes now."""
    text = str(exc).lower()
    if isinstance(exc, sqlite3.OperationalError) and any(m in text for m in _OUTAGE_MESSAGES):
        return StoreUnavailable(
            f"the SQLite store {path} cannot take writes ({exc}); nothing was recorded. "
            "Free disk space (or fix the file's permissions) and retry"
        )
    return exc


class SQLiteConnections:
    """Writer thread, reader pool and checkpointer of one SQLite file."""

    def __init__(
        self,
        path: str,
        hooks: WriteBatch,
        schema: str,
        *,
        readers: int = 4,
        checkpoint_interval: float = 1.0,
        wal_limit_bytes: int = 64 * 1024 * 1024,
        max_bytes: int | None = None,
        migrate: Callable[[sqlite3.Connection], None] | None = None,
    ) -> None:
        self.path = path
        self._hooks = hooks
        self._wal_limit = int(wal_limit_bytes)
        self._max_bytes = None if max_bytes is None else int(max_bytes)
        init = self.connect()  # before any thread opens the file (it may become WAL now)
        init.executescript(schema)
        if migrate is not None:
            migrate(init)  # bring a file written by an earlier version up to the schema
        init.close()
        self._lock = threading.Lock()
        self._pending: list[tuple[Op, asyncio.Future[Any]]] = []
        self._kick_scheduled = False
        self._kick_loop: asyncio.AbstractEventLoop | None = None
        self._queue: queue.SimpleQueue[list[Any] | None] = queue.SimpleQueue()
        self._dirty = threading.Event()  # written since the last checkpoint
        self._wrote = threading.Event()  # written since the checkpoint thread's last round
        self._wake = threading.Event()
        self._wal = path + "-wal"
        self._next_wal_check = 0.0  # writer: when to look at the WAL's size again
        # The writer's connection, used by one of the event loop (inline) and the writer thread
        # at a time (``_run_lock``). Its busy timeout is 0 but while the thread runs a batch: an
        # inline BEGIN never waits on the loop, it hands the batch over.
        self._conn = self.connect()
        self._conn.execute("PRAGMA wal_autocheckpoint=0")  # checkpoints run on their own thread
        self._conn.execute("PRAGMA busy_timeout=0")
        self._run_lock = threading.Lock()
        self._queued = 0  # batches handed to the writer thread and not committed yet
        self.closed = False
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

    def connect(self) -> sqlite3.Connection:
        """A new connection with the store's pragmas."""
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=10000")
        # Truncated to this each time a complete checkpoint lets the writer start the WAL over.
        conn.execute(f"PRAGMA journal_size_limit={max(0, self._wal_limit // 8)}")
        if self._max_bytes is not None:
            # A write that would grow the file past this is SQLITE_FULL, as on a full disk.
            page = conn.execute("PRAGMA page_size").fetchone()[0]
            conn.execute(f"PRAGMA max_page_count={max(1, self._max_bytes // page)}")
        return conn

    # ----------------------------------------------------------------- reads
    def _reader(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self.connect()
            self._local.conn = conn
            with self._lock:
                self._reader_conns.append(conn)
        return conn

    async def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` on a reader connection in the pool."""
        if self.closed:
            raise RuntimeError(f"SQLite store {self.path} is closed")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._readers, lambda: fn(self._reader()))
        except sqlite3.OperationalError as exc:
            raise unavailable(self.path, exc) from exc

    # ----------------------------------------------------------------- writes
    def submit(self, fn: Callable[[sqlite3.Connection], T]) -> asyncio.Future[T]:
        """Queue ``fn`` for the writer; the future resolves after its transaction commits."""
        if self.closed:
            raise RuntimeError(f"SQLite store {self.path} is closed")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        with self._lock:
            self._pending.append((fn, fut))
            # A kick scheduled on another loop may never run (that loop can stop and close
            # first: a run_until_complete that ends right after a write nobody awaits): this
            # loop then schedules its own. A kick takes whatever is pending, so a second one
            # finds nothing and returns.
            schedule = not self._kick_scheduled or self._kick_loop is not loop
            self._kick_scheduled = True
            self._kick_loop = loop
        if schedule:
            # One loop iteration later than the next: the answers that arrive in the I/O poll
            # between them join this batch (group commit). At 16 calls in flight that halves
            # the commits, for one loop iteration of latency.
            loop.call_soon(loop.call_soon, self.kick)
        return fut

    def kick(self) -> None:
        """Commit everything queued so far: here, when the writer is free and the lock can be
        taken at once; else on the writer thread, after the batches handed to it before."""
        with self._lock:
            batch, self._pending = self._pending, []
            self._kick_scheduled = False
        if not batch:
            return
        if self._queued == 0 and self._run_lock.acquire(blocking=False):
            try:
                # Checked again under the lock: a batch queued meanwhile commits first.
                if self._queued == 0 and self._run_inline(batch):
                    return
            finally:
                self._run_lock.release()
        self._hand_over(batch)

    def _hand_over(self, batch: list[tuple[Op, asyncio.Future[Any]]]) -> None:
        with self._lock:
            self._queued += 1
        self._queue.put(batch)

    def _writer_main(self) -> None:
        stop = False
        while not stop:
            first = self._queue.get()
            if first is None:
                break
            items = list(first)
            batches = 1
            while True:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                items.extend(more)
                batches += 1
            with self._run_lock:
                self._conn.execute("PRAGMA busy_timeout=10000")
                try:
                    self._run_batch(self._conn, items)
                finally:
                    self._conn.execute("PRAGMA busy_timeout=0")
            with self._lock:
                self._queued -= batches
        with self._run_lock:
            self._conn.close()

    def _run_inline(self, items: list[Any]) -> bool:
        """Commit ``items`` in one transaction on the calling thread; False (nothing changed)
        when the lock is taken or anything fails: the writer thread then runs them."""
        try:
            outcomes = self._transaction(self._conn, items)  # busy timeout 0: lock now or never
        except Exception:
            return False
        except BaseException:
            self._hand_over(items)  # interrupted: the writer thread still commits them
            raise
        self._committed()
        try:
            here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # close() from a plain thread
            here = None
        _deliver(outcomes, here)
        return True

    def _run_batch(self, conn: sqlite3.Connection, items: list[Any]) -> None:
        try:
            outcomes = self._transaction(conn, items)
        except Exception:
            # Rare: some operation failed. Run each one in its own transaction, so only the
            # failing ones fail.
            outcomes = [self._run_one(conn, fn, fut) for fn, fut in items]
        self._committed()
        _deliver(outcomes, None)

    def _transaction(self, conn: sqlite3.Connection, items: list[Any]) -> list[_Outcome]:
        """Run ``items`` in one transaction and commit; on any failure roll back what began
        and raise."""
        self._hooks.begin()
        began = False
        try:
            conn.execute("BEGIN IMMEDIATE")
            began = True
            outcomes: list[_Outcome] = [(fut, fn(conn), None) for fn, fut in items]
            self._hooks.before_commit(conn)
            conn.execute("COMMIT")
        except BaseException:
            if began:
                with contextlib.suppress(Exception):
                    conn.execute("ROLLBACK")
                self._hooks.rolled_back()
            raise
        return outcomes

    def _committed(self) -> None:
        """After a batch: tell the checkpoint thread, and wake it at once past the WAL's bound."""
        if not self._dirty.is_set():  # set once per checkpoint round, not once per batch
            self._dirty.set()
        if not self._wrote.is_set():
            self._wrote.set()
        if self._wal_limit > 0:
            now = time.monotonic()
            if now >= self._next_wal_check:  # a stat per batch would cost more than the bound
                self._next_wal_check = now + _WAL_CHECK_INTERVAL
                if _size(self._wal) > self._wal_limit:
                    self._wake.set()  # over the limit: checkpoint now, not at the next interval

    def _run_one(
        self, conn: sqlite3.Connection, fn: Op, fut: Any
    ) -> tuple[asyncio.Future[Any], Any, BaseException | None]:
        self._hooks.begin()
        try:
            conn.execute("BEGIN IMMEDIATE")
            result = fn(conn)
            self._hooks.before_commit(conn)
            conn.execute("COMMIT")
        except Exception as exc:
            with contextlib.suppress(Exception):
                conn.execute("ROLLBACK")
            self._hooks.rolled_back()
            return fut, None, unavailable(self.path, exc)
        return fut, result, None

    # ----------------------------------------------------------------- checkpoints
    def _checkpoint_main(self) -> None:
        conn: sqlite3.Connection | None = None
        idle_rounds = 0
        truncate_when_quiet = False
        while True:
            self._wake.wait(self._checkpoint_interval)
            self._wake.clear()
            if self._stop_checkpoints.is_set():
                break
            if conn is None:
                conn = self._checkpoint_connection()
                if conn is None:
                    continue
            if self._wrote.is_set():
                self._wrote.clear()
                truncate_when_quiet = True
            elif truncate_when_quiet:
                # No write for a whole interval: fold every frame back and empty the WAL file
                # (nothing is waiting on the writer now; busy, it gives up and tries next round).
                if _checkpoint(conn, "TRUNCATE"):
                    truncate_when_quiet = False
                    self._dirty.clear()
                    idle_rounds = 0
                continue
            if not self._dirty.is_set():
                continue
            idle_rounds += 1
            if idle_rounds < _IDLE_CHECKPOINT_ROUNDS and _size(self._wal) < self._wal_limit // 8:
                # Well under the bound: let frames pile up (pages rewritten every batch, like
                # the session counters, are then copied once, not once a second).
                continue
            idle_rounds = 0
            self._dirty.clear()
            # PASSIVE never waits on the writer or a reader; once it has copied every frame,
            # the writer's next transaction starts the WAL over and truncates the file to
            # journal_size_limit.
            _checkpoint(conn, "PASSIVE")
            if self._wal_limit > 0 and _size(self._wal) > self._wal_limit:
                # Steady writes beside readers never let PASSIVE catch up: a TRUNCATE that waits
                # up to 100 ms for the writer and the readers in between (new writes wait
                # meanwhile: the event loop's commit hands its batch to the writer thread rather
                # than wait), copies the frames written since and empties the file.
                _truncate_waiting(conn, 100)
        if conn is not None:
            conn.close()

    def _checkpoint_connection(self) -> sqlite3.Connection | None:
        try:
            conn = self.connect()
            conn.execute("PRAGMA busy_timeout=0")  # never queue up behind the writer
        except sqlite3.Error:
            return None
        return conn

    # ----------------------------------------------------------------- lifecycle
    def close(self) -> None:
        """Finish queued writes, stop the threads, close every connection (idempotent)."""
        if self.closed:
            return
        self.kick()
        self.closed = True
        self._queue.put(None)
        self._writer.join()
        self._stop_checkpoints.set()
        self._wake.set()
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


def _checkpoint(conn: sqlite3.Connection, mode: str) -> bool:
    """Run a ``mode`` checkpoint; True when it completed (False when busy or failing)."""
    try:
        row = conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()
    except sqlite3.Error:
        return False
    return row is not None and row[0] == 0


def _truncate_waiting(conn: sqlite3.Connection, ms: int) -> bool:
    """A ``TRUNCATE`` checkpoint that waits up to ``ms`` for the lock (the connection's busy
    timeout is 0 otherwise)."""
    try:
        conn.execute(f"PRAGMA busy_timeout={int(ms)}")
    except sqlite3.Error:
        return False
    try:
        return _checkpoint(conn, "TRUNCATE")
    finally:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("PRAGMA busy_timeout=0")


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _deliver(
    outcomes: list[tuple[asyncio.Future[Any], Any, BaseException | None]],
    here: asyncio.AbstractEventLoop | None,
) -> None:
    """Resolve each future on its own loop: at once on ``here`` (the running one)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[Any]] = {}
    for outcome in outcomes:
        by_loop.setdefault(outcome[0].get_loop(), []).append(outcome)
    for loop, results in by_loop.items():
        if loop is here:
            _resolve_all(results)
            continue
        with contextlib.suppress(RuntimeError):  # loop closed: nobody is waiting
            loop.call_soon_threadsafe(_resolve_all, results)


def _resolve_all(results: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    for fut, value, exc in results:
        if fut.done():
            continue
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(value)
