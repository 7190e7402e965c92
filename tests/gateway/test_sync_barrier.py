"""A weight sync's pause across two gateways on one Redis store: every gateway acknowledges and
drains before the push may start; calls held during it carry the new version; a gateway that
does not answer is named."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from rollwire.agent.serving import ServerThread
from rollwire.gateway import RunningGateway, serve_in_thread
from rollwire.testing.null_backend import NullBackend
from rollwire.testing.redis_server import RedisServer
from rollwire.testing.store import redis_server
from rollwire.trainer.gateway_client import GatewayAPIError

__all__ = ["redis_server"]

KEY = "sync-barrier-key"


@pytest.fixture()
def two_gateways(redis_server: RedisServer) -> Iterator[tuple[RunningGateway, RunningGateway]]:
    store = f"{redis_server.url}?prefix=sb{uuid.uuid4().hex[:8]}:"
    with (
        ServerThread(NullBackend(delay=1.0)) as slow,
        serve_in_thread(
            backends=[(slow.url, "vllm")],
            store=store,
            admin_key=KEY,
            shared_state_interval=0.1,
        ) as first,
        serve_in_thread(
            backends=[(slow.url, "vllm")],
            store=store,
            admin_key=KEY,
            shared_state_interval=0.1,
        ) as second,
    ):
        yield first, second


def _call(gw: RunningGateway, sid: str, done: dict[str, float]) -> None:
    with gw.client() as c:
        h = c.create_session(session_id=sid)
        r = httpx.post(
            f"{h.base_url}/chat/completions",
            json={"model": "policy", "messages": [{"role": "user", "content": sid}]},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        done[sid] = time.monotonic()


def _wait_members(gw: RunningGateway, n: int) -> None:
    # both gateways have heartbeated into the store (an event, not a sleep: poll the store)
    deadline = time.monotonic() + 30
    with gw.client() as c:
        while time.monotonic() < deadline:
            began = c.sync_begin(timeout=30)
            if len(began["gateways"]) >= n:
                c.sync_end(version=None)
                return
            c.sync_end(version=None)
    raise AssertionError(f"fewer than {n} gateways joined the store")


def test_pause_waits_for_the_other_gateways_call_and_resumes_with_the_version(
    two_gateways: tuple[RunningGateway, RunningGateway],
) -> None:
    first, second = two_gateways
    _wait_members(first, 2)
    done: dict[str, float] = {}
    in_flight = threading.Thread(target=_call, args=(second, "in-flight", done))
    in_flight.start()
    with second.client() as c2:
        while c2.pause_status()["in_flight"] == 0:  # the call is at the backend now
            time.sleep(0.01)
    with first.client() as c1:
        began = c1.sync_begin(timeout=30)
        assert len(began["gateways"]) == 2
        # the other gateway drained its call before acknowledging: by then the call was
        # committed and answered (whenever the agent's thread gets to read the answer)
        with second.client() as c2:
            assert len(c2.calls("in-flight")) == 1
            assert c2.pause_status() == {"paused": True, "in_flight": 0}
        held = threading.Thread(target=_call, args=(second, "held", done))
        held.start()
        with second.client() as c2:
            while not c2.list_sessions():  # the held call's session exists; the call waits
                time.sleep(0.01)
        assert "held" not in done
        c1.sync_end(version="v7")
    held.join(30)
    in_flight.join(30)
    with second.client() as c2:
        assert c2.get_policy_version() == "v7"
        (call,) = c2.calls("held")
        assert call.policy_version == "v7"  # sampled after the sync: the new version only
        (old,) = c2.calls("in-flight")
        assert old.policy_version is None


def test_a_gateway_that_does_not_acknowledge_is_named(
    two_gateways: tuple[RunningGateway, RunningGateway],
) -> None:
    first, second = two_gateways
    _wait_members(first, 2)
    # a third member that stopped answering: its record is there, its acknowledgement never comes
    import asyncio

    from rollwire.store import open_store

    async def ghost() -> None:
        store = open_store(first.gateway.config.store)
        try:
            await store.set_setting(
                "gateway:member:ghost-gw", {"at": time.time(), "acked": None}, ttl=60
            )
        finally:
            await store.close()

    asyncio.run(ghost())
    with first.client() as c1:
        with pytest.raises(GatewayAPIError) as err:
            c1.sync_begin(timeout=0.5)
        assert err.value.status_code == 504 and "ghost-gw" in err.value.message
        assert c1.pause_status()["paused"] is True  # all of them stay paused
        c1.resume()  # ends the sync's pause too
    with second.client() as c2:
        deadline = time.monotonic() + 10
        while c2.pause_status()["paused"] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert c2.pause_status()["paused"] is False
