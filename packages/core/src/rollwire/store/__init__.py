"""Where captured calls live: the :class:`Store` protocol and its backends.

``open_store("sqlite:PATH")`` or ``open_store("sqlite::memory:")`` gives the embedded SQLite store.
"""

from __future__ import annotations

from rollwire.store.base import (
    CompletionConflict,
    SessionClosed,
    SessionExists,
    SessionNotFound,
    SessionRecord,
    Store,
)
from rollwire.store.sqlite import SQLiteStore

__all__ = [
    "CompletionConflict",
    "SQLiteStore",
    "SessionClosed",
    "SessionExists",
    "SessionNotFound",
    "SessionRecord",
    "Store",
    "open_store",
]


def open_store(url: str | Store) -> Store:
    """A store from a URL: ``sqlite:PATH`` or ``sqlite::memory:`` (a Store passes through)."""
    if not isinstance(url, str):
        return url
    if url.startswith("sqlite:"):
        path = url[len("sqlite:") :]
        if path.startswith("//"):
            path = path[2:]
        return SQLiteStore(path or ":memory:")
    if url.startswith(("redis:", "rediss:")):
        raise ValueError(
            f"store {url!r}: only the SQLite store exists in this version of rollwire; use "
            "'sqlite:PATH' (the 'redis' extra is reserved for a later shared backend and does "
            "not add one today)"
        )
    raise ValueError(f"unknown store {url!r}: use 'sqlite:PATH' or 'sqlite::memory:'")
