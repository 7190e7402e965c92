"""The store conformance suite on SQLite, plus SQLite-specific checks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollwire.data.protocol import ModelCall
from rollwire.store import SessionRecord, SQLiteStore, open_store
from rollwire.testing.store import StoreConformance, make_call


class TestSQLiteStore(StoreConformance):
    @pytest.fixture
    def store_factory(self, tmp_path: Path) -> Callable[[], SQLiteStore]:
        return lambda: SQLiteStore(str(tmp_path / "store.sqlite"))


async def test_open_store_urls(tmp_path: Path) -> None:
    mem = open_store("sqlite::memory:")
    assert isinstance(mem, SQLiteStore)
    await mem.create_session(SessionRecord(session_id="s"))
    await mem.append_call(make_call("s", [1], [2]))
    assert len(await mem.calls("s")) == 1
    await mem.close()
    disk = open_store(f"sqlite:{tmp_path / 'x.db'}")
    assert isinstance(disk, SQLiteStore) and disk.path.endswith("x.db")
    await disk.close()
    with pytest.raises(ValueError, match="unknown store"):
        open_store("postgres://x")


async def test_pragmas_and_blob_columns(tmp_path: Path) -> None:
    import sqlite3

    store = SQLiteStore(str(tmp_path / "p.db"))
    await store.create_session(SessionRecord(session_id="s"))
    await store.append_call(make_call("s", list(range(10)), [1, 2, 3]))
    await store.close()
    conn = sqlite3.connect(tmp_path / "p.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    row = conn.execute("SELECT new_prompt, completion, logprobs FROM calls").fetchone()
    assert [len(b) for b in row] == [40, 12, 12]  # packed int32 / float32, not JSON
    conn.close()


async def test_missing_tools_blob_is_an_error_not_an_empty_list(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "b.db"
    store = SQLiteStore(str(path))
    await store.create_session(SessionRecord(session_id="s"))
    call = make_call("s", [1], [2])
    call.request["tools"] = [{"type": "function", "function": {"name": "f"}}]
    await store.append_call(call)
    await store.close()
    conn = sqlite3.connect(path)
    conn.execute("DELETE FROM blobs")
    conn.commit()
    conn.close()
    store = SQLiteStore(str(path))
    try:
        with pytest.raises(LookupError, match="missing"):
            await store.calls("s")
    finally:
        await store.close()


async def test_wal_stays_bounded_under_steady_load(tmp_path: Path) -> None:
    # Appends and reads without pause: the WAL file stays a small fraction of what was
    # written (PASSIVE checkpoints, a non-blocking TRUNCATE when over the limit, and
    # journal_size_limit), and is back under its limit once the load stops.
    import asyncio
    import time

    limit = 128 * 1024
    path = tmp_path / "w.db"
    store = SQLiteStore(str(path), checkpoint_interval=0.02, wal_limit_bytes=limit)
    wal = Path(str(path) + "-wal")
    sizes: list[int] = []

    def size(p: Path) -> int:
        return p.stat().st_size if p.exists() else 0

    try:
        sids = [f"s{i}" for i in range(8)]
        for sid in sids:
            await store.create_session(SessionRecord(session_id=sid))

        async def agent(sid: str) -> None:
            for i in range(150):
                # No shared prefix: every call stores its whole prompt (~8 KB).
                prompt = [i, *range(2000)]
                await store.append_call(make_call(sid, prompt, list(range(i, i + 100))))
                if i % 5 == 0:
                    await store.calls(sid)
                    sizes.append(size(wal))

        await asyncio.gather(*(agent(s) for s in sids))
        db_bytes = size(path)
        deadline = time.monotonic() + 60.0
        while size(wal) > limit and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # no event tells when the checkpointer ran
        after = size(wal)
    finally:
        await store.close()
    assert db_bytes > 60 * limit, db_bytes  # far more was written than the limit
    assert max(sizes) < db_bytes / 2, (max(sizes), db_bytes)  # unbounded: ~db_bytes
    assert after <= limit, after


async def test_wal_is_truncated_once_the_writer_is_idle(tmp_path: Path) -> None:
    # One call per transaction rewrites the same pages (the session row, the tables' last
    # leaves) each time: the WAL grows several times past the database, and must not stay
    # that size once the writes stop.
    import asyncio
    import time

    path = tmp_path / "idle.db"
    wal = Path(str(path) + "-wal")

    def size(p: Path) -> int:
        return p.stat().st_size if p.exists() else 0

    store = SQLiteStore(str(path), checkpoint_interval=0.2)
    try:
        await store.create_session(SessionRecord(session_id="s"))
        for i in range(1500):
            await store.append_call(make_call("s", [i, *range(50)], [1, 2, 3]))
        busy_wal, busy_db = size(wal), size(path)
        deadline = time.monotonic() + 60.0
        while size(wal) > 2 * size(path) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # polled: no event tells when the checkpointer ran
        idle_wal, idle_db = size(wal), size(path)
        assert len(await store.calls("s")) == 1500  # everything folded back is still there
    finally:
        await store.close()
    assert busy_wal > 2 * busy_db, (busy_wal, busy_db)  # the case this test is about
    assert idle_wal <= 2 * idle_db, (idle_wal, idle_db)


async def test_full_disk_is_store_unavailable(tmp_path: Path) -> None:
    import sqlite3

    from rollwire.store import StoreUnavailable

    path = tmp_path / "full.db"
    store = SQLiteStore(str(path))
    await store.create_session(SessionRecord(session_id="s"))
    await store.append_call(make_call("s", [1], [2]))
    await store.close()
    conn = sqlite3.connect(path)
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.close()
    store = SQLiteStore(str(path))
    try:
        # Cap the file at its current size on the writer's connection: the next big write is
        # SQLITE_FULL ("database or disk is full"), as on a full disk.
        await store._db.submit(lambda c: c.execute(f"PRAGMA max_page_count={pages + 1}"))
        with pytest.raises(StoreUnavailable, match="cannot take writes"):
            await store.append_call(make_call("s", [1, 2], list(range(50_000))))
        rec = await store.get_session("s")
        assert rec is not None and rec.num_calls == 1
        assert len(await store.calls("s")) == 1
    finally:
        await store.close()


async def test_store_url_caps_the_file(tmp_path: Path) -> None:
    store = open_store(f"sqlite:{tmp_path / 'cap.db'}?max_bytes=65536")
    assert isinstance(store, SQLiteStore)
    try:
        await store.create_session(SessionRecord(session_id="s"))
        from rollwire.store import StoreUnavailable

        with pytest.raises(StoreUnavailable, match="disk is full"):
            await store.append_call(make_call("s", [1], list(range(50_000))))
    finally:
        await store.close()
    with pytest.raises(ValueError, match="max_bytes"):
        open_store(f"sqlite:{tmp_path / 'x.db'}?max_byte=1")


async def test_request_keys_live_in_the_calls_row(tmp_path: Path) -> None:
    """A call's retry key is written with the call itself: no row of its own elsewhere."""
    import sqlite3

    from rollwire.store.codec import request_key

    path = tmp_path / "k.db"
    store = SQLiteStore(str(path))
    await store.create_session(SessionRecord(session_id="s"))
    key = request_key(b'{"messages": []}')
    first = await store.append_call(make_call("s", [1], [2]), request_key=key)
    retry = await store.append_call(make_call("s", [1], [3], retry_count=1), request_key=key)
    await store.close()
    assert retry.retry_of == first.call_id
    conn = sqlite3.connect(path)
    rows = conn.execute("SELECT call_id, request_key FROM calls ORDER BY idx").fetchall()
    assert rows == [(first.call_id, key), (retry.call_id, key)]
    assert conn.execute("SELECT COUNT(*) FROM call_keys").fetchone()[0] == 0
    conn.close()


