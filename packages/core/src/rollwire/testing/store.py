"""Conformance suite for :class:`rollwire.store.Store` backends.

Subclass :class:`StoreConformance` and provide a ``store_factory`` fixture: a zero-argument
callable that opens the backend on the same underlying data each time it is called (so the suite
can close and reopen it)::

    class TestSQLiteStore(StoreConformance):
        @pytest.fixture
        def store_factory(self, tmp_path): return lambda: SQLiteStore(str(tmp_path / "s.db"))

The ``redis_server`` fixture (import it into a ``conftest.py``) starts a throwaway
``redis-server`` for the test session; without one (:func:`redis_server_binary`) its tests are
skipped, unless ``ROLLWIRE_REQUIRE_REDIS=1`` (CI) makes that an error.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import numpy as np
import pytest

from rollwire.data.protocol import ModelCall, VersionSpan
from rollwire.store.base import (
    CompletionConflict,
    SessionClosed,
    SessionExists,
    SessionNotFound,
    SessionRecord,
    Store,
)
from rollwire.store.codec import request_key
from rollwire.testing.redis_server import REDIS_SERVER_MISSING, RedisServer, redis_server_binary

__all__ = ["StoreConformance", "make_call", "redis_server"]


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A ``redis-server`` on a free loopback port for the whole test session, always stopped."""
    if redis_server_binary() is None:
        if os.environ.get("ROLLWIRE_REQUIRE_REDIS") == "1":
            raise RuntimeError(f"ROLLWIRE_REQUIRE_REDIS=1, and this test {REDIS_SERVER_MISSING}")
        pytest.skip(REDIS_SERVER_MISSING)
    with RedisServer() as server:
        yield server


def _sid() -> str:
    return uuid.uuid4().hex


def make_call(
    session_id: str,
    prompt: list[int] | np.ndarray,
    completion: list[int] | np.ndarray,
    messages: list[dict[str, Any]] | None = None,
    **fields: Any,
) -> ModelCall:
    """A call with log-probs derived from its completion (for the suite and for tests)."""
    completion = np.asarray(completion, dtype=np.int32)
    request: dict[str, Any] = {"model": "m"}
    if messages is not None:
        request["messages"] = messages
    return ModelCall(
        call_id=uuid.uuid4().hex,
        session_id=session_id,
        index=0,
        prompt_ids=np.asarray(prompt, dtype=np.int32),
        completion_ids=completion,
        logprobs=-(completion % 7).astype(np.float32) / 10.0,
        request=request,
        **fields,
    )


