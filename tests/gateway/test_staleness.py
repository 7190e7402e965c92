"""Staleness admission (issue 25.1): a session with ``max_staleness`` is not sampled more than
that many policy versions behind the trainer. A rollout not yet started is held (``hold``) until
the servers catch up; one under way has its stale calls flagged and kept out of training."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from rollwire.agent.serving import ServerThread
from rollwire.gateway import RunningGateway, serve_in_thread
from rollwire.testing.null_backend import NullBackend
from rollwire.testing.redis_server import RedisServer
from rollwire.testing.store import redis_server
from rollwire.trainer.gateway_client import GatewayAPIError, SessionHandle

__all__ = ["redis_server"]

KEY = "staleness-key"


@pytest.fixture()
def gw() -> Iterator[RunningGateway]:
    with (
        ServerThread(NullBackend()) as backend,
        serve_in_thread(backends=[(backend.url, "vllm")], admin_key=KEY) as gateway,
    ):
        yield gateway


def chat(h: SessionHandle, content: str = "hi") -> httpx.Response:
    body = {"model": "policy", "messages": [{"role": "user", "content": content}]}
    return httpx.post(f"{h.base_url}/chat/completions", json=body, timeout=60)


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    return t, out


def wait_for(cond: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def metric(gw: RunningGateway, name: str) -> float:
    text = httpx.get(gw.url + "/metrics").text
    (line,) = [x for x in text.splitlines() if x.split(" ")[0] == name]
    return float(line.split(" ")[1])


def test_a_stale_rollout_is_held_until_a_sync_catches_up_then_marked_once_running(
    gw: RunningGateway,
) -> None:
    with gw.client() as c:
        assert c.set_trainer_version(2, version="step-2")["lag"] == 2  # served: ordinal 0
        h = c.create_session(max_staleness=1)
        t, out = in_thread(lambda: chat(h))
        wait_for(lambda: c.staleness()["held"] == 1, "the first call to be held")
        assert metric(gw, "rollwire_stale_held") == 1
        assert metric(gw, "rollwire_stale_held_total") == 1
        # held, not in flight: a weight sync's drain does not wait for it
        assert c.pause_status() == {"paused": False, "in_flight": 0}
        assert c.sync_begin(timeout=10)["paused"] is True
        assert not out  # still held
        assert c.sync_end(version="step-1")["policy_seq"] == 1  # lag 1: within the bound
        t.join(30)
        assert out[0].status_code == 200, out[0].text
        (first,) = c.calls(h.session_id)
        assert first.policy_version == "step-1" and first.trainable and "stale" not in first.flags
        # the trainer moves on; the rollout has started, so its next call runs, flagged stale
        c.set_trainer_version(3)
        assert chat(h, "again").status_code == 200
        _, second = c.calls(h.session_id)
        assert "stale" in second.flags and not second.trainable and second.off_policy
        rows = c.trajectory(h.session_id)
        trained = sum(int(r.loss_mask.sum()) for r in rows)
        assert trained == len(first.completion_ids)  # the stale turn's tokens are masked
        assert c.staleness()["held"] == 0
    assert metric(gw, "rollwire_stale_marked_total") == 1
    assert metric(gw, "rollwire_stale_lag") == 2
    assert metric(gw, "rollwire_policy_seq") == 1
    assert metric(gw, "rollwire_stale_hold_seconds_count") == 1


def test_mark_runs_a_stale_rollout_and_flags_its_calls(gw: RunningGateway) -> None:
    with gw.client() as c:
        c.set_trainer_version(2)
        marked = c.create_session(max_staleness=1, on_stale="mark")
        within = c.create_session(max_staleness=2, on_stale="mark")
        unbounded = c.create_session()
        for h in (marked, within, unbounded):
            assert chat(h).status_code == 200
        assert c.staleness()["held"] == 0
        flags = {h.session_id: c.calls(h.session_id)[0].flags for h in (marked, within, unbounded)}
        assert "stale" in flags[marked.session_id]
        assert "stale" not in flags[within.session_id] + flags[unbounded.session_id]
        # a trainer that stops saying where it is bounds nothing
        assert c.set_trainer_version(None)["lag"] == 0
        assert chat(marked, "again").status_code == 200
        assert "stale" not in c.calls(marked.session_id)[1].flags
    assert metric(gw, "rollwire_stale_marked_total") == 1
    assert metric(gw, "rollwire_stale_held_total") == 0


def test_a_held_call_whose_session_runs_out_of_time_is_refused_as_expired(
    gw: RunningGateway,
) -> None:
    with gw.client() as c:
        c.set_trainer_version(5)
        h = c.create_session(max_staleness=0, ttl=3)
        t, out = in_thread(lambda: chat(h))
        wait_for(lambda: c.staleness()["held"] == 1, "the first call to be held")
        t.join(30)
        r = out[0]
        assert r.status_code == 401 and r.json()["error"]["code"] == "session_expired"
        assert c.get_session(h.session_id).status == "timeout"
    assert metric(gw, "rollwire_stale_hold_expired_total") == 1


def test_policy_ordinals_and_field_checks(gw: RunningGateway) -> None:
    with gw.client() as c:
        c.set_policy_version("a")
        c.set_policy_version("a")  # the same version again: the same ordinal
        assert c.staleness()["policy_seq"] == 1
        c.set_policy_version("b")
        assert c.staleness()["policy_seq"] == 2
        c.set_policy_version("c", seq=10)  # the trainer's own step numbers
        assert c._req("GET", "/api/policy_version") == {"version": "c", "seq": 10}
        c.sync_begin(timeout=10)
        assert c.sync_end(version="d", seq=12)["policy_seq"] == 12
        info = c.set_trainer_version(14, version="step-14")
        assert info == {
            "trainer_seq": 14,
            "trainer_version": "step-14",
            "policy_seq": 12,
            "policy_version": "d",
            "lag": 2,
            "held": 0,
        }
        for bad in ({"max_staleness": -1}, {"max_staleness": True}, {"on_stale": "drop"}):
            with pytest.raises(GatewayAPIError) as err:
                c.create_session(**bad)
            assert err.value.status_code == 400
        for body in ({}, {"seq": -1}, {"seq": "3"}, {"seq": 1, "version": 7}):
            with pytest.raises(GatewayAPIError) as err:
                c._req("POST", "/api/trainer_version", json=body)
            assert err.value.status_code == 400


def test_a_gateway_restarted_on_the_store_keeps_the_ordinals(tmp_path: Any) -> None:
    store = f"sqlite:///{tmp_path / 'gw.db'}"
    with ServerThread(NullBackend()) as backend:
        opts: dict[str, Any] = {"backends": [(backend.url, "vllm")], "admin_key": KEY}
        with serve_in_thread(**opts, store=store) as gw, gw.client() as c:
            c.set_policy_version("v4", seq=4)
            c.set_trainer_version(6)
        with serve_in_thread(**opts, store=store) as gw, gw.client() as c:
            info = c.staleness()
            assert (info["policy_seq"], info["trainer_seq"], info["lag"]) == (4, 6, 2)
            h = c.create_session(max_staleness=1, on_stale="mark")
            assert chat(h).status_code == 200
            assert "stale" in c.calls(h.session_id)[0].flags


# -- across gateways on one Redis store ----------------------------------------------------------


@pytest.fixture()
def two_gateways(redis_server: RedisServer) -> Iterator[tuple[RunningGateway, RunningGateway]]:
    store = f"{redis_server.url}?prefix=st{uuid.uuid4().hex[:8]}:"
    with ServerThread(NullBackend()) as backend:
        opts: dict[str, Any] = {
            "backends": [(backend.url, "vllm")],
            "store": store,
            "admin_key": KEY,
            "shared_state_interval": 0.1,
        }
        with serve_in_thread(**opts) as first, serve_in_thread(**opts) as second:
            yield first, second


def test_the_bound_holds_across_two_gateways_on_one_store(
    two_gateways: tuple[RunningGateway, RunningGateway],
) -> None:
    a, b = two_gateways
    bound = 1
    with a.client() as ca, b.client() as cb:
        ca.set_trainer_version(2)  # on the first gateway; the second follows the store
        wait_for(lambda: cb.staleness()["lag"] == 2, "the second gateway to see the trainer")
        held = cb.create_session(max_staleness=bound)
        t, out = in_thread(lambda: chat(held))
        wait_for(lambda: cb.staleness()["held"] == 1, "the first call to be held")
        # a sync started on the first gateway: the second acknowledges (its held call is not in
        # flight), and the version set on the first releases the call held on the second
        assert len(ca.sync_begin(timeout=20)["gateways"]) == 2
        ca.sync_end(version="step-1")
        t.join(30)
        assert out[0].status_code == 200, out[0].text
        # the second gateway holds a record of this session from before its first call, which
        # the first gateway serves (lag 1: within the bound)
        elsewhere = ca.create_session(max_staleness=bound)
        assert httpx.get(on(b, elsewhere) + "/models").status_code == 200
        assert chat(elsewhere).status_code == 200
        ca.set_trainer_version(3)
        wait_for(lambda: cb.staleness()["lag"] == 2, "the second gateway to see the trainer")
        # both rollouts have started: their next calls run, on the other gateway, flagged stale
        body = {"model": "policy", "messages": [{"role": "user", "content": "again"}]}
        for url in (on(a, held), on(b, elsewhere)):
            assert httpx.post(url + "/chat/completions", json=body, timeout=60).status_code == 200
        fresh = ca.create_session(max_staleness=bound, on_stale="mark")
        assert chat(fresh).status_code == 200
        trained_beyond = []
        for h in (held, elsewhere, fresh):
            calls = ca.calls(h.session_id)
            for call in calls:
                seq = {"step-1": 1}[str(call.policy_version)]
                trainer = 2 if call.index == 0 and h is not fresh else 3
                if trainer - seq > bound and call.trainable:
                    trained_beyond.append(call.call_id)
            rows = ca.trajectory(h.session_id)
            assert sum(int(r.loss_mask.sum()) for r in rows) == sum(
                len(c.completion_ids) for c in calls if c.trainable
            )
        assert trained_beyond == []  # no rollout beyond the bound trains
        assert ["stale" in c.flags for c in ca.calls(held.session_id)] == [False, True]
        assert ["stale" in c.flags for c in ca.calls(elsewhere.session_id)] == [False, True]
        assert ["stale" in c.flags for c in ca.calls(fresh.session_id)] == [True]


def on(gw: RunningGateway, h: SessionHandle) -> str:
    """The data-plane base URL of ``h`` on ``gw`` (the handle names the gateway that made it)."""
    return gw.url + "/s/" + h.base_url.split("/s/", 1)[1]
