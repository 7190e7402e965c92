"""Where captured calls live: the :class:`Store` protocol and its backends.

``open_store("sqlite:PATH")`` or ``open_store("sqlite::memory:")`` gives the embedded SQLite store;
``open_store("redis://host:port/db")`` the shared Redis store (extra ``rollwire[redis]``), which
several gateway processes can use at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rollwire.store.base import (
    CompletionConflict,
    SessionClosed,
    SessionExists,
    SessionNotFound,
    SessionRecord,
    Store,
    StoreUnavailable,
)
from rollwire.store.sqlite import SQLiteStore

if TYPE_CHECKING:
    from rollwire.store.redis import RedisStore

__all__ = [
    "CompletionConflict",
    "RedisStore",
    "SQLiteStore",
    "SessionClosed",
    "SessionExists",
    "SessionNotFound",
    "SessionRecord",
    "Store",
    "StoreUnavailable",
    "open_store",
]


def __getattr__(name: str) -> Any:
    if name == "RedisStore":  # imported on use: redis is an optional dependency
        from rollwire.store.redis import RedisStore

        return RedisStore
    raise AttributeError(f"module 'rollwire.store' has no attribute {name!r}")


def open_store(url: str | Store) -> Store:
    """A store from a URL: ``sqlite:PATH``, ``sqlite::memory:``, or ``redis://host:port/db``
    (``rediss://`` for TLS, ``unix://`` for a socket; ``?prefix=NAME:`` sets the key prefix).
    ``sqlite:PATH?max_bytes=N`` caps the SQLite file at N bytes. A Store passes through."""
    if not isinstance(url, str):
        return url
    if url.startswith("sqlite:"):
        path = url[len("sqlite:") :]
        if path.startswith("//"):
            path = path[2:]
        path, sep, options_text = path.partition("?")
        if not sep:
            return SQLiteStore(path or ":memory:")
        from urllib.parse import parse_qsl

        options = dict(parse_qsl(options_text))
        max_bytes = options.pop("max_bytes", None)
        if options or max_bytes is None or not max_bytes.isdigit():
            raise ValueError(
                f"unknown options in store {url!r}: 'sqlite:PATH' takes only ?max_bytes=N "
                "(a whole number of bytes)"
            )
        return SQLiteStore(path or ":memory:", max_bytes=int(max_bytes))
    if url.startswith(("redis:", "rediss:", "unix:")):
        from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

        from rollwire.store.redis import RedisStore

        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query))
        prefix = query.pop("prefix", "rollwire:")
        rest = urlunsplit(parts._replace(query=urlencode(query)))
        return RedisStore(rest, prefix=prefix)
    raise ValueError(
        f"unknown store {url!r}: use 'sqlite:PATH', 'sqlite::memory:' or 'redis://host:port/db'"
    )
