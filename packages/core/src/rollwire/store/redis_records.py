"""How the Redis store lays out a session record (a hash) and a call (one value)."""

from __future__ import annotations

import struct
from typing import Any

import orjson

from rollwire.store import codec
from rollwire.store.base import CompletionConflict, SessionRecord

__all__ = [
    "conflict",
    "pack_value",
    "pairs",
    "record_data",
    "record_from_hash",
    "text",
    "unpack_value",
]

_MAGIC = b"RW1"
# Outcome fields kept apart from the record's immutable ``data``.
_OUTCOME = ("status", "reward", "metrics", "error", "completed_at", "num_calls", "num_tokens")


def text(value: Any) -> str:
    """``value`` as str (Redis answers bytes)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def pairs(flat: list[Any]) -> dict[bytes, bytes]:
    """A flat HGETALL answer from a script as a dict."""
    return {flat[i]: flat[i + 1] for i in range(0, len(flat), 2)}


def conflict(sid: str, rec: SessionRecord, status: str, reward: Any) -> CompletionConflict:
    return CompletionConflict(
        f"session {sid!r} was already completed with status={rec.status!r} "
        f"reward={rec.reward!r}; refusing status={status!r} reward={reward!r}",
        rec,
    )


def record_data(rec: SessionRecord) -> bytes:
    """The fixed part of a record (everything but the outcome and counters), as JSON."""
    d = rec.to_dict()
    for name in (*_OUTCOME, "session_id"):
        d.pop(name, None)
    return orjson.dumps(d)


def record_from_hash(sid: str, h: dict[Any, Any]) -> SessionRecord:
    """The record a session hash holds."""
    get = {text(k): v for k, v in h.items()}.get
    d = orjson.loads(get("data") or b"{}")
    d["session_id"] = sid
    d["status"] = text(get("status") or b"running")
    for name in ("reward", "metrics", "error"):
        raw = get(name)
        if raw is not None:
            d[name] = orjson.loads(raw)
    if d.get("metrics") is None:
        d["metrics"] = {}
    at = get("completed_at")
    d["completed_at"] = float(at) if at is not None else None
    d["num_calls"] = int(get("num_calls") or 0)
    d["num_tokens"] = int(get("num_tokens") or 0)
    return SessionRecord.from_dict(d)


def pack_value(enc: codec.EncodedCall) -> bytes:
    """One call as one Redis value: a JSON header, then the binary parts back to back."""
    parts = (enc.new_prompt, enc.completion, enc.logprobs, enc.experts, enc.new_messages)
    meta = enc.meta_bytes()
    header = orjson.dumps(
        [
            enc.index,
            enc.call_id,
            enc.parent_call_id,
            enc.shared_prefix_len,
            enc.shared_messages,
            enc.tools_hash,
            [len(p) if p is not None else -1 for p in parts],
        ]
    )
    body = b"".join(p for p in parts if p)
    return b"".join((_MAGIC, struct.pack("<I", len(header)), header, body, meta))


def unpack_value(value: bytes) -> tuple[codec.CallRow, str | None]:
    """A stored call value as a row for :func:`codec.decode_calls`, and its tools hash."""
    if value[:3] != _MAGIC:
        raise ValueError(f"not a rollwire call value (starts {value[:8]!r}); wrong key prefix?")
    (n,) = struct.unpack_from("<I", value, 3)
    idx, call_id, parent, shared, sm, tools, lengths = orjson.loads(value[7 : 7 + n])
    pos = 7 + n
    out: list[bytes | None] = []
    for length in lengths:
        if length < 0:
            out.append(None)
        else:
            out.append(value[pos : pos + length])
            pos += length
    prompt, completion, logprobs, experts, nm = out
    row: codec.CallRow = (
        idx,
        call_id,
        parent,
        shared,
        prompt or b"",
        completion or b"",
        logprobs or b"",
        experts,
        sm,
        nm,
        value[pos:],
    )
    return row, tools
