"""How every store backend lays out a call: deltas, packed arrays and compressed JSON.

A call's prompt is kept as ``(parent_call_id, shared_prefix_len, new_prompt_ids)`` against the
earlier call of its session whose prompt+completion is the longest prefix of it, and its messages
as the new messages only (DESIGN §5). Token ids are packed little-endian int32, log-probs float32,
routed experts int16. The backends differ only in where the parts go (SQLite columns, one Redis
value); the encoding, the per-session delta cache and the rebuild are shared here.
"""

from __future__ import annotations

import hashlib
import threading
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import xxhash
import zstandard

from rollwire.data.arrays import common_prefix_len
from rollwire.data.protocol import ModelCall, VersionSpan

__all__ = [
    "CallRow",
    "DeltaCache",
    "EncodedCall",
    "SessionDeltas",
    "committed",
    "decode_calls",
    "deltas_from_rows",
    "encode_call",
    "pack_json",
    "remember_encoded",
    "request_key",
    "unpack_json",
]

# Fields of ModelCall kept in the ``meta`` JSON (arrays and delta fields are stored apart).
META_FIELDS = (
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
# Meta keys that are bookkeeping of the store, not fields of ModelCall.
_STORE_META = ("superseded_by", "request_key", "experts_shape")

RECENT_CALLS = 16  # earlier calls per session kept in memory for the prompt delta
CACHED_SESSIONS = 4096
# Token ids held by the delta cache, all sessions together (int32: 4 bytes each). Least recently
# used sessions are dropped past it (they are re-read from the store if they get another call).
CACHED_TOKENS = 4_000_000
SUPERSEDED_FLAG = "superseded_by_retry"


def request_key(raw_body: bytes) -> str:
    """A stable digest of a request body as received (the same in every process and on every
    platform), so an agent's retry is matched to its original across gateways and restarts:
    XXH3-128, 32 hex digits. It only has to tell an agent's own requests apart, and it costs
    ~0.3 µs for an 8 kB body where SHA-256 cost ~7 µs, on every call. Never change it: stored
    calls keep their keys. (Stores written before XXH3 hold SHA-256 keys: a retry of a call
    made before that upgrade is not linked to it.)"""
    return xxhash.xxh3_128_hexdigest(raw_body)


#: The zstd dictionary of the JSON parts (raw content: the text a call's meta, its response and
#: its messages repeat, so a small value compresses to its differences from it). Frames made with
#: it start with :data:`_DICT1`. Never edit these bytes: stored records need them as they are; a
#: new dictionary gets a new marker, and this one stays to read the old records.
_DICTIONARY1 = (
    b'{"role":"system","content":"You are a helpful assistant."},'
    b'{"role":"user","content":""},{"role":"tool","tool_call_id":"call_","content":""},'
    b'{"role":"assistant","content":null,"tool_calls":[{"id":"call_","type":"function",'
    b'"function":{"name":"","arguments":"{\\"'
    b'"tools":{"$blob":""},"tool_choice":"auto","stream":true,"stream_options":'
    b'{"include_usage":true},"n":1,"stop":null,"seed":null,"logprobs":true,"top_logprobs":0,'
    b'"chat_template_kwargs":{"enable_thinking":false},"response_format":{"type":"json_object"},'
    b'"weight_versions":[{"version":"","start":0,"end":0}],"superseded_by":"","experts_shape":[0,0,0],'
    b'"flags":["off_policy_sampling","superseded_by_retry","client_disconnected",'
    b'"routed_experts_missing","weight_versions_invalid","stale"],"text_completion","length",'
    b'"tool_calls","capture":"tokens","completion_tokens_details":null,"prompt_tokens_details":null,'
    b'{"finish_reason":"stop","status":"ok","error":null,"sampling":{"temperature":1.0,"top_p":1.0,'
    b'"top_k":-1,"max_tokens":0},"trainable":true,"off_policy":false,"flags":[],"retry_of":null,'
    b'"retry_count":0,"policy_version":null,"backend":"b0","logprobs_mode":"raw","capture":'
    b'"passthrough","branch":0,"fork_reason":null,"stream":false,"started_at":1700000000.0,'
    b'"latency_ms":0.0,"response":{"id":"chatcmpl-","object":"chat.completion","created":'
    b'1700000000,"model":"","choices":[{"index":0,"message":{"role":"assistant","content":"",'
    b'"refusal":null,"annotations":null,"audio":null,"function_call":null,"tool_calls":[],'
    b'"reasoning_content":null},"logprobs":null,"finish_reason":"stop","stop_reason":null}],'
    b'"usage":{"prompt_tokens":0,"total_tokens":0,"completion_tokens":0}},"request":'
    b'{"model":"policy","temperature":1.0,"max_tokens":0},"request_key":""}'
)
_DICT1 = b"\x01"  # before a frame made with _DICTIONARY1; JSON never starts with it
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"  # a zstd frame without dictionary; nor with '('
_SMALL = 4096


class _Zstd(threading.local):
    """This thread's zstd contexts (made once: a fresh zlib stream per value set up ~256 kB of
    state, which cost the gateway more than the rest of its store write)."""

    def __init__(self) -> None:
        d = zstandard.ZstdCompressionDict(_DICTIONARY1, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
        # Small values (a call's meta) at zstd's fast level -1: half the time of level 1 for
        # ~10 % more bytes; larger ones (messages, long answers) at level 1.
        self.small = zstandard.ZstdCompressor(level=-1, dict_data=d, write_dict_id=False)
        self.compressor = zstandard.ZstdCompressor(level=1, dict_data=d, write_dict_id=False)
        self.decompressor = zstandard.ZstdDecompressor(dict_data=d)
        self.plain = zstandard.ZstdDecompressor()


_zstd = _Zstd()


def pack_json(obj: Any) -> bytes:
    """JSON, zstd-compressed against :data:`_DICTIONARY1` when that pays (a call's ~900-byte
    meta becomes ~180 bytes; text in messages compresses ~3x)."""
    raw = orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)
    if len(raw) < 64:
        return raw
    z = _zstd.small if len(raw) < _SMALL else _zstd.compressor
    packed = _DICT1 + z.compress(raw)
    return packed if len(packed) < len(raw) else raw


def unpack_json(data: bytes) -> Any:
    """Inverse of :func:`pack_json`; also reads zlib streams (stores written before zstd) and
    zstd frames without a dictionary."""
    head = data[:1]
    if head == _DICT1:
        data = _zstd.decompressor.decompress(data[1:])
    elif head == b"x":  # zlib header; JSON starts with '{' or '['
        data = zlib.decompress(data)
    elif head == b"(" and data[:4] == _ZSTD_MAGIC:
        data = _zstd.plain.decompress(data)
    return orjson.loads(data)


def i32(arr: Any) -> np.ndarray:
    """``arr`` as a contiguous little-endian int32 array."""
    return np.ascontiguousarray(arr, dtype="<i4")


def _shared_messages(prev: Sequence[Any], cur: Sequence[Any]) -> int:
    n = 0
    for a, b in zip(prev, cur):
        if a != b:
            break
        n += 1
    return n


class RecentCall:
    """The part of a call ``find_parent`` reads (kept per session in the delta cache), and the
    session's latest messages once it was stored (what the next call's messages extend)."""

    __slots__ = ("call_id", "completion_ids", "index", "messages_after", "prompt_ids")

    def __init__(
        self,
        call_id: str,
        index: int,
        prompt_ids: np.ndarray,
        completion_ids: np.ndarray,
        messages_after: list[Any],
    ) -> None:
        self.call_id = call_id
        self.index = index
        self.prompt_ids = prompt_ids
        self.completion_ids = completion_ids
        self.messages_after = messages_after

    @property
    def tokens(self) -> int:
        """Token ids held (prompt and completion)."""
        return int(self.prompt_ids.shape[0]) + int(self.completion_ids.shape[0])


class SessionDeltas:
    """What a writer remembers of a session to encode its next call as a delta."""

    __slots__ = ("incarnation", "last_messages", "next_index", "recent", "tokens")

    def __init__(self, next_index: int, incarnation: str | None = None) -> None:
        self.next_index = next_index
        self.incarnation = incarnation  # which creation of the session id (Redis)
        self.recent: list[RecentCall] = []
        self.last_messages: list[Any] = []
        self.tokens = 0  # token ids held in ``recent``

    def remember(
        self,
        call_id: str,
        index: int,
        prompt: np.ndarray,
        completion: np.ndarray,
        messages: list[Any] | None,
    ) -> int:
        """Add a stored call (full prompt) as the latest; returns the change in tokens held."""
        if messages is not None:
            self.last_messages = messages
        entry = RecentCall(call_id, index, prompt, completion, self.last_messages)
        self.recent.append(entry)
        added = entry.tokens
        if len(self.recent) > RECENT_CALLS:
            added -= self.recent.pop(0).tokens
        self.tokens += added
        self.next_index = max(self.next_index, index + 1)
        return added

    def truncate(self, index: int) -> bool:
        """Forget calls from ``index`` on (they were not stored after all). False when too
        little is left to go on (the caller re-reads the session instead)."""
        while self.recent and self.recent[-1].index >= index:
            self.tokens -= self.recent.pop().tokens
        self.next_index = min(self.next_index, index)
        if self.recent:
            self.last_messages = self.recent[-1].messages_after
            return self.recent[-1].index == index - 1
        self.last_messages = []
        return index == 0

    def full_tokens(self) -> dict[str, np.ndarray]:
        """Prompt+completion of each remembered call (parents for rebuilding later calls)."""
        return {r.call_id: np.concatenate([r.prompt_ids, r.completion_ids]) for r in self.recent}


class DeltaCache:
    """Per-session :class:`SessionDeltas`, least recently used first, bounded in sessions and
    in token ids held."""

    def __init__(self, max_sessions: int = CACHED_SESSIONS, max_tokens: int = CACHED_TOKENS):
        self._items: OrderedDict[str, SessionDeltas] = OrderedDict()
        self._tokens = 0
        self._max_sessions = max_sessions
        self._max_tokens = max_tokens

    def __len__(self) -> int:
        return len(self._items)

    def get(self, session_id: str) -> SessionDeltas | None:
        """The session's deltas (marked recently used), or None."""
        d = self._items.get(session_id)
        if d is not None:
            self._items.move_to_end(session_id)
        return d

    def put(self, session_id: str, deltas: SessionDeltas) -> None:
        """Remember a freshly loaded session."""
        self.drop(session_id)
        self._items[session_id] = deltas
        self._tokens += deltas.tokens
        self.trim()

    def added(self, session_id: str, n: int) -> None:
        """Account ``n`` more token ids held by a cached session (then trim)."""
        if session_id not in self._items:
            return
        self._tokens += n
        if self._tokens > self._max_tokens or len(self._items) > self._max_sessions:
            self.trim()

    def drop(self, session_id: str) -> None:
        """Forget a session (deleted, completed, or its state may be stale)."""
        d = self._items.pop(session_id, None)
        if d is not None:
            self._tokens -= d.tokens

    def clear(self) -> None:
        """Forget everything (after a rolled-back write)."""
        self._items.clear()
        self._tokens = 0

    def trim(self) -> None:
        """Drop least recently used sessions past either bound (the newest always stays)."""
        while len(self._items) > 1 and (
            len(self._items) > self._max_sessions or self._tokens > self._max_tokens
        ):
            _, old = self._items.popitem(last=False)
            self._tokens -= old.tokens


def _find_parent(prompt: np.ndarray, recent: list[RecentCall]) -> tuple[RecentCall | None, int]:
    """:func:`rollwire.data.protocol.find_parent` over the recent calls, skipping those too
    short to beat the best match so far: in a growing conversation the latest call is the
    parent and the older, shorter ones are not compared at all (each compare is O(context))."""
    best: RecentCall | None = None
    best_len = 0
    for call in reversed(recent):
        p, c = call.prompt_ids, call.completion_ids
        if p.shape[0] + c.shape[0] <= best_len:
            continue
        n = _prefix_len(p, prompt)
        if n == p.shape[0]:
            n += _prefix_len(c, prompt[n:])
        if n > best_len:
            best, best_len = call, n
            if n == prompt.shape[0]:
                break
    return best, best_len


def _prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    """:func:`common_prefix_len`, with one ``memcmp`` for the usual case: all of ``a`` is a
    prefix of ``b`` (the session's conversation went on), ~4x cheaper than comparing arrays."""
    n = a.shape[0]
    if 0 < n <= b.shape[0] and a.tobytes() == b[:n].tobytes():
        return int(n)
    return common_prefix_len(a, b)


@dataclass
class EncodedCall:
    """One call laid out for storage (the row the backends write)."""

    index: int
    call_id: str
    parent_call_id: str | None
    shared_prefix_len: int
    new_prompt: bytes
    completion: bytes
    logprobs: bytes
    experts: bytes | None
    shared_messages: int | None
    new_messages: bytes | None
    meta: dict[str, Any]
    tools_hash: str | None
    tools: bytes | None  # the tool schemas, stored once per distinct list under ``tools_hash``
    n_completion: int

    def meta_bytes(self) -> bytes:
        """The meta JSON, packed."""
        return pack_json(self.meta)


def encode_call(
    call: ModelCall, deltas: SessionDeltas, key: str | None = None, index: int | None = None
) -> EncodedCall:
    """Lay ``call`` out against what ``deltas`` remembers; changes neither of them."""
    prompt = i32(call.prompt_ids)
    completion = i32(call.completion_ids)
    logprobs = np.ascontiguousarray(call.logprobs, dtype="<f4")
    parent, shared = _find_parent(prompt, deltas.recent)
    request = dict(call.request)
    messages = request.pop("messages", None)
    shared_messages: int | None = None
    new_messages: bytes | None = None
    if isinstance(messages, list):
        shared_messages = _shared_messages(deltas.last_messages, messages)
        new_messages = pack_json(messages[shared_messages:])
    tools_hash: str | None = None
    tools_json: bytes | None = None
    tools = request.get("tools")
    if isinstance(tools, list) and tools:
        tools_json = orjson.dumps(tools)
        tools_hash = hashlib.blake2b(tools_json, digest_size=16).hexdigest()
        request["tools"] = {"$blob": tools_hash}
    fields = call.__dict__  # the model's values (read as attributes do, without the lookups)
    meta = {name: fields[name] for name in META_FIELDS}
    if call.weight_versions is not None:  # absent (not null) otherwise: old records look the same
        meta["weight_versions"] = [span.model_dump() for span in call.weight_versions]
    meta["request"] = request
    if key is not None:
        meta["request_key"] = key
    experts: bytes | None = None
    if call.routed_experts is not None:
        arr = np.ascontiguousarray(call.routed_experts, dtype="<i2")
        meta["experts_shape"] = list(arr.shape)
        experts = arr.tobytes()
    return EncodedCall(
        index=deltas.next_index if index is None else index,
        call_id=call.call_id,
        parent_call_id=parent.call_id if parent is not None else None,
        shared_prefix_len=shared,
        new_prompt=prompt[shared:].tobytes(),
        completion=completion.tobytes(),
        logprobs=logprobs.tobytes(),
        experts=experts,
        shared_messages=shared_messages,
        new_messages=new_messages,
        meta=meta,
        tools_hash=tools_hash,
        tools=tools_json,
        n_completion=int(completion.shape[0]),
    )


def remember_encoded(
    call: ModelCall, enc: EncodedCall, deltas: SessionDeltas, cache: DeltaCache
) -> None:
    """Let ``deltas`` know of ``enc`` (the next call of its session encodes against it)."""
    messages = call.request.get("messages")
    if isinstance(messages, list):
        # The history this call shares with the last one is held once: the objects already
        # remembered stand for the equal ones just parsed from this request, so each of the
        # session's recent calls holds only its new messages (not a parse of the whole history).
        shared = enc.shared_messages or 0
        messages = deltas.last_messages[:shared] + messages[shared:]
    cache.added(
        call.session_id,
        deltas.remember(
            enc.call_id,
            enc.index,
            i32(call.prompt_ids),
            i32(call.completion_ids),
            messages if isinstance(messages, list) else None,
        ),
    )


def committed(call: ModelCall, enc: EncodedCall) -> None:
    """After ``enc`` is stored: give ``call`` its index and delta."""
    call.index = enc.index
    call.parent_call_id = enc.parent_call_id
    call.shared_prefix_len = enc.shared_prefix_len


# (idx, call_id, parent_call_id, shared_prefix_len, new_prompt, completion, logprobs, experts,
#  shared_messages, new_messages, meta) -- the SQLite row order; Redis values unpack to it.
CallRow = tuple[
    int,
    str,
    "str | None",
    int,
    bytes,
    bytes,
    bytes,
    "bytes | None",
    "int | None",
    "bytes | None",
    bytes,
]


def deltas_from_rows(
    session_id: str,
    rows: Iterable[CallRow],
    deltas: SessionDeltas,
    known: dict[str, np.ndarray] | None = None,
) -> SessionDeltas:
    """Feed stored rows (in index order, following what ``deltas`` holds) into ``deltas``:
    only tokens and messages are rebuilt. ``known`` maps earlier call ids to their
    prompt+completion; a parent outside it raises LookupError."""
    full: dict[str, np.ndarray] = dict(known or {})
    prev: list[Any] = list(deltas.last_messages)
    for idx, call_id, parent_id, shared, new_prompt, completion, _lp, _ex, sm, nm, _m in rows:
        new_ids = np.frombuffer(new_prompt, dtype="<i4")
        if parent_id is not None and shared:
            base = full.get(parent_id)
            if base is None:
                raise LookupError(
                    f"call {call_id!r} (index {idx}) of session {session_id!r} extends call "
                    f"{parent_id!r}, which is not in the store; the stored session is damaged"
                )
            prompt = np.concatenate([base[:shared], new_ids])
        else:
            prompt = new_ids.copy()
        comp = np.frombuffer(completion, dtype="<i4").copy()
        full[call_id] = np.concatenate([prompt, comp])
        messages: list[Any] | None = None
        if nm is not None:
            messages = prev[: int(sm or 0)] + unpack_json(nm)
            prev = messages
        deltas.remember(call_id, idx, prompt, comp, messages)
    return deltas


def decode_calls(
    session_id: str,
    rows: Iterable[CallRow],
    tools: Callable[[str], bytes | None],
    *,
    known: dict[str, np.ndarray] | None = None,
    prev_messages: list[Any] | None = None,
    overrides: dict[str, dict[str, Any]] | None = None,
) -> list[ModelCall]:
    """Rebuild full calls from stored rows in index order.

    ``tools`` returns a tool-schema blob by hash (None: missing). ``known`` and
    ``prev_messages`` seed the rebuild with earlier calls when ``rows`` starts mid-session;
    ``overrides`` are per-call meta updates recorded after the call (retry matching).
    """
    blobs: dict[str, Any] = {}
    full: dict[str, np.ndarray] = dict(known or {})
    prev: list[Any] = list(prev_messages or [])
    calls: list[ModelCall] = []
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
            base = full.get(parent_id)
            if base is None:
                raise LookupError(
                    f"call {call_id!r} (index {idx}) of session {session_id!r} extends call "
                    f"{parent_id!r}, which is not in the store; the stored session is damaged"
                )
            prompt = np.concatenate([base[:shared], new_ids])
        else:
            prompt = new_ids
        comp = np.frombuffer(completion, dtype="<i4").astype(np.int32)
        full[call_id] = np.concatenate([prompt, comp])
        meta = unpack_json(m)
        patch = overrides.get(call_id) if overrides else None
        if patch:
            _apply_override(meta, patch)
        request = dict(meta.pop("request", None) or {})
        _restore_tools(request, blobs, tools, session_id, call_id, idx)
        if nm is not None:
            messages = prev[: int(sm or 0)] + unpack_json(nm)
            request["messages"] = messages
            prev = messages
        shape = meta.get("experts_shape")
        if meta.get("weight_versions") is not None:
            meta["weight_versions"] = [VersionSpan(**v) for v in meta["weight_versions"]]
        for name in _STORE_META:
            meta.pop(name, None)
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


def _restore_tools(
    request: dict[str, Any],
    blobs: dict[str, Any],
    tools: Callable[[str], bytes | None],
    session_id: str,
    call_id: str,
    idx: int,
) -> None:
    ref = request.get("tools")
    if not (isinstance(ref, dict) and "$blob" in ref):
        return
    key = ref["$blob"]
    if key not in blobs:
        got = tools(key)
        if got is None:
            raise LookupError(
                f"call {call_id!r} (index {idx}) of session {session_id!r} refers to tool "
                f"schemas {key!r} that are missing from the store; the store is damaged"
            )
        blobs[key] = orjson.loads(got)
    request["tools"] = blobs[key]


def _apply_override(meta: dict[str, Any], patch: dict[str, Any]) -> None:
    if patch.get("superseded_by"):
        mark_superseded_meta(meta, str(patch["superseded_by"]))
    if patch.get("retry_of") and not meta.get("retry_of"):
        meta["retry_of"] = patch["retry_of"]


def mark_superseded_meta(meta: dict[str, Any], by: str) -> None:
    """Make a stored call's meta non-trainable because the agent retried it as ``by``."""
    meta["trainable"] = False
    flags = list(meta.get("flags") or [])
    if SUPERSEDED_FLAG not in flags:
        flags.append(SUPERSEDED_FLAG)
    meta["flags"] = flags
    meta["superseded_by"] = by
