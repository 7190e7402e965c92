"""A weight sync whose trainer or gateway is killed half-way (real processes, SIGKILL): the gateways
never stay paused for good, never serve unverified weights under any label, the trainer is told
which gateway failed and what to do, and the next sync succeeds."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from rollwire.agent.serving import free_port
from rollwire.engine import EmbeddedEngine, EngineConfig, ModelConfig, TinyModel
from rollwire.engine.hf_export import save_hf
from rollwire.gateway import RunningGateway, serve_in_thread
from rollwire.testing.redis_server import RedisServer
from rollwire.testing.store import redis_server
from rollwire.testing.waiting import until
from rollwire.trainer.gateway_client import GatewayAPIError, GatewayClient
from rollwire.trainer.references import engine_reference
from rollwire.trainer.weight_sync import WeightSync, WeightSyncError

__all__ = ["redis_server"]

KEY = "weight-sync-failures-key"
LEASE = 2.0  # seconds: short, so a lapse is seen quickly; renewed every LEASE / 4

# The trainer, as its own process: a WeightSync that stops (and is SIGKILLed by the test) right
# after the sync's pause ("push": before any weight moves) or while it verifies ("verify": after
# the push, before the version is stamped). It prints the sync's epoch when it stops.
TRAINER = textwrap.dedent(
    """
    import sys, threading
    from rollwire.trainer.gateway_client import GatewayClient
    from rollwire.trainer.references import engine_reference
    from rollwire.trainer.weight_sync import WeightSync

    url, key, folder, where, lease = sys.argv[1:6]
    forever = threading.Event()

    class Client(GatewayClient):
        def push_weights(self, *args, **kwargs):
            if where == "push":
                print("STOPPED", sync.history[-1].epoch, flush=True)
                forever.wait()
            return super().push_weights(*args, **kwargs)

    scorer = engine_reference(folder)

    def reference(prompt_ids, completion_ids):
        if where == "verify":
            print("STOPPED", sync.history[-1].epoch, flush=True)
            forever.wait()
        return scorer(prompt_ids, completion_ids)

    sync = WeightSync(Client(url, key), reference=reference, lease=float(lease))
    sync.sync(folder, "v1")
    """
)


class Lines:
    """A child process's output, line by line, on a thread (so a wait has a deadline)."""

    def __init__(self, stream: Any) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: Any) -> None:
        for raw in stream:
            self.lines.put(raw.decode(errors="replace") if isinstance(raw, bytes) else raw)

    def wait_for(self, text: str, timeout: float = 120.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"no line with {text!r} within {timeout:g} s; saw: {''.join(self.seen)[-3000:]}"
                ) from None
            self.seen.append(line)
            if text in line:
                return line


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("weights")
    a = save_hf(TinyModel(ModelConfig(seed=0)), root / "a")
    changed = TinyModel(ModelConfig(seed=0))
    rng = np.random.default_rng(1)
    changed.w.lm_head += rng.normal(0, 0.5, changed.w.lm_head.shape).astype(np.float32)
    return {"a": a, "b": save_hf(changed, root / "b")}


@pytest.fixture()
def engine(folders: dict[str, Path]) -> Iterator[EmbeddedEngine]:
    with EmbeddedEngine(EngineConfig(model_dir=folders["a"], default_max_tokens=6)) as eng:
        yield eng


def _greedy(base_url: str) -> httpx.Response:
    body = {
        "model": "policy",
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.0,
        "max_tokens": 6,
        "logprobs": True,
    }
    return httpx.post(f"{base_url}/chat/completions", json=body, timeout=120)


def _call(client: GatewayClient) -> tuple[httpx.Response, list[float], str | None]:
    """One greedy call in a new session: the answer, its recorded log-probs and version."""
    h = client.create_session()
    r = _greedy(h.base_url)
    if r.status_code != 200:
        return r, [], None
    (call,) = client.calls(h.session_id)
    return r, [float(x) for x in call.logprobs], call.policy_version


class HeldCall(threading.Thread):
    """A call made while the gateway is paused: it waits, and ends once the pause does."""

    def __init__(self, client: GatewayClient) -> None:
        super().__init__(daemon=True)
        self.handle = client.create_session()
        self.client = client
        self.response: httpx.Response | None = None
        self.start()

    def run(self) -> None:
        self.response = _greedy(self.handle.base_url)

    def recorded(self) -> tuple[list[float], str | None]:
        self.join(120)
        assert self.response is not None and self.response.status_code == 200, self.response
        (call,) = self.client.calls(self.handle.session_id)
        return [float(x) for x in call.logprobs], call.policy_version


