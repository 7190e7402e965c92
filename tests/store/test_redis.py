"""The store conformance suite on Redis, plus what only a shared store must do."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

import numpy as np
import pytest

from rollwire.store import RedisStore, SessionRecord, StoreUnavailable, open_store
from rollwire.testing.redis_server import RedisServer
from rollwire.testing.store import StoreConformance, make_call


class TestRedisStore(StoreConformance):
    @pytest.fixture
    def store_factory(self, redis_server: RedisServer) -> Callable[[], RedisStore]:
        prefix = f"t{uuid.uuid4().hex[:8]}:"
        return lambda: RedisStore(redis_server.url, prefix=prefix)


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:8]}:"


async def test_open_store_redis_url(redis_server: RedisServer, prefix: str) -> None:
    store = open_store(f"{redis_server.url}?prefix={prefix}")
    assert isinstance(store, RedisStore) and store.prefix == prefix
    await store.create_session(SessionRecord(session_id="s"))
    assert (await store.get_session("s")) is not None
    await store.close()


async def test_two_writers_share_sessions(redis_server: RedisServer, prefix: str) -> None:
    # Two gateways on one Redis, calls of one session alternating between them: indices stay
    # contiguous and every prompt is still a delta against the call before it.
    a, b = RedisStore(redis_server.url, prefix=prefix), RedisStore(redis_server.url, prefix=prefix)
    try:
        sid = uuid.uuid4().hex
        await a.create_session(SessionRecord(session_id=sid))
        rng = np.random.default_rng(1)
        context = rng.integers(0, 1000, 30).astype(np.int32)
        sent = []
        for turn in range(8):
            completion = rng.integers(0, 1000, 5).astype(np.int32)
            call = make_call(sid, context.copy(), completion)
            await (a if turn % 2 else b).append_call(call)
            assert call.index == turn
            if turn:
                assert call.parent_call_id == sent[-1].call_id
                assert call.shared_prefix_len == sent[-1].full_tokens().shape[0]
            sent.append(call)
            context = np.concatenate([context, completion, rng.integers(0, 1000, 7)])
        for store in (a, b):
            got = await store.calls(sid)
            assert [c.call_id for c in got] == [c.call_id for c in sent]
            for x, y in zip(sent, got):
                np.testing.assert_array_equal(x.prompt_ids, y.prompt_ids)
        rec = await b.get_session(sid)
        assert rec is not None and rec.num_calls == 8
        # Completed through one, closed for the other.
        await a.complete(sid, reward=1.0)
        with pytest.raises(Exception, match="terminal"):
            await b.append_call(make_call(sid, context, [1]))
    finally:
        await a.close()
        await b.close()


async def test_concurrent_writers_one_session(redis_server: RedisServer, prefix: str) -> None:
    stores = [RedisStore(redis_server.url, prefix=prefix) for _ in range(3)]
    try:
        sid = uuid.uuid4().hex
        await stores[0].create_session(SessionRecord(session_id=sid))

        async def agent(i: int) -> None:
            for j in range(10):
                await stores[i].append_call(make_call(sid, [i, j], [j]))

        await asyncio.gather(*(agent(i) for i in range(3)))
        calls = await stores[1].calls(sid)
        assert [c.index for c in calls] == list(range(30))
        assert sorted((int(c.prompt_ids[0]), int(c.prompt_ids[1])) for c in calls) == sorted(
            (i, j) for i in range(3) for j in range(10)
        )
    finally:
        for s in stores:
            await s.close()


@pytest.mark.usefixtures("redis_server")  # its skip, or error under ROLLWIRE_REQUIRE_REDIS=1
async def test_outage_is_store_unavailable_then_recovers(prefix: str) -> None:
    # a server of its own: this test kills it
    with RedisServer() as server:
        store = RedisStore(server.url, prefix=prefix)
        try:
            await store.create_session(SessionRecord(session_id="s"))
            await store.append_call(make_call("s", [1], [2]))
            server.kill()
            with pytest.raises(StoreUnavailable, match="unavailable"):
                await store.append_call(make_call("s", [1, 2], [3]))
            with pytest.raises(StoreUnavailable):
                await store.get_session("s")
            server.start()
            # The first command on a dead connection may fail once; then it is back.
            for _ in range(3):
                try:
                    await store.ping()
                    break
                except StoreUnavailable:
                    continue
            c = await store.append_call(make_call("s", [1, 2], [3]))
            assert c.index == 1 and c.parent_call_id is not None
            assert [x.index for x in await store.calls("s")] == [0, 1]
        finally:
            await store.close()


async def test_get_settings_reads_the_set_ones_in_one_snapshot(
    redis_server: RedisServer, prefix: str
) -> None:
    a, b = RedisStore(redis_server.url, prefix=prefix), RedisStore(redis_server.url, prefix=prefix)
    try:
        await a.set_setting("gateway:paused", True)
        await a.set_setting("gateway:policy_version", "v3")
        await a.set_setting("gateway:policy_version", "v4")
        await a.set_setting("gateway:gone", 1)
        await a.set_setting("gateway:gone", None)
        names = ["gateway:paused", "gateway:policy_version", "gateway:gone", "never-set"]
        assert await b.get_settings(names) == {
            "gateway:paused": True,
            "gateway:policy_version": "v4",
        }
        assert await b.get_settings([]) == {}
    finally:
        await a.close()
        await b.close()


def test_a_loop_closed_before_its_flush_ran_does_not_stall_the_store(
    redis_server: RedisServer, prefix: str
) -> None:
    """A write whose loop stops and closes before the flush it scheduled ran (a loop stopped
    right after a write nobody awaits): the next loop's writes still go to Redis, that one with
    them. Before, the dead loop's flusher looked alive forever and nothing was sent again. (The
    Redis client's connections belong to the loop that opened them: the first loop opens none.)"""
    from rollwire.store.redis_writer import WriteOp

    store = RedisStore(redis_server.url, prefix=prefix)

    async def write_and_leave() -> None:
        store._w.submit(WriteOp("create", "s", SessionRecord(session_id="s")))  # never awaited
        asyncio.get_running_loop().stop()  # this iteration is the loop's last

    loop = asyncio.new_event_loop()
    loop.run_until_complete(write_and_leave())
    loop.close()

    async def later() -> int:
        try:
            await asyncio.wait_for(store.append_call(make_call("s", [1, 2], [3])), 10)
            return len(await store.calls("s"))
        finally:
            await store.close()

    assert asyncio.run(later()) == 1