async def test_a_file_written_before_keys_in_calls_still_matches_its_retries(
    tmp_path: Path,
) -> None:
    """A file from before the ``request_key`` column: the store adds the column when it opens
    the file, and a retry of a call stored then is matched by its ``call_keys`` row."""
    import sqlite3

    from rollwire.store.codec import request_key

    path = tmp_path / "old.db"
    store = SQLiteStore(str(path))
    await store.create_session(SessionRecord(session_id="s"))
    key = request_key(b'{"messages": ["old"]}')
    original = await store.append_call(make_call("s", [1, 2], [3]), request_key=key)
    await store.close()
    # Make it the file an earlier version wrote: no key column, the key in call_keys.
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE calls DROP COLUMN request_key")
    conn.execute(
        "INSERT INTO call_keys (session_id, request_key, call_id, retry_count, ok, matched)"
        " VALUES ('s', ?, ?, 0, 1, 0)",
        (key, original.call_id),
    )
    conn.commit()
    conn.close()
    store = SQLiteStore(str(path))
    retry = await store.append_call(make_call("s", [1, 2], [4], retry_count=1), request_key=key)
    calls = await store.calls("s")
    await store.close()
    assert retry.retry_of == original.call_id
    assert not calls[0].trainable and "superseded_by_retry" in calls[0].flags
    assert calls[1].trainable and calls[1].retry_of == original.call_id


