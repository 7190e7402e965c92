"""``kill -9`` of a gateway mid-run and a restart on the same store, SQLite and Redis: every
answered call is in the store, retries of unanswered calls are matched (one trainable copy),
and the pause state and policy version come back."""

from __future__ import annotations

import asyncio
import threading
import uuid
from pathlib import Path

import httpx
import orjson
import pytest

from rollwire.data.protocol import ModelCall
from rollwire.store import open_store
from rollwire.store.codec import request_key
from rollwire.testing.redis_server import RedisServer
from rollwire.trainer.gateway_client import GatewayClient

from .conftest import ADMIN_KEY, GatewayProcess

N_SESSIONS = 16


@pytest.fixture(params=["sqlite", "redis"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:{tmp_path / 'gw.sqlite'}"
    server: RedisServer = request.getfixturevalue("redis_server")
    return f"{server.url}?prefix=r{uuid.uuid4().hex[:8]}:"


def _body(sid: str, turn: int) -> bytes:
    return orjson.dumps(
        {"model": "policy", "messages": [{"role": "user", "content": f"{sid} turn {turn}"}]}
    )


async def _agent(
    client: httpx.AsyncClient,
    base: str,
    sid: str,
    answered: set[bytes],
    unanswered: list[tuple[str, bytes]],
    stop: threading.Event,
) -> None:
    for turn in range(1000):
        raw = _body(sid, turn)
        try:
            r = await client.post(
                f"{base}/chat/completions",
                content=raw,
                headers={"content-type": "application/json"},
            )
        except httpx.HTTPError:
            unanswered.append((base, raw))
            return
        if r.status_code == 200:
            answered.add(raw)
        else:
            unanswered.append((base, raw))
            return
        if stop.is_set():
            return


def _stored_bodies(gw: GatewayProcess, sid: str) -> list[tuple[str, bool, int]]:
    calls = gw.api("GET", f"/api/sessions/{sid}/calls").json()["calls"]
    return [
        (c["request"]["messages"][-1]["content"], c["trainable"], c["retry_count"]) for c in calls
    ]


def test_kill9_mid_run_then_restart(
    store_url: str, null_backend: str, gateway_procs: list[GatewayProcess]
) -> None:
    gw = GatewayProcess(store_url, [null_backend]).start()
    gateway_procs.append(gw)
    sessions = [
        gw.api("POST", "/api/sessions", json={"group_id": "g"}).json() for _ in range(N_SESSIONS)
    ]
    gw.api("POST", "/api/policy_version", json={"version": "v9"})
    answered: set[bytes] = set()
    unanswered: list[tuple[str, bytes]] = []
    stop = threading.Event()

    async def run() -> None:
        async with httpx.AsyncClient(timeout=30.0) as client:
            tasks = [
                asyncio.create_task(
                    _agent(client, s["base_url"], s["session_id"], answered, unanswered, stop)
                )
                for s in sessions
            ]
            while len(answered) < 8 * N_SESSIONS:  # all 16 sessions live, calls in flight
                await asyncio.sleep(0.01)
            gw.kill()
            stop.set()
            await asyncio.gather(*tasks)

    asyncio.run(run())
    assert len(answered) >= 8 * N_SESSIONS

    again = GatewayProcess(store_url, [null_backend]).start()
    gateway_procs.append(again)
    # The agents' SDKs retry what was not answered, to the restarted gateway (same port is not
    # needed: the token is the same, signed with the same admin key).
    for base, raw in unanswered:
        new_base = base.replace(gw.url, again.url)
        r = httpx.post(
            f"{new_base}/chat/completions",
            content=raw,
            headers={"content-type": "application/json", "x-stainless-retry-count": "1"},
            timeout=30.0,
        )
        assert r.status_code == 200, r.text
        answered.add(raw)
    stored_answered = 0
    for s in sessions:
        rows = _stored_bodies(again, s["session_id"])
        contents = [c for c, _, _ in rows]
        for raw in answered:
            content = orjson.loads(raw)["messages"][-1]["content"]
            if content.startswith(s["session_id"] + " "):
                assert content in contents, f"answered call {content!r} is not in the store"
                stored_answered += 1
                # One trainable copy per request, retried or not.
                assert sum(1 for c, t, _ in rows if c == content and t) == 1, rows
        assert [i for i, _ in enumerate(rows)] == list(range(len(rows)))
    assert stored_answered == len(answered)
    assert again.api("GET", "/api/policy_version").json()["version"] == "v9"


def test_stored_but_unanswered_call_is_matched_after_restart(
    store_url: str, null_backend: str, gateway_procs: list[GatewayProcess], tmp_path: Path
) -> None:
    # What a crash between commit and answer leaves: the call is in the store, the agent never
    # got it and its SDK retries the very same body to the restarted gateway.
    gw = GatewayProcess(store_url, [null_backend]).start()
    gateway_procs.append(gw)
    s = gw.api("POST", "/api/sessions", json={}).json()
    assert gw.api("POST", "/api/pause").json()["paused"] is True
    gw.kill()
    raw = _body(s["session_id"], 0)

    async def store_original() -> str:
        store = open_store(store_url)
        try:
            call = ModelCall(
                call_id="original",
                session_id=s["session_id"],
                index=0,
                prompt_ids=[1, 2, 3],
                completion_ids=[4, 5],
                logprobs=[-0.1, -0.2],
                request=orjson.loads(raw),
            )
            await store.append_call(call, request_key=request_key(raw))
            return call.call_id
        finally:
            await store.close()

    original = asyncio.run(store_original())
    again = GatewayProcess(store_url, [null_backend]).start()
    gateway_procs.append(again)
    base = s["base_url"].replace(gw.url, again.url)
    # The pause set before the crash holds after the restart.
    assert again.api("GET", "/api/pause").json()["paused"] is True
    assert again.api("POST", "/api/resume").json()["paused"] is False
    r = httpx.post(
        f"{base}/chat/completions",
        content=raw,
        headers={"content-type": "application/json", "x-stainless-retry-count": "1"},
        timeout=30.0,
    )
    assert r.status_code == 200, r.text
    calls = again.api("GET", f"/api/sessions/{s['session_id']}/calls").json()["calls"]
    assert len(calls) == 2 and calls[0]["call_id"] == original
    assert calls[0]["trainable"] is False and "superseded_by_retry" in calls[0]["flags"]
    assert calls[1]["trainable"] is True and calls[1]["retry_of"] == original
    # Trained on once: only the retry's tokens are in the training rows with mask 1.
    with GatewayClient(again.url, ADMIN_KEY) as client:
        rows = client.trajectory(s["session_id"])
        retry = client.calls(s["session_id"])[1]
    assert sum(int(row.loss_mask.sum()) for row in rows) == retry.completion_ids.shape[0] > 0
