"""Redis store: the shared backend, so several gateway processes serve the same sessions.

Every write is one Lua script (``redis_scripts``), so its checks and effects are atomic on the
server: an append checks that the session exists and is not terminal, assigns the index, stores
the call and bumps the counters in one step, and matches an agent's retry to its original by the
request key. Writes queued in one event-loop tick go out as one pipeline on one connection, in
the order they were made (``redis_writer``); the call returns once Redis has run its script. With
``appendonly yes`` the call is then in the AOF: a ``kill -9`` of the gateway, or of Redis, loses
nothing that was answered.

Prompts are delta-encoded as in SQLite (``codec``) against what this process remembers of the
session; when another gateway has stored calls of the session since, the script refuses with
``stale``, and the writer re-reads the new calls and sends the append again.

Keys (under ``prefix``): ``s:<id>`` session hash, ``c:<id>`` list of packed calls, ``r:<id>``
request keys, ``o:<id>`` per-call updates (retry matching), ``x:<id>`` stale flag, ``t:<hash>``
tool schemas, ``idx:all|g:<group>|st:<status>`` sorted sets by creation, ``kv:<name>`` settings.
Redis Cluster is not supported (scripts touch keys of several slots).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import orjson

from rollwire.data.protocol import TERMINAL_STATUSES, ModelCall
from rollwire.store import codec
from rollwire.store.base import SessionRecord
from rollwire.store.redis_records import record_from_hash, text, unpack_value
from rollwire.store.redis_writer import RedisWriter, WriteOp

try:
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff
except ImportError as exc:  # pragma: no cover - the extra is part of the dev environment
    raise ImportError(
        "the Redis store needs the 'redis' package: pip install 'rollwire[redis]'"
    ) from exc

__all__ = ["RedisStore"]


class RedisStore:
    """The shared store (see the module docstring). ``url`` is a redis-py URL
    (``redis://host:port/db``, ``rediss://`` for TLS, ``unix:///path``); at most
    ``max_connections`` connections (reads wait for a free one; writes use one at a time)."""

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "rollwire:",
        socket_timeout: float = 10.0,
        connect_timeout: float = 2.0,
        max_connections: int = 64,
    ) -> None:
        self.url = url
        self.prefix = prefix
        # No silent retries: a write whose answer was lost may have happened; the caller hears
        # StoreUnavailable and the agent's own retry is matched by its request key.
        # A bounded pool that makes excess requests wait for a connection (redis-py's default
        # pool refuses them with "Too many connections" under load).
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=socket_timeout,
            retry=Retry(NoBackoff(), 0),
            socket_timeout=socket_timeout,
            socket_connect_timeout=connect_timeout,
        )
        client = aioredis.Redis(connection_pool=pool)
        self._r = client
        self._w = RedisWriter(client, url, prefix)

    def __repr__(self) -> str:
        return f"RedisStore({self.url!r}, prefix={self.prefix!r})"

    # ----------------------------------------------------------------- sessions
    async def create_session(self, record: SessionRecord) -> SessionRecord:
        """Persist a new session; :class:`SessionExists` when the id is taken."""
        result: SessionRecord = await self._w.submit(WriteOp("create", record.session_id, record))
        return result

    async def get_session(self, session_id: str) -> SessionRecord | None:
        """The session's record, or None."""
        h = await self._w.read(lambda: self._r.hgetall(self._w.k("s", session_id)))
        return record_from_hash(session_id, h) if h else None

    async def list_sessions(
        self,
        group_id: str | None = None,
        status: str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[SessionRecord]:
        """Sessions, oldest first, optionally filtered by group and/or status."""
        if group_id is not None:
            index = self._w.k("idx", "g:" + group_id)
        elif status is not None:
            index = self._w.k("idx", "st:" + status)
        else:
            index = self._w.k("idx", "all")
        filtered = group_id is not None and status is not None
        lo = 0 if filtered else max(0, offset)
        hi = -1 if filtered or limit is None else lo + max(0, limit) - 1
        if limit is not None and limit <= 0:
            return []

        async def read() -> list[SessionRecord]:
            members = await self._r.zrange(index, lo, hi)
            if not members:
                return []
            pipe = self._r.pipeline(transaction=False)
            for m in members:
                pipe.hgetall(self._w.k("s", text(m)[16:]))
            hashes = await pipe.execute()
            return [record_from_hash(text(m)[16:], h) for m, h in zip(members, hashes) if h]

        recs = await self._w.read(read)
        if filtered:
            recs = [r for r in recs if r.status == status][max(0, offset) :]
            if limit is not None:
                recs = recs[:limit]
        return recs

    async def delete_session(self, session_id: str) -> bool:
        """Remove a session and its calls; False when there was none."""
        result: bool = await self._w.submit(WriteOp("delete", session_id))
        return result

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
        if status not in TERMINAL_STATUSES:
            raise ValueError(
                f"status {status!r} is not terminal: use one of {sorted(TERMINAL_STATUSES)}"
            )
        op = WriteOp(
            "complete", session_id, status, reward, dict(metrics or {}), error, time.time()
        )
        result: tuple[SessionRecord, bool] = await self._w.submit(op)
        return result

    # ----------------------------------------------------------------- calls
    async def append_call(self, call: ModelCall, *, request_key: str | None = None) -> ModelCall:
        """Store ``call`` durably (see :class:`~rollwire.store.base.Store`)."""
        op = WriteOp("append", call.session_id)
        op.call = call
        op.key = request_key
        result: ModelCall = await self._w.submit(op)
        return result

    async def mark_superseded(self, session_id: str, call_id: str, by: str) -> None:
        """Mark an earlier call non-trainable because the agent retried it as ``by``."""
        await self._w.submit(WriteOp("supersede", session_id, call_id, by))

    async def calls(self, session_id: str) -> list[ModelCall]:
        """The session's calls in index order, with full prompts and messages rebuilt."""

        async def read() -> list[ModelCall]:
            pipe = self._r.pipeline(transaction=False)
            pipe.lrange(self._w.k("c", session_id), 0, -1)
            pipe.hgetall(self._w.k("o", session_id))
            values, raw_overrides = await pipe.execute()
            unpacked = [unpack_value(v) for v in values]
            hashes = sorted({h for _, h in unpacked if h})
            blobs: dict[str, bytes | None] = {}
            if hashes:
                found = await self._r.mget([self._w.k("t", h) for h in hashes])
                blobs = {h: f for h, f in zip(hashes, found) if isinstance(f, bytes)}
            overrides: dict[str, dict[str, Any]] = {}
            for field, value in raw_overrides.items():
                call_id, _, what = text(field).rpartition("\t")
                name = "superseded_by" if what == "sup" else "retry_of"
                overrides.setdefault(call_id, {})[name] = text(value)
            return codec.decode_calls(
                session_id, [row for row, _ in unpacked], blobs.get, overrides=overrides
            )

        return await self._w.read(read)

    # ----------------------------------------------------------------- settings
    async def get_setting(self, name: str) -> Any:
        """A shared setting (JSON value), or None when unset or expired."""
        raw = await self._w.read(lambda: self._r.get(self._w.k("kv", name)))
        return None if raw is None else orjson.loads(raw)

    async def get_settings(self, names: Sequence[str]) -> dict[str, Any]:
        """The set, unexpired settings among ``names`` (one MGET: one snapshot)."""
        if not names:
            return {}
        keys = [self._w.k("kv", name) for name in names]
        values = await self._w.read(lambda: self._r.mget(keys))
        return {n: orjson.loads(v) for n, v in zip(names, values, strict=True) if v is not None}

    async def set_setting(self, name: str, value: Any, *, ttl: float | None = None) -> None:
        """Set (``None``: remove) a shared setting, optionally expiring after ``ttl`` seconds."""
        key = self._w.k("kv", name)
        if value is None:
            await self._w.read(lambda: self._r.delete(key))
            return
        data = orjson.dumps(value)
        px = max(1, int(ttl * 1000)) if ttl is not None else None
        await self._w.read(lambda: self._r.set(key, data, px=px))

    async def settings_with_prefix(self, prefix: str) -> dict[str, Any]:
        """Every unexpired setting whose name starts with ``prefix`` (SCAN, then MGET)."""
        head = self._w.k("kv", "")
        pattern = head + "".join("\\" + c if c in "*?[]\\" else c for c in prefix) + "*"

        async def read() -> dict[str, Any]:
            keys = [k async for k in self._r.scan_iter(match=pattern, count=500)]
            if not keys:
                return {}
            values = await self._r.mget(keys)
            out: dict[str, Any] = {}
            for key, raw in zip(keys, values, strict=True):
                if raw is not None:
                    name = key.decode() if isinstance(key, bytes) else str(key)
                    out[name[len(head) :]] = orjson.loads(raw)
            return out

        return await self._w.read(read)

    # ----------------------------------------------------------------- measurements
    async def ping(self) -> None:
        """Raise :class:`StoreUnavailable` when Redis does not answer."""
        await self._w.read(self._r.ping)

    async def session_bytes(self, session_id: str) -> int:
        """Bytes of stored call values of a session plus the tool schemas they use."""

        async def read() -> int:
            raw = await self._r.lrange(self._w.k("c", session_id), 0, -1)  # type: ignore[misc]
            values = [v for v in raw if isinstance(v, bytes)]
            hashes = sorted({h for _, h in (unpack_value(v) for v in values) if h})
            tools = await self._r.mget([self._w.k("t", h) for h in hashes]) if hashes else []
            return sum(len(v) for v in values) + sum(len(t or b"") for t in tools)

        return await self._w.read(read)

    # ----------------------------------------------------------------- lifecycle
    async def close(self) -> None:
        """Finish queued writes and close the connections (safe to call twice)."""
        if self._w.closed:
            return
        await self._w.drain()
        self._w.closed = True
        await self._r.aclose(close_connection_pool=True)