async def test_get_settings_reads_the_set_unexpired_ones_in_one_statement(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(str(tmp_path / "settings.db"))
    try:
        await store.set_setting("gateway:paused", True)
        await store.set_setting("gateway:policy_version", {"v": 3})
        await store.set_setting("gateway:policy_version", {"v": 4})
        await store.set_setting("gateway:expired", "x", ttl=-1.0)  # expired already
        names = ["gateway:paused", "gateway:policy_version", "gateway:expired", "never-set"]
        assert await store.get_settings(names) == {
            "gateway:paused": True,
            "gateway:policy_version": {"v": 4},
        }
        assert await store.get_settings([]) == {}
        assert await store.get_setting("gateway:expired") is None
    finally:
        await store.close()


async def test_a_batch_commits_on_the_event_loop_while_the_writer_is_free(tmp_path: Path) -> None:
    import threading

    store = SQLiteStore(str(tmp_path / "inline.db"))
    ran_on: list[int] = []
    append = store._append

    def spy(conn: Any, call: ModelCall, key: str | None) -> ModelCall:
        ran_on.append(threading.get_ident())
        return append(conn, call, key)

    try:
        await store.create_session(SessionRecord(session_id="s"))
        store._append = spy  # type: ignore[method-assign]
        await store.append_call(make_call("s", [1, 2], [3]))
        assert ran_on == [threading.get_ident()]  # no hand-off to the writer thread
    finally:
        await store.close()


async def test_a_held_write_lock_hands_batches_to_the_writer_thread_in_order(
    tmp_path: Path,
) -> None:
    # Another connection holds the file's write lock: the event loop does not wait for it (the
    # batch goes to the writer thread, which does), and a later batch commits after it.
    import asyncio
    import sqlite3
    import time

    path = tmp_path / "locked.db"
    store = SQLiteStore(str(path))
    other = sqlite3.connect(path, isolation_level=None)
    try:
        await store.create_session(SessionRecord(session_id="s"))
        other.execute("BEGIN IMMEDIATE")
        first = asyncio.ensure_future(store.append_call(make_call("s", [1, 2], [3])))
        t0 = time.monotonic()
        while store._db._queued == 0 and time.monotonic() < t0 + 10.0:
            await asyncio.sleep(0)  # the loop runs on: it did not wait for the lock
        assert store._db._queued == 1 and not first.done()
        assert time.monotonic() - t0 < 5.0  # far below the writer's 10 s busy timeout
        second = asyncio.ensure_future(store.append_call(make_call("s", [1, 2, 3, 4], [5])))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not first.done() and not second.done()
        other.execute("COMMIT")
        a, b = await first, await second
        assert (a.index, b.index) == (0, 1) and b.parent_call_id == a.call_id
        assert [c.call_id for c in await store.calls("s")] == [a.call_id, b.call_id]
    finally:
        other.close()
        await store.close()


def test_a_loop_closed_before_its_commit_ran_does_not_stall_the_store(tmp_path: Path) -> None:
    """A write whose loop stops and closes before the commit it scheduled ran (a
    ``run_until_complete`` that ends right after a write nobody awaits): writes from another
    loop still commit, that one with them."""
    import asyncio

    store = SQLiteStore(str(tmp_path / "loops.db"))
    try:
        asyncio.run(store.create_session(SessionRecord(session_id="s")))

        async def write_and_leave() -> None:
            store._db.submit(lambda conn: conn.execute("SELECT 1"))  # never awaited

        # run_until_complete stops the loop right after the coroutine: the commit it scheduled
        # never runs there, and the loop closes with it still pending
        loop = asyncio.new_event_loop()
        loop.run_until_complete(write_and_leave())
        loop.close()

        async def later() -> int:
            await asyncio.wait_for(store.append_call(make_call("s", [1, 2], [3])), 10)
            return len(await store.calls("s"))

        assert asyncio.run(later()) == 1
    finally:
        asyncio.run(store.close())


async def test_a_batch_with_a_closed_and_a_missing_session_fails_only_their_appends(
    tmp_path: Path,
) -> None:
    """The batch's session counters are one executemany: a session that refused rolls the batch
    back, and the one-by-one rerun fails only the appends to the closed and the missing one."""
    import asyncio

    from rollwire.store.base import SessionClosed, SessionNotFound

    store = SQLiteStore(str(tmp_path / "c.db"))
    for sid in ("open1", "done", "open2"):
        await store.create_session(SessionRecord(session_id=sid))
    await store.complete("done")
    results = await asyncio.gather(
        store.append_call(make_call("open1", [1], [2])),
        store.append_call(make_call("done", [1], [2])),
        store.append_call(make_call("nobody", [1], [2])),
        store.append_call(make_call("open2", [1, 2], [3, 4])),
        return_exceptions=True,
    )
    assert isinstance(results[1], SessionClosed) and "accepts no more calls" in str(results[1])
    assert isinstance(results[2], SessionNotFound)
    assert isinstance(results[0], ModelCall) and isinstance(results[3], ModelCall)
    assert [len(await store.calls(s)) for s in ("open1", "done", "open2")] == [1, 0, 1]
    counted = {s: await store.get_session(s) for s in ("open1", "open2")}
    assert [(r.num_calls, r.num_tokens) for r in counted.values()] == [(1, 1), (1, 2)]
    await store.close()
