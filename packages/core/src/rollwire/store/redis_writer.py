"""The Redis store's writer: every write of one event-loop tick goes out as one pipeline of
scripts on one connection, in the order the writes were made (see ``redis_scripts``).

A script that finds the session moved on by another writer answers ``stale``; the writer re-reads
what it missed of the session and sends that write (and the later ones of the same session) again.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson

from rollwire.data.protocol import ModelCall
from rollwire.store import codec
from rollwire.store.base import (
    SessionClosed,
    SessionExists,
    SessionNotFound,
    StoreUnavailable,
    same_outcome,
)
from rollwire.store.redis_records import (
    conflict,
    pack_value,
    pairs,
    record_data,
    record_from_hash,
    text,
    unpack_value,
)
from rollwire.store.redis_scripts import APPEND, COMPLETE, CREATE, DELETE, TERMINAL_LUA

try:
    import redis.asyncio as aioredis
    from redis.exceptions import (
        BusyLoadingError,
        NoScriptError,
        ReadOnlyError,
        RedisError,
        ResponseError,
    )
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError
except ImportError as exc:  # pragma: no cover - the extra is part of the dev environment
    raise ImportError(
        "the Redis store needs the 'redis' package: pip install 'rollwire[redis]'"
    ) from exc

__all__ = ["RedisWriter", "WriteOp"]

T = TypeVar("T")
_OUTAGE = (RedisConnectionError, RedisTimeoutError, BusyLoadingError, ReadOnlyError, OSError)
_MAX_TRIES = 50  # stale re-sends of one write before giving up (another writer never stops)


def _retrieve(fut: asyncio.Future[Any]) -> None:
    """Read an unawaited future's outcome (else asyncio logs an exception nobody retrieved)."""
    if not fut.cancelled():
        fut.exception()


_SCRIPTS = {
    name: TERMINAL_LUA + src
    for name, src in (
        ("create", CREATE),
        ("append", APPEND),
        ("complete", COMPLETE),
        ("delete", DELETE),
    )
}
_SHAS = {name: hashlib.sha1(src.encode()).hexdigest() for name, src in _SCRIPTS.items()}


class WriteOp:
    """One queued write and the future its caller awaits."""

    __slots__ = ("args", "call", "enc", "fut", "key", "kind", "session_id", "tries")

    def __init__(self, kind: str, session_id: str, *args: Any) -> None:
        self.kind = kind
        self.session_id = session_id
        self.args = args
        self.call: ModelCall | None = None
        self.key: str | None = None
        self.enc: codec.EncodedCall | None = None
        self.tries = 0
        self.fut: asyncio.Future[Any]