# --------------------------------------------------------------------------- the trainer dies
@pytest.fixture()
def gateway(engine: EmbeddedEngine) -> Iterator[RunningGateway]:
    with serve_in_thread(
        backends=[(engine.url, "vllm")], admin_key=KEY, shared_state_interval=0.1
    ) as gw:
        with gw.client() as c:
            c.sync_weight_version("v0")
        yield gw


def _trainer(gw: RunningGateway, folder: Path, where: str, lease: float) -> str:
    """Start the trainer process, wait until it stopped mid-sync, SIGKILL it; the epoch of the
    sync it left behind."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-c", TRAINER, gw.url, KEY, str(folder), where, str(lease)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        assert proc.stdout is not None
        line = Lines(proc.stdout).wait_for("STOPPED", timeout=180)
    finally:
        proc.kill()
        proc.wait(30)
    return line.split()[1]


def test_a_trainer_killed_after_the_pause_leaves_the_old_weights_serving(
    gateway: RunningGateway, folders: dict[str, Path]
) -> None:
    with gateway.client() as c:
        _, before, _ = _call(c)
        epoch = _trainer(gateway, folders["b"], "push", LEASE)
        assert c.pause_status()["paused"] is True  # the dead trainer's pause still stands
        held = HeldCall(c)
        # its lease lapses (renewed every LEASE / 4 until the kill): every gateway resumes
        waited = until("the gateway resumes", lambda: not c.pause_status()["paused"], LEASE + 10)
        assert waited <= LEASE + 10
        lps, version = held.recorded()
        # nothing was pushed: the old weights, under the old label, nothing out of rotation
        assert version == "v0"
        np.testing.assert_allclose(lps, before, atol=1e-5)
        assert [b["quarantined"] for b in c.backends()] == [None]
        # the dead trainer's sync cannot end (a 409 naming what happened), nor stamp anything
        with pytest.raises(GatewayAPIError) as err:
            c.sync_end(version="v1", epoch=epoch)
        assert err.value.status_code == 409 and "lease lapsed" in err.value.message
        assert c.get_policy_version() == "v0"


def test_a_trainer_killed_after_the_push_leaves_that_server_out_until_a_sync_verifies_it(
    gateway: RunningGateway, folders: dict[str, Path], engine: EmbeddedEngine
) -> None:
    with gateway.client() as c:
        _, before, _ = _call(c)
        epoch = _trainer(gateway, folders["b"], "verify", LEASE)
        until("the gateway resumes", lambda: not c.pause_status()["paused"], LEASE + 10)
        # the server holds weights nobody verified: out of rotation, saying which sync and what
        (backend,) = c.backends()
        reason = backend["quarantined"]
        assert reason.startswith(f"unverified: weight sync {epoch} pushed version 'v1'"), reason
        assert c.get_policy_version() == "v0"  # never the new label on unverified weights
        r, _, _ = _call(c)
        assert r.status_code == 503, r.text
        message = r.json()["error"]["message"]
        assert "out of rotation" in message and epoch in message and engine.url in message
        # a new trainer's sync pushes to it again, verifies it, stamps the version
        sync = WeightSync(c, reference=engine_reference(folders["b"]), lease=LEASE)
        report = sync.sync(folders["b"], "v1")
        assert [b.verified for b in report.backends] == [True]
        assert report.took_over is None  # the old sync had lapsed already
        assert c.backends()[0]["quarantined"] is None
        r, after, version = _call(c)
        assert r.status_code == 200 and version == "v1"
        assert not np.allclose(after, before, atol=1e-3)  # served by the new weights


def test_the_next_sync_takes_over_a_dead_trainers_pause_at_once(
    gateway: RunningGateway, folders: dict[str, Path]
) -> None:
    with gateway.client() as c:
        epoch = _trainer(gateway, folders["b"], "verify", 600.0)  # a lease nobody waits out
        held = HeldCall(c)
        sync = WeightSync(c, reference=engine_reference(folders["b"]))
        t0 = time.monotonic()
        report = sync.sync(folders["b"], "v1")
        assert time.monotonic() - t0 < 60  # not the dead trainer's 600 s lease
        assert report.took_over == epoch and report.backends[0].verified
        _, version = held.recorded()
        assert version == "v1"  # the call held through both syncs was sampled by v1
        assert c.pause_status()["paused"] is False
        # the dead trainer's epoch is over: it can neither end nor renew it
        for stale in (
            lambda: c.sync_end(version="stale", epoch=epoch),
            lambda: c.sync_renew(epoch=epoch),
        ):
            with pytest.raises(GatewayAPIError) as err:
                stale()
            assert err.value.status_code == 409 and err.value.code == "sync_epoch_over"
        assert c.get_policy_version() == "v1"


def test_a_stale_epoch_is_refused_naming_the_sync_that_took_over(
    gateway: RunningGateway, folders: dict[str, Path]
) -> None:
    """What a trainer that lost its pause (lapsed, or taken over by another trainer) may no
    longer do: push, renew, end; each is a 409 that says what happened."""
    with gateway.client() as c:
        old = c.sync_begin(timeout=10, lease=60)["epoch"]
        new = c.sync_begin(timeout=10, lease=60)
        assert new["took_over"]["epoch"] == old
        (name,) = [b["name"] for b in c.backends()]
        for stale in (
            lambda: c.push_weights(
                name, weights_path=str(folders["b"]), version="x", timeout=30, epoch=old
            ),
            lambda: c.sync_renew(epoch=old),
            lambda: c.sync_end(version="x", epoch=old),
        ):
            with pytest.raises(GatewayAPIError) as err:
                stale()
            assert err.value.status_code == 409, err.value
            assert f"sync {new['epoch']} took it over" in err.value.message
        assert c.backends()[0]["quarantined"] is None  # the refused push changed nothing
        assert c.pause_status()["paused"] is True
        assert c.sync_end(version="v1", epoch=new["epoch"])["policy_version"] == "v1"
        assert c.pause_status()["paused"] is False


# --------------------------------------------------------------------------- a gateway dies
# ``rollwire gateway``'s own main(), in a process that has done its imports and waits for a line
# on stdin: a restart then takes a second, not the imports' ten on a busy machine.
GATEWAY = textwrap.dedent(
    """
    import sys
    import rollwire.cli.gateway, rollwire.gateway.app, rollwire.store.redis, uvicorn
    print("IMPORTED", flush=True)
    sys.stdin.readline()
    sys.argv = ["rollwire gateway", *sys.argv[1:]]
    rollwire.cli.gateway.main()
    """
)


class GatewayProcess:
    """``rollwire gateway`` in its own process on a fixed port (so it can be restarted there):
    :meth:`spawn` imports, :meth:`serve` starts it."""

    def __init__(self, store: str, backend: str, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.store = store
        argv = ["--port", str(self.port), "--store", store, "--backend", backend]
        env = {**os.environ, "ROLLWIRE_ADMIN_KEY": KEY, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", GATEWAY, *argv],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        assert self.proc.stdout is not None
        self.out = Lines(self.proc.stdout)

    def serve(self) -> GatewayProcess:
        assert self.proc.stdin is not None
        self.out.wait_for("IMPORTED", timeout=180)
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.flush()
        # printed once the port listens: a request from here on waits in its backlog
        self.out.wait_for(f"rollwire gateway on {self.url}", timeout=120)
        return self

    def client(self) -> GatewayClient:
        return GatewayClient(self.url, KEY, timeout=120)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)


@pytest.fixture()
def three_gateways(
    redis_server: RedisServer, engine: EmbeddedEngine
) -> Iterator[tuple[GatewayProcess, GatewayProcess, GatewayProcess]]:
    """A and B serving on one Redis store, and A's restart, imported, waiting to serve on A's
    port once A is dead."""
    store = f"{redis_server.url}?prefix=wsf{uuid.uuid4().hex[:8]}:"
    a = GatewayProcess(store, engine.url)
    procs = [a, GatewayProcess(store, engine.url), GatewayProcess(store, engine.url, a.port)]
    try:
        procs[0].serve(), procs[1].serve()
        yield procs[0], procs[1], procs[2]
    finally:
        for p in procs:
            p.kill()


def _both_joined(client: GatewayClient) -> None:
    # a sync's pause names every gateway that has heartbeated into the store
    def joined() -> bool:
        n = len(client.sync_begin(timeout=30)["gateways"])
        client.sync_end(version=None)
        return n >= 2

    until("both gateways joined the store", joined, 60)


def _killing(target: GatewayProcess, reference: Any) -> Any:
    """A reference that SIGKILLs ``target`` the first time it is asked: the gateway dies after
    the push, while the trainer verifies."""

    def score(prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> Sequence[float]:
        target.kill()
        return list(reference(prompt_ids, completion_ids))

    return score


def _kill_mid_sync(a: GatewayProcess, folder: Path, lease: float) -> WeightSync:
    sync = WeightSync(a.client(), reference=_killing(a, engine_reference(folder)), lease=lease)
    with pytest.raises(WeightSyncError) as err:
        sync.sync(folder, "v1")
    message = str(err.value)
    assert f"the gateway at {a.url} stopped answering" in message, message
    assert "call sync() again" in message and "stays paused" in message
    return sync


def _lapse_lease(store_url: str) -> None:
    """Let the standing sync's lease lapse now, as it does once its trainer stops renewing: the
    same epoch record, expiring in half a second (the store drops it, as at the end of its TTL)."""
    import asyncio

    from rollwire.gateway.sync_barrier import EPOCH_SETTING
    from rollwire.store import open_store

    async def lapse() -> None:
        store = open_store(store_url)
        try:
            record = await store.get_setting(EPOCH_SETTING)
            assert record is not None, "no sync is standing"
            await store.set_setting(EPOCH_SETTING, record, ttl=0.5)
        finally:
            await store.close()

    asyncio.run(lapse())


def test_a_gateway_killed_mid_sync_then_a_retry_through_the_survivor_succeeds(
    three_gateways: tuple[GatewayProcess, GatewayProcess, GatewayProcess],
    folders: dict[str, Path],
) -> None:
    a, b, restart = three_gateways
    with b.client() as cb:
        cb.sync_weight_version("v0")
        _both_joined(cb)
        sync = _kill_mid_sync(a, folders["b"], lease=60.0)
        first = sync.history[-1].epoch
        assert cb.pause_status()["paused"] is True  # the survivor keeps the pause
        held = HeldCall(cb)
        # the retry, at once, through the survivor: takes the pause over, waits only until the
        # dead gateway's membership expires (seconds, not the 60 s lease), pushes and verifies
        sync.gateway = cb
        sync.reference = engine_reference(folders["b"])
        report = sync.sync(folders["b"], "v1")
        assert report.took_over == first and report.backends[0].verified
        assert len(report.gateways) == 1 and report.pause_seconds < 30
        _, version = held.recorded()
        assert version == "v1"
        assert cb.pause_status()["paused"] is False
        # the dead gateway, restarted on its address, serves v1 at once
        with restart.serve().client() as ca:
            assert ca.pause_status()["paused"] is False
            assert ca.get_policy_version() == "v1"
            r, _, version = _call(ca)
            assert r.status_code == 200 and version == "v1"


def test_a_gateway_killed_mid_sync_then_its_restart_and_the_survivor_resume_as_the_lease_lapses(
    three_gateways: tuple[GatewayProcess, GatewayProcess, GatewayProcess],
    folders: dict[str, Path],
) -> None:
    a, b, restart = three_gateways
    # far longer than a restart, however busy the machine: the restart comes up inside the pause
    lease = 120.0
    with b.client() as cb:
        cb.sync_weight_version("v0")
        _both_joined(cb)
        sync = _kill_mid_sync(a, folders["b"], lease=lease)
        epoch = sync.history[-1].epoch
        with restart.serve().client() as ca:
            assert ca.pause_status()["paused"] is True  # it comes back paused (the store says)
            # nobody retries: the lease lapses (now, rather than in two minutes) and the survivor
            # and the restarted one resume
            _lapse_lease(a.store)
            for client in (cb, ca):
                until("resumed", lambda c=client: not c.pause_status()["paused"], 30)
                assert client.get_policy_version() == "v0"
                (backend,) = client.backends()
                assert str(backend["quarantined"]).startswith(f"unverified: weight sync {epoch}")
            r, _, _ = _call(cb)
            assert r.status_code == 503 and "out of rotation" in r.json()["error"]["message"]
            # then a sync through the restarted gateway verifies the server; every gateway
            # serves v1
            report = WeightSync(ca, reference=engine_reference(folders["b"])).sync(
                folders["b"], "v1"
            )
            assert report.backends[0].verified and len(report.gateways) == 2
            assert report.took_over is None
            until("the survivor sees v1", lambda: cb.get_policy_version() == "v1", 10)
            until("back in rotation", lambda: cb.backends()[0]["quarantined"] is None, 10)
            r, _, version = _call(cb)
            assert r.status_code == 200 and version == "v1"
