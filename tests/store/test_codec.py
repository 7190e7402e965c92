"""The shared call encoding: what the writers remember of a session stays bounded."""

from __future__ import annotations

import json
from typing import Any

from rollwire.store import codec
from rollwire.testing.store import make_call


def _history(turns: int) -> list[dict[str, Any]]:
    messages = [{"role": "system", "content": "be brief " * 50}]
    for t in range(turns):
        messages.append({"role": "user", "content": f"question {t} " * 40})
        messages.append({"role": "assistant", "content": f"answer {t} " * 40})
    return messages


def test_recent_calls_hold_the_shared_history_once() -> None:
    """Each call's request is parsed afresh (equal messages, new objects); the session's recent
    calls must not keep one parse of the whole history each, only their new messages."""
    deltas, cache = codec.SessionDeltas(0), codec.DeltaCache()
    cache.put("s", deltas)
    for turn in range(1, 9):
        messages = json.loads(json.dumps(_history(turn)))  # as a request body is parsed
        call = make_call("s", list(range(10 * turn)), [1, 2], messages=messages)
        call.call_id = f"c{turn}"
        enc = codec.encode_call(call, deltas)
        codec.remember_encoded(call, enc, deltas, cache)
        assert enc.shared_messages == (0 if turn == 1 else len(messages) - 2)
    first = deltas.recent[0].messages_after
    last = deltas.recent[-1].messages_after
    assert last == _history(8)
    # The system message and the first turn are the very objects of the first call's parse.
    assert all(a is b for a, b in zip(first, last))
    distinct = {id(m) for r in deltas.recent for m in r.messages_after}
    assert len(distinct) == len(last)  # every message held once, however many calls share it
    # Forgetting the last two calls (a refused write) goes back to the history of the sixth.
    assert deltas.truncate(6)
    assert deltas.last_messages == _history(6)


def test_parent_search_skips_calls_too_short_to_win_and_finds_the_same_parent() -> None:
    import numpy as np

    from rollwire.data.protocol import find_parent

    rng = np.random.default_rng(0)
    for _ in range(200):
        deltas = codec.SessionDeltas(0)
        base = rng.integers(0, 5, size=int(rng.integers(0, 40))).astype(np.int32)
        for i in range(int(rng.integers(1, 20))):
            cut = int(rng.integers(0, base.shape[0] + 1))
            prompt = np.concatenate([base[:cut], rng.integers(0, 5, size=int(rng.integers(0, 9)))])
            completion = rng.integers(0, 5, size=int(rng.integers(0, 5))).astype(np.int32)
            deltas.remember(f"c{i}", i, prompt.astype(np.int32), completion, None)
            base = np.concatenate([prompt, completion]).astype(np.int32)
        query = np.concatenate([base, rng.integers(0, 5, size=3)]).astype(np.int32)
        query = query[: int(rng.integers(0, query.shape[0] + 1))]
        want, want_len = find_parent(query, deltas.recent)  # type: ignore[arg-type]
        got, got_len = codec._find_parent(query, deltas.recent)
        assert (got_len, got) == (want_len, want)


def test_prefix_shortcut_agrees_with_common_prefix_len() -> None:
    import numpy as np

    from rollwire.data.arrays import common_prefix_len

    rng = np.random.default_rng(0)
    base = rng.integers(0, 50_000, 600).astype(np.int32)
    cases = [
        (base[:512], base),  # a whole prefix (the usual case)
        (base, base[:512]),  # longer than the other
        (base, base),
        (base[:0], base),
        (base[:300], np.concatenate([base[:299], [7], base[300:]]).astype(np.int32)),
        (base[:5], base[1:]),
    ]
    for a, b in cases:
        assert codec._prefix_len(a, b) == common_prefix_len(a, b)


def test_json_is_zstd_compressed_and_older_records_still_read() -> None:
    """New values are zstd frames against the built-in dictionary (small and large ones), small
    values stay plain JSON; zlib streams (stores written before zstd) and zstd frames without
    the dictionary read back; each thread uses its own zstd contexts."""
    import threading
    import zlib

    import orjson
    import zstandard

    meta = {"status": "ok", "flags": [], "response": {"choices": [{"index": 0}]}, "x": "y" * 40}
    long = {"response": {"content": "the answer is 42. " * 400}, "flags": []}
    for value in (meta, long):
        packed = codec.pack_json(value)
        raw = orjson.dumps(value)
        assert packed[:1] == b"\x01" and len(packed) < len(raw) / 2, (len(packed), len(raw))
        assert codec.unpack_json(packed) == value
        assert codec.unpack_json(zlib.compress(raw, 1)) == value  # an older store
        assert codec.unpack_json(zstandard.ZstdCompressor().compress(raw)) == value
    assert codec.pack_json({"a": 1}) == b'{"a":1}' and codec.unpack_json(b'{"a":1}') == {"a": 1}
    assert codec.unpack_json(codec.pack_json([long] * 3)) == [long] * 3

    out: list[Any] = []

    def worker(i: int) -> None:
        for _ in range(200):
            mine = {"i": i, "text": f"thread {i} " * 50}
            if codec.unpack_json(codec.pack_json(mine)) != mine:
                out.append(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == []


def test_a_record_written_with_the_dictionary_still_reads() -> None:
    """A frame packed when the dictionary came in: it decodes only with those exact bytes, so
    editing the dictionary (instead of adding a new one under a new marker) fails here."""
    frame = (
        b'\x01(\xb5/\xfd \xc3-\x01\x00`1hello"}}]}}\x07\x00\xd2_\x12h\x10\xcde\x10>(\xca\x04|'
        b"\x12\x1d\xaa\t\x03,-\x05\x10"
    )
    assert codec.unpack_json(frame) == {
        "finish_reason": "stop",
        "status": "ok",
        "flags": [],
        "backend": "b0",
        "response": {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}}],
        },
    }


def test_request_keys_are_pinned_xxh3_digests_of_the_raw_body() -> None:
    """Stored calls keep their request keys, so the digest must never change: a known body's
    key is pinned here. Bodies that differ in a byte (even whitespace) get different keys."""
    from rollwire.store.codec import request_key

    assert request_key(b'{"messages": []}') == "6d3a5d77901bb61d4ea0475f3ebe662a"
    assert request_key(b'{"messages":[]}') != request_key(b'{"messages": []}')
    assert len({request_key(str(i).encode()) for i in range(10_000)}) == 10_000