class StoreConformance:
    """The behaviour every store backend must have (DESIGN §2 and §5)."""

    @pytest.fixture
    async def store(self, store_factory: Callable[[], Store]) -> AsyncIterator[Store]:
        """The backend under test, closed after the test."""
        s = store_factory()
        try:
            yield s
        finally:
            await s.close()

    async def test_session_round_trip(self, store: Store) -> None:
        rec = SessionRecord(
            session_id=_sid(),
            group_id="g1",
            task_id="t1",
            metadata={"k": [1, "v"]},
            sampling={"temperature": 0.7, "max_tokens": 64},
            sampling_policy={"max_tokens": "min"},
            capture="tokens",
            allow_off_policy=True,
            chat_template_kwargs={"enable_thinking": False},
            max_calls=5,
            max_tokens=100,
            expires_at=123.0,
        )
        await store.create_session(rec)
        got = await store.get_session(rec.session_id)
        assert got is not None
        assert got.to_dict() == rec.to_dict()
        assert await store.get_session("nope") is None
        with pytest.raises(SessionExists):
            await store.create_session(SessionRecord(session_id=rec.session_id))

    async def test_call_round_trip_with_arrays(self, store: Store) -> None:
        sid = _sid()
        await store.create_session(SessionRecord(session_id=sid))
        experts = (np.arange(9 * 2 * 3) % 50).astype(np.int16).reshape(9, 2, 3)
        call = make_call(
            sid,
            [1, 2, 3, 4, 5],
            [6, 7, 8, 9, 10],
            messages=[{"role": "user", "content": "hi"}],
            routed_experts=experts,
            finish_reason="stop",
            sampling={"temperature": 1.0},
            trainable=False,
            off_policy=True,
            flags=["logit_bias"],
            policy_version="v3",
            backend="b0",
            stream=True,
            latency_ms=12.5,
            response={"choices": [{"message": {"content": "ok"}}]},
        )
        call.request["tools"] = [{"type": "function", "function": {"name": "f"}}]
        await store.append_call(call)
        (got,) = await store.calls(sid)
        assert got.call_id == call.call_id and got.index == 0
        np.testing.assert_array_equal(got.prompt_ids, call.prompt_ids)
        np.testing.assert_array_equal(got.completion_ids, call.completion_ids)
        np.testing.assert_array_equal(got.logprobs, call.logprobs)
        assert got.logprobs.dtype == np.float32 and got.prompt_ids.dtype == np.int32
        assert got.routed_experts is not None and got.routed_experts.dtype == np.int16
        np.testing.assert_array_equal(got.routed_experts, experts)
        for name in (
            "finish_reason",
            "sampling",
            "trainable",
            "off_policy",
            "flags",
            "policy_version",
            "backend",
            "stream",
            "latency_ms",
            "response",
            "request",
        ):
            assert getattr(got, name) == getattr(call, name), name

    async def test_weight_version_spans_round_trip(self, store: Store) -> None:
        sid = _sid()
        await store.create_session(SessionRecord(session_id=sid))
        spans = [VersionSpan(version="4", start=0, end=1), VersionSpan(version="5", start=1, end=3)]
        await store.append_call(make_call(sid, [1, 2], [3, 4, 5], policy_version="5"))
        labelled = make_call(sid, [1, 2, 3, 4, 5], [6, 7, 8], weight_versions=spans)
        await store.append_call(labelled)
        plain, got = await store.calls(sid)
        assert plain.weight_versions is None and plain.policy_version == "5"
        assert got.weight_versions == spans

    async def test_calls_keep_order_and_indices(self, store: Store) -> None:
        sid = _sid()
        await store.create_session(SessionRecord(session_id=sid))
        ids = []
        for i in range(6):
            c = make_call(sid, [100 + i], [i])
            await store.append_call(c)
            assert c.index == i
            ids.append(c.call_id)
        got = await store.calls(sid)
        assert [c.call_id for c in got] == ids
        assert [c.index for c in got] == list(range(6))
        assert await store.calls("unknown") == []

    async def test_prompt_delta_reconstruction(self, store: Store) -> None:
        sid = _sid()
        await store.create_session(SessionRecord(session_id=sid))
        rng = np.random.default_rng(0)
        context = rng.integers(0, 1000, 50).astype(np.int32)
        calls = []
        for turn in range(8):
            completion = rng.integers(0, 1000, 10).astype(np.int32)
            c = make_call(sid, context.copy(), completion)
            await store.append_call(c)
            calls.append(c)
            if turn:
                assert c.parent_call_id == calls[turn - 1].call_id
                assert c.shared_prefix_len == calls[turn - 1].full_tokens().shape[0]
            context = np.concatenate([context, completion, rng.integers(0, 1000, 20)])
        # A branch: an edited history shares only part of the first prompt.
        branch = make_call(sid, np.concatenate([calls[0].prompt_ids[:30], [7, 7, 7]]), [1])
        await store.append_call(branch)
        assert branch.shared_prefix_len == 30
        calls.append(branch)
        got = await store.calls(sid)
        for a, b in zip(calls, got):
            np.testing.assert_array_equal(a.prompt_ids, b.prompt_ids)
            assert a.parent_call_id == b.parent_call_id
            assert a.shared_prefix_len == b.shared_prefix_len

    async def test_messages_delta_reconstruction(self, store: Store) -> None:
        sid = _sid()
        await store.create_session(SessionRecord(session_id=sid))
        history: list[dict[str, Any]] = [{"role": "system", "content": "s"}]
        sent = []
        for i in range(5):
            history = [*history, {"role": "user", "content": f"q{i}"}]
            sent.append(list(history))
            await store.append_call(make_call(sid, [i], [i], messages=list(history)))
            history = [*history, {"role": "assistant", "content": f"a{i}"}]
        edited = [{"role": "system", "content": "other"}, {"role": "user", "content": "x"}]
        sent.append(edited)
        await store.append_call(make_call(sid, [9], [9], messages=edited))
        got = await store.calls(sid)
        assert [c.request["messages"] for c in got] == sent

    async def test_counters(self, store: Store) -> None:
        sid = _sid()
        await store.create_session(SessionRecord(session_id=sid))
        await store.append_call(make_call(sid, [1, 2], [3, 4, 5]))
        await store.append_call(make_call(sid, [1, 2, 3, 4, 5], [6]))
        rec = await store.get_session(sid)
        assert rec is not None and rec.num_calls == 2 and rec.num_tokens == 4
        with pytest.raises(SessionNotFound):
            await store.append_call(make_call("missing-" + _sid(), [1], [2]))

    async def test_complete_idempotent_and_conflict(self, store: Store) -> None:
        sid = _sid()
        await store.create_session(SessionRecord(session_id=sid))
        rec, changed = await store.complete(sid, reward=1.0, metrics={"acc": 1.0})
        assert changed and rec.status == "completed" and rec.reward == 1.0
        assert rec.completed_at is not None
        again, changed = await store.complete(sid, reward=1.0, metrics={"acc": 1.0})
        assert not changed and again.completed_at == rec.completed_at
        with pytest.raises(CompletionConflict):
            await store.complete(sid, reward=0.0)
        with pytest.raises(CompletionConflict):
            await store.complete(sid, status="failed", reward=1.0, error="boom")
        with pytest.raises(SessionNotFound):
            await store.complete("missing-" + _sid(), reward=1.0)
        got = await store.get_session(sid)
        assert got is not None and got.status == "completed" and got.metrics == {"acc": 1.0}

    async def test_terminal_session_refuses_calls(self, store: Store) -> None:
        sid = _sid()
        await store.create_session(SessionRecord(session_id=sid))
        await store.append_call(make_call(sid, [1], [2, 3]))
        await store.complete(sid, reward=1.0)
        with pytest.raises(SessionClosed, match="completed"):
            await store.append_call(make_call(sid, [1, 2, 3], [4]))
        rec = await store.get_session(sid)
        assert rec is not None and rec.num_calls == 1 and rec.num_tokens == 2
        assert len(await store.calls(sid)) == 1
        # Submitted together: what came before the completion lands, what came after does not.
        other = _sid()
        await store.create_session(SessionRecord(session_id=other))
        before, after = make_call(other, [1], [2]), make_call(other, [1, 2], [3])
        results = await asyncio.gather(
            store.append_call(before),
            store.complete(other, status="failed", error="x"),
            store.append_call(after),
            return_exceptions=True,
        )
        assert not isinstance(results[0], BaseException)
        assert not isinstance(results[1], BaseException) and results[1][1]
        assert isinstance(results[2], SessionClosed)
        assert [c.call_id for c in await store.calls(other)] == [before.call_id]
        rec = await store.get_session(other)
        assert rec is not None and rec.num_calls == 1 and rec.status == "failed"

    async def test_list_by_group_and_status(self, store: Store) -> None:
        group = _sid()
        sids = [_sid() for _ in range(4)]
        for i, sid in enumerate(sids):
            await store.create_session(
                SessionRecord(session_id=sid, group_id=group, created_at=1000.0 + i)
            )
        await store.create_session(SessionRecord(session_id=_sid(), group_id="other"))
        await store.complete(sids[1], reward=0.5)
        await store.complete(sids[2], status="failed", error="x")
        listed = await store.list_sessions(group_id=group)
        assert [r.session_id for r in listed] == sids
        done = await store.list_sessions(group_id=group, status="completed")
        assert [r.session_id for r in done] == [sids[1]]
        running = await store.list_sessions(group_id=group, status="running")
        assert [r.session_id for r in running] == [sids[0], sids[3]]
        assert len(await store.list_sessions(group_id=group, limit=2)) == 2

    async def test_tools_survive_a_failed_neighbour(self, store: Store) -> None:
        # One bad write in a batch must not cost a good one its tool schemas.
        sid = _sid()
        await store.create_session(SessionRecord(session_id=sid))
        good = make_call(sid, [1], [2], messages=[{"role": "user", "content": "x"}])
        tools = [{"type": "function", "function": {"name": "only_once_" + sid}}]
        good.request["tools"] = tools
        results = await asyncio.gather(
            store.append_call(good),
            store.append_call(make_call("missing-" + _sid(), [1], [2])),
            return_exceptions=True,
        )
        assert not isinstance(results[0], BaseException)
        assert isinstance(results[1], SessionNotFound)
        (got,) = await store.calls(sid)
        assert got.request["tools"] == tools

    async def test_delete(self, store: Store) -> None:
        sid = _sid()
        await store.create_session(SessionRecord(session_id=sid))
        await store.append_call(make_call(sid, [1], [2]))
        assert await store.delete_session(sid)
        assert await store.get_session(sid) is None
        assert await store.calls(sid) == []
        assert not await store.delete_session(sid)

    async def test_mark_superseded(self, store: Store) -> None:
        sid = _sid()
        await store.create_session(SessionRecord(session_id=sid))
        first = make_call(sid, [1, 2], [3])
        second = make_call(sid, [1, 2], [4], retry_of=first.call_id, retry_count=1)
        await store.append_call(first)
        await store.append_call(second)
        await store.mark_superseded(sid, first.call_id, by=second.call_id)
        a, b = await store.calls(sid)
        assert not a.trainable and "superseded_by_retry" in a.flags
        assert b.trainable and b.retry_of == first.call_id

    async def test_persistence_across_reopen(self, store_factory: Callable[[], Store]) -> None:
        sid = _sid()
        first = store_factory()
        await first.create_session(SessionRecord(session_id=sid, group_id="g"))
        prompt = np.arange(40, dtype=np.int32)
        for i in range(3):
            await first.append_call(make_call(sid, prompt, [i, i + 1]))
            prompt = np.concatenate([prompt, [i, i + 1, 99]]).astype(np.int32)
        await first.close()
        second = store_factory()
        try:
            calls = await second.calls(sid)
            assert [c.index for c in calls] == [0, 1, 2]
            # Appending after a reopen continues the indices and the delta chain.
            c = make_call(sid, np.concatenate([calls[-1].full_tokens(), [5]]), [6])
            await second.append_call(c)
            assert c.index == 3 and c.parent_call_id == calls[-1].call_id
            rec = await second.get_session(sid)
            assert rec is not None and rec.num_calls == 4
        finally:
            await second.close()

    async def test_concurrent_appends(self, store: Store) -> None:
        sids = [_sid() for _ in range(8)]
        for sid in sids:
            await store.create_session(SessionRecord(session_id=sid))

        async def agent(sid: str) -> None:
            for i in range(25):
                await store.append_call(make_call(sid, [i], [i, i]))

        await asyncio.gather(*(agent(sid) for sid in sids))
        for sid in sids:
            calls = await store.calls(sid)
            assert [c.index for c in calls] == list(range(25))
            rec = await store.get_session(sid)
            assert rec is not None and rec.num_calls == 25 and rec.num_tokens == 50

    async def test_retry_matched_by_request_key(self, store: Store) -> None:
        sid = _sid()
        await store.create_session(SessionRecord(session_id=sid))
        key = request_key(b'{"messages": [1]}')
        original = await store.append_call(make_call(sid, [1, 2], [3]), request_key=key)
        retry = await store.append_call(make_call(sid, [1, 2], [4], retry_count=1), request_key=key)
        assert retry.retry_of == original.call_id and retry.trainable
        # The same body again without a retry header is a new call, not a retry.
        again = await store.append_call(make_call(sid, [1, 2], [5]), request_key=key)
        assert again.retry_of is None and again.trainable
        # A failed retry links to its original but leaves it trainable.
        failed = await store.append_call(
            make_call(sid, [1, 2], [], retry_count=1, status="failed", trainable=False),
            request_key=key,
        )
        assert failed.retry_of == again.call_id
        # A retry that lands before its original: the original is the spare copy.
        late = request_key(b"late")
        first = await store.append_call(make_call(sid, [7], [8], retry_count=2), request_key=late)
        assert first.retry_of is None and first.trainable
        orig = await store.append_call(make_call(sid, [7], [9]), request_key=late)
        assert not orig.trainable and "superseded_by_retry" in orig.flags
        got = {c.call_id: c for c in await store.calls(sid)}
        assert not got[original.call_id].trainable
        assert "superseded_by_retry" in got[original.call_id].flags
        assert got[retry.call_id].trainable and got[retry.call_id].retry_of == original.call_id
        assert got[again.call_id].trainable
        assert got[failed.call_id].retry_of == again.call_id
        assert got[first.call_id].trainable
        assert not got[orig.call_id].trainable
        assert "superseded_by_retry" in got[orig.call_id].flags
        trainable = [c.call_id for c in got.values() if c.trainable]
        assert trainable == [retry.call_id, again.call_id, first.call_id]

    async def test_retry_matched_after_reopen(self, store_factory: Callable[[], Store]) -> None:
        # The old process stored the call but never answered; the agent's SDK retries it to
        # the new process: one trainable copy, not two.
        sid = _sid()
        key = request_key(b"body")
        first = store_factory()
        await first.create_session(SessionRecord(session_id=sid))
        original = await first.append_call(make_call(sid, [1, 2], [3]), request_key=key)
        await first.close()
        second = store_factory()
        try:
            retry = await second.append_call(
                make_call(sid, [1, 2], [4], retry_count=1), request_key=key
            )
            assert retry.retry_of == original.call_id
            a, b = await second.calls(sid)
            assert not a.trainable and b.trainable
        finally:
            await second.close()

    async def test_settings(self, store_factory: Callable[[], Store]) -> None:
        name = "test-" + _sid()
        first = store_factory()
        assert await first.get_setting(name) is None
        await first.set_setting(name, {"paused": True, "n": 2})
        await first.set_setting(name + "-v", "v7")
        await first.set_setting(name + "-gone", 1)
        await first.set_setting(name + "-gone", None)
        await first.set_setting(name + "-ttl", "b1", ttl=300.0)
        await first.close()
        second = store_factory()
        try:
            assert await second.get_setting(name) == {"paused": True, "n": 2}
            assert await second.get_setting(name + "-v") == "v7"
            assert await second.get_setting(name + "-gone") is None
            assert await second.get_setting(name + "-ttl") == "b1"
            assert await second.settings_with_prefix(name + "-") == {
                name + "-v": "v7",
                name + "-ttl": "b1",
            }
            assert await second.settings_with_prefix(name + "-*") == {}  # no glob
            await second.set_setting(name + "-short", 1, ttl=0.05)
            await asyncio.sleep(0.15)  # no event marks a TTL passing
            assert await second.get_setting(name + "-short") is None
            await second.ping()
        finally:
            await second.close()

    async def test_list_pages(self, store: Store) -> None:
        group = _sid()
        sids = [_sid() for _ in range(7)]
        for i, sid in enumerate(sids):
            await store.create_session(
                SessionRecord(session_id=sid, group_id=group, created_at=2000.0 + i)
            )
        pages = [
            [r.session_id for r in await store.list_sessions(group_id=group, limit=3, offset=o)]
            for o in (0, 3, 6, 9)
        ]
        assert pages == [sids[:3], sids[3:6], sids[6:], []]
        await store.complete(sids[0], reward=1.0)
        running = await store.list_sessions(group_id=group, status="running", limit=2, offset=1)
        assert [r.session_id for r in running] == sids[2:4]

    async def test_complete_needs_a_terminal_status(self, store: Store) -> None:
        sid = _sid()
        await store.create_session(SessionRecord(session_id=sid))
        with pytest.raises(ValueError, match="terminal"):
            await store.complete(sid, status="running")
        rec = await store.get_session(sid)
        assert rec is not None and rec.status == "running"

    async def test_recreated_session_starts_over(self, store: Store) -> None:
        sid = _sid()
        old = SessionRecord(session_id=sid)
        await store.create_session(old)
        first = await store.append_call(make_call(sid, list(range(20)), [1, 2]))
        assert await store.delete_session(sid)
        new = SessionRecord(session_id=sid)
        assert new.incarnation != old.incarnation
        await store.create_session(new)
        c = await store.append_call(make_call(sid, [*range(20), 1, 2, 3], [4]))
        assert c.index == 0 and c.parent_call_id is None and c.shared_prefix_len == 0
        (got,) = await store.calls(sid)
        assert got.call_id == c.call_id and got.call_id != first.call_id
        np.testing.assert_array_equal(got.prompt_ids, c.prompt_ids)
        rec = await store.get_session(sid)
        assert rec is not None and rec.incarnation == new.incarnation and rec.num_calls == 1