class RedisWriter:
    """Queues writes, sends them as pipelines, resolves their futures; also the key names and
    error mapping the store's reads share."""

    def __init__(self, client: aioredis.Redis, url: str, prefix: str) -> None:
        self.r = client
        self.url = url
        self.prefix = prefix
        self._deltas = codec.DeltaCache()
        self._resync: dict[str, codec.SessionDeltas] = {}  # stale sessions: re-read from here
        self._pending: list[WriteOp] = []
        self._flusher: asyncio.Task[None] | None = None
        self._writer_id = secrets.token_hex(6)
        self._batches = itertools.count()
        self._known_tools: set[str] = set()
        self.closed = False

    # ----------------------------------------------------------------- keys
    def k(self, kind: str, name: str) -> str:
        return f"{self.prefix}{kind}:{name}"

    def _session_keys(self, sid: str) -> list[str]:
        return [self.k(k, sid) for k in ("s", "c", "r", "o", "x")]

    # ----------------------------------------------------------------- errors
    def _unavailable(self, exc: BaseException) -> StoreUnavailable:
        return StoreUnavailable(
            f"the Redis store at {self.url} is unavailable ({type(exc).__name__}: {exc}); "
            "nothing was recorded, retry once it is back"
        )

    def _error(self, exc: BaseException) -> BaseException:
        if isinstance(exc, _OUTAGE):
            return self._unavailable(exc)
        if isinstance(exc, ResponseError) and str(exc).startswith(("OOM", "MISCONF")):
            return self._unavailable(exc)  # Redis refuses writes (full memory, failed saves)
        return exc

    async def read(self, fn: Callable[[], Awaitable[T]]) -> T:
        if self.closed:
            raise RuntimeError(f"the Redis store at {self.url} is closed")
        try:
            return await fn()
        except RedisError as exc:
            raise self._error(exc) from exc
        except OSError as exc:
            raise self._unavailable(exc) from exc

    # ----------------------------------------------------------------- writer
    def submit(self, op: WriteOp) -> asyncio.Future[Any]:
        if self.closed:
            raise RuntimeError(f"the Redis store at {self.url} is closed")
        loop = asyncio.get_running_loop()
        op.fut = loop.create_future()
        self._pending.append(op)
        flusher = self._flusher
        if flusher is not None and not flusher.done() and flusher.get_loop() is not loop:
            # A flusher made on another loop may never finish (that loop can stop and close
            # first: a run_until_complete that ends right after a write nobody awaits), and
            # while it looks alive no other one starts. This loop flushes, those writes too.
            self._adopt_orphans(loop)
            flusher = None
        if flusher is None or flusher.done():
            # Runs on the next loop iteration: everything queued in this tick goes together.
            self._flusher = loop.create_task(self._flush())
        return op.fut

    def _adopt_orphans(self, loop: asyncio.AbstractEventLoop) -> None:
        """Give the queued writes whose loop has closed a future on ``loop``: they are still
        written, and nobody can be waiting for their answer any more."""
        for op in self._pending:
            if op.fut.get_loop().is_closed():
                op.fut = loop.create_future()
                op.fut.add_done_callback(_retrieve)

    async def _flush(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                await self._run_batch(batch)
            except BaseException as exc:
                err = self._error(exc) if isinstance(exc, Exception) else exc
                for op in batch:
                    self._deltas.drop(op.session_id)
                    if not op.fut.done():
                        if isinstance(err, Exception):
                            op.fut.set_exception(err)
                        else:
                            op.fut.cancel()
                if not isinstance(exc, Exception):
                    raise

    async def _run_batch(self, batch: list[WriteOp]) -> None:
        await self._load_deltas({op.session_id for op in batch if op.kind == "append"})
        batch_id = f"{self._writer_id}:{next(self._batches)}"
        pipe = self.r.pipeline(transaction=False)
        for op in batch:
            self._queue(pipe, op, batch_id)
        results = await pipe.execute(raise_on_error=False)
        again: list[WriteOp] = []
        noscript = False
        for op, res in zip(batch, results):
            if isinstance(res, NoScriptError):
                noscript = True  # Redis restarted without our scripts: load and send again
                self._forget(op)
                again.append(op)
            elif isinstance(res, Exception):
                self._forget(op)
                if not op.fut.done():
                    op.fut.set_exception(self._error(res))
            elif not self._finish(op, res):
                again.append(op)
        if noscript:
            await self._load_scripts()
        for op in again:
            op.tries += 1
            if op.tries > _MAX_TRIES and not op.fut.done():
                op.fut.set_exception(
                    RuntimeError(
                        f"session {op.session_id!r}: the write was refused as stale "
                        f"{_MAX_TRIES} times in a row (other writers keep moving it on)"
                    )
                )
        self._pending[:0] = [op for op in again if not op.fut.done()]

    def _forget(self, op: WriteOp) -> None:
        if op.kind == "append":
            self._deltas.drop(op.session_id)
            self._resync.pop(op.session_id, None)

    async def _load_scripts(self) -> None:
        pipe = self.r.pipeline(transaction=False)
        for src in _SCRIPTS.values():
            pipe.script_load(src)
        await pipe.execute()

    def _evalsha(self, pipe: Any, name: str, keys: list[str], args: list[Any]) -> None:
        pipe.evalsha(_SHAS[name], len(keys), *keys, *args)

    def _queue(self, pipe: Any, op: WriteOp, batch: str) -> None:
        sid = op.session_id
        if op.kind == "append":
            self._queue_append(pipe, op, batch)
        elif op.kind == "create":
            (rec,) = op.args
            group = rec.group_id if rec.group_id is not None else ""
            self._evalsha(
                pipe,
                "create",
                [
                    self.k("s", sid),
                    self.k("idx", "all"),
                    self.k("idx", "g:" + group),
                    self.k("idx", "st:" + rec.status),
                    self.k("n", "created"),
                ],
                [
                    record_data(rec),
                    rec.status,
                    "1" if rec.group_id is not None else "0",
                    group,
                    repr(float(rec.created_at)),
                    rec.incarnation,
                    rec.num_calls,
                    rec.num_tokens,
                    sid,
                ],
            )
        elif op.kind == "complete":
            status, reward, metrics, error, at = op.args
            self._evalsha(
                pipe,
                "complete",
                [self.k("s", sid), self.k("x", sid), self.k("idx", "all")],
                [
                    batch,
                    status,
                    orjson.dumps(reward),
                    orjson.dumps(metrics),
                    orjson.dumps(error),
                    repr(at),
                    self.prefix,
                ],
            )
        elif op.kind == "delete":
            self._evalsha(
                pipe,
                "delete",
                [*self._session_keys(sid), self.k("idx", "all")],
                [batch, self.prefix],
            )
        elif op.kind == "supersede":
            call_id, by = op.args
            pipe.hset(self.k("o", sid), f"{call_id}\tsup", by)

    def _queue_append(self, pipe: Any, op: WriteOp, batch: str) -> None:
        call = op.call
        assert call is not None
        sid = op.session_id
        deltas = self._deltas.get(sid)
        if deltas is None:  # unknown session: let the script say so
            deltas = codec.SessionDeltas(0, incarnation="")
        enc = codec.encode_call(call, deltas, op.key)
        op.enc = enc
        tools = b""
        if enc.tools is not None and enc.tools_hash not in self._known_tools:
            tools = enc.tools
        # Optimistic: the next append of this session in the batch extends this one.
        codec.remember_encoded(call, enc, deltas, self._deltas)
        self._evalsha(
            pipe,
            "append",
            [
                *self._session_keys(sid),
                self.k("t", enc.tools_hash) if enc.tools_hash else self.k("s", sid),
            ],
            [
                batch,
                deltas.incarnation or "",
                enc.index,
                pack_value(enc),
                enc.n_completion,
                op.key or "",
                int(call.retry_count),
                call.retry_of or "",
                "1" if call.status == "ok" else "0",
                call.call_id,
                tools,
            ],
        )

    def _finish(self, op: WriteOp, res: Any) -> bool:
        """Resolve ``op`` from its script's answer; False when it must be sent again."""
        sid = op.session_id
        kind = text(res[0]) if isinstance(res, list) and res else None
        if kind == "stale" or res == b"stale":
            if op.kind == "append":
                self._mark_stale(op)
            return False
        if op.fut.done():
            return True
        if op.kind == "append":
            return self._finish_append(op, kind, res)
        if op.kind == "create":
            if res == 0:
                op.fut.set_exception(SessionExists(f"session {sid!r} exists already"))
            else:
                self._deltas.put(sid, codec.SessionDeltas(0, op.args[0].incarnation))
                op.fut.set_result(op.args[0])
        elif op.kind == "complete":
            if kind == "missing":
                op.fut.set_exception(SessionNotFound(sid))
                return True
            rec = record_from_hash(sid, pairs(res[1]))
            self._deltas.drop(sid)
            if kind == "ok":
                op.fut.set_result((rec, True))
            else:
                status, reward, metrics, error, _ = op.args
                if same_outcome(rec, status, reward, metrics, error):
                    op.fut.set_result((rec, False))
                else:
                    op.fut.set_exception(conflict(sid, rec, status, reward))
        elif op.kind == "delete":
            self._deltas.drop(sid)
            self._resync.pop(sid, None)
            op.fut.set_result(res == 1)
        else:
            op.fut.set_result(None)
        return True

    def _finish_append(self, op: WriteOp, kind: str | None, res: list[Any]) -> bool:
        sid = op.session_id
        call, enc = op.call, op.enc
        assert call is not None and enc is not None
        if kind == "ok":
            codec.committed(call, enc)
            if enc.tools_hash is not None:
                self._known_tools.add(enc.tools_hash)
            retry_of, by = text(res[2]), text(res[3])
            if retry_of:
                call.retry_of = retry_of
            if by:
                call.trainable = False
                if codec.SUPERSEDED_FLAG not in call.flags:
                    call.flags.append(codec.SUPERSEDED_FLAG)
            op.fut.set_result(call)
            return True
        self._forget(op)
        if kind == "closed":
            op.fut.set_exception(
                SessionClosed(
                    f"session {sid!r} is {text(res[1])}: a terminal session accepts no more calls"
                )
            )
        else:
            op.fut.set_exception(
                SessionNotFound(f"no session {sid!r}: create it before adding calls")
            )
        return True

    def _mark_stale(self, op: WriteOp) -> None:
        sid = op.session_id
        deltas = self._deltas.get(sid)
        self._deltas.drop(sid)
        if deltas is not None and op.enc is not None and deltas.truncate(op.enc.index):
            self._resync.setdefault(sid, deltas)

    async def _load_deltas(self, sids: set[str]) -> None:
        """Read what the writer needs to encode the next call of each uncached session."""
        todo = [sid for sid in sids if self._deltas.get(sid) is None]
        if not todo:
            return
        pipe = self.r.pipeline(transaction=False)
        starts = []
        for sid in todo:
            old = self._resync.get(sid)
            start = old.next_index if old is not None else 0
            starts.append(start)
            pipe.hmget(self.k("s", sid), "inc", "seq")
            pipe.lrange(self.k("c", sid), start, -1)
        got = await pipe.execute()
        full_reload = []
        for i, sid in enumerate(todo):
            (inc, seq), values = got[2 * i], got[2 * i + 1]
            old = self._resync.pop(sid, None)
            if inc is None:
                continue  # no such session: the append fails with SessionNotFound
            rows = [unpack_value(v)[0] for v in values]
            base = old if old is not None and old.incarnation == text(inc) else None
            if base is None and starts[i]:
                full_reload.append(sid)
                continue
            deltas = base or codec.SessionDeltas(0, text(inc))
            try:
                codec.deltas_from_rows(sid, rows, deltas, known=deltas.full_tokens())
            except LookupError:
                if base is None:
                    raise
                full_reload.append(sid)
                continue
            deltas.next_index = max(deltas.next_index, int(seq or 0))
            self._deltas.put(sid, deltas)
        if full_reload:
            await self._load_deltas(set(full_reload))

    async def drain(self) -> None:
        """Wait until every queued write is answered."""
        while self._flusher is not None and not self._flusher.done():
            await asyncio.shield(self._flusher)
