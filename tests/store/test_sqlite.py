"""The store conformance suite on SQLite, plus SQLite-specific checks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

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


def test_redis_url_says_only_sqlite_exists() -> None:
    with pytest.raises(ValueError, match="only the SQLite store") as exc:
        open_store("redis://localhost:6379")
    assert "pip install" not in str(exc.value)
