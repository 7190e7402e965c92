"""Soak: two gateway processes on one Redis, a backend that fails 1 % of calls, nothing lost.

    uv run --frozen python benchmarks/soak.py                      # 2,000 sessions x 10 calls, c=256
    uv run --frozen python benchmarks/soak.py --sessions 200       # quick

Each session is an agent of ``--calls`` sequential chat calls whose history grows; its calls
alternate between the two gateways (any gateway serves any call). An answer that is not a 200 (the
backend's injected 500s, a gateway being down) is retried once, as the OpenAI SDK does, with
``x-stainless-retry-count: 1`` through the other gateway. Phase 1 runs as is; phase 2 runs the same
load and ``kill -9``\\ s gateway A halfway, then starts it again on the same port and store.

Reported per phase: calls sent, answered (200), reported failed (non-200 or no answer), captured
(stored calls that succeeded) and failed calls stored; **lost** = answered calls whose request is
not stored as a successful call (must be 0); **double-trained** = requests with more than one
trainable stored copy (must be 0); RSS of each gateway before and after; p50/p99 latency and the
latency added over the same load sent straight to the backend.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import orjson
from _procs import Proc, free_port, rss_mb

KEY = "soak-admin-key"


# ----------------------------------------------------------------------------- faulty backend
def backend_main(port: int, fault_rate: float) -> None:
    """The null backend, answering ``fault_rate`` of chat calls with a 500."""
    import uvicorn

    from rollwire.testing.null_backend import NullBackend

    inner = NullBackend()
    rng = random.Random(1234)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if (
            scope["type"] == "http"
            and scope["path"].endswith("/chat/completions")
            and rng.random() < fault_rate
        ):
            while (await receive()).get("more_body"):
                pass
            body = b'{"error": {"message": "injected fault", "type": "server_error"}}'
            await send(
                {
                    "type": "http.response.start",
                    "status": 500,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await inner(scope, receive, send)

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


# ----------------------------------------------------------------------------- agents
class Tally:
    """What the agents saw."""

    def __init__(self) -> None:
        self.sent = 0
        self.answered: set[str] = set()
        self.failed = 0  # attempts that did not get a 200
        # "status code" of the attempts that failed ("0" when there was no answer)
        self.codes: Counter[str] = Counter()
        self.lat: list[float] = []


async def _post(http: Any, url: str, body: bytes, retry: int, tally: Tally) -> int:
    import aiohttp

    headers = {"content-type": "application/json"}
    if retry:
        headers["x-stainless-retry-count"] = str(retry)
    tally.sent += 1
    t = time.perf_counter()
    try:
        async with http.post(url, data=body, headers=headers) as r:
            answer = await r.read()
            status = r.status
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        status, answer = 0, b""
    if status == 200:
        tally.lat.append(time.perf_counter() - t)
    else:
        tally.failed += 1
        try:
            code = orjson.loads(answer)["error"].get("code") or ""
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
            code = ""
        tally.codes[f"{status} {code}".strip()] += 1
    return status


async def agent(http: Any, bases: list[str], sid: str, calls: int, tally: Tally) -> None:
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are a soak test."}]
    for turn in range(calls):
        tag = f"{sid}:{turn}"
        history.append({"role": "user", "content": f"{tag} " + "context " * 20})
        body = orjson.dumps({"model": "policy", "messages": history})
        first, other = bases[turn % 2], bases[(turn + 1) % 2]
        status = await _post(http, first + "/chat/completions", body, 0, tally)
        if status != 200:  # the SDK retries once; this one through the other gateway
            status = await _post(http, other + "/chat/completions", body, 1, tally)
        if status == 200:
            tally.answered.add(tag)
        history.append({"role": "assistant", "content": f"answer {turn}"})


async def run_agents(
    gateways: list[str], n_sessions: int, calls: int, concurrency: int, halfway: Any = None
) -> tuple[Tally, list[str]]:
    import aiohttp

    tally = Tally()
    sids: list[str] = []
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as http:
        sessions = []
        for i in range(n_sessions):
            async with http.post(
                gateways[i % 2] + "/api/sessions",
                json={"group_id": "soak"},
                headers={"authorization": f"Bearer {KEY}"},
            ) as r:
                s = await r.json()
            sids.append(s["session_id"])
            token_path = s["base_url"].split("/s/", 1)[1]
            sessions.append([f"{g}/s/{token_path}" for g in gateways])
        queue = iter(range(n_sessions))
        done = 0
        fired = False

        async def worker() -> None:
            nonlocal done, fired
            for i in queue:
                await agent(http, sessions[i], sids[i], calls, tally)
                done += 1
                if halfway is not None and not fired and done >= n_sessions // 2:
                    fired = True
                    await halfway()

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return tally, sids


async def direct_baseline(url: str, n: int, concurrency: int) -> list[float]:
    import aiohttp

    body = orjson.dumps(
        {"model": "policy", "messages": [{"role": "user", "content": "context " * 60}]}
    )
    lat: list[float] = []
    it = iter(range(n))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

        async def w() -> None:
            for _ in it:
                t = time.perf_counter()
                async with http.post(url + "/v1/chat/completions", data=body) as r:
                    await r.read()
                lat.append(time.perf_counter() - t)

        await asyncio.gather(*(w() for _ in range(concurrency)))
    return lat


# ----------------------------------------------------------------------------- checks
def audit(gateway: str, sids: list[str], tally: Tally) -> dict[str, Any]:
    """Read every session back and compare with what the agents saw."""
    import httpx

    ok_tags: set[str] = set()
    stored_ok = stored_failed = double = 0
    with httpx.Client(timeout=60, headers={"authorization": f"Bearer {KEY}"}) as c:
        for sid in sids:
            calls = c.get(f"{gateway}/api/sessions/{sid}/calls").json()["calls"]
            trainable: Counter[str] = Counter()
            for call in calls:
                tag = call["request"]["messages"][-1]["content"].split(" ", 1)[0]
                if call["status"] == "ok":
                    stored_ok += 1
                    ok_tags.add(tag)
                    if call["trainable"]:
                        trainable[tag] += 1
                else:
                    stored_failed += 1
            double += sum(1 for n in trainable.values() if n > 1)
    lost = len(tally.answered - ok_tags)
    return {
        "sent": tally.sent,
        "answered": len(tally.answered),
        "reported_failed": tally.failed,
        "failed_by_status": dict(sorted(tally.codes.items())),
        "captured_ok": stored_ok,
        "stored_failed": stored_failed,
        "lost": lost,
        "double_trained": double,
    }


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


# ----------------------------------------------------------------------------- main
def start_gateway(port: int, store: str, backend: str, name: str) -> Proc:
    argv = [
        sys.executable, "-m", "rollwire.cli.gateway", "--port", str(port), "--store", store,
        "--backend", f"{backend}=vllm", "--admin-key", KEY,
    ]  # fmt: skip
    return Proc(name, argv, f"http://127.0.0.1:{port}/health")


def phase(
    label: str,
    args: argparse.Namespace,
    store: str,
    backend: str,
    baseline: list[float],
    kill_halfway: bool,
) -> dict[str, Any]:
    ports = [free_port(), free_port()]
    gws = [start_gateway(p, store, backend, f"gw{i}") for i, p in enumerate(ports)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    rss0 = [rss_mb(g.pid) for g in gws]
    restarted = {}

    async def halfway() -> None:
        os.kill(gws[0].pid, signal.SIGKILL)
        gws[0].p.wait()
        t = time.perf_counter()
        gws[0] = await asyncio.to_thread(start_gateway, ports[0], store, backend, "gw0-again")
        restarted["down_s"] = time.perf_counter() - t

    t0 = time.perf_counter()
    try:
        tally, sids = asyncio.run(
            run_agents(
                urls, args.sessions, args.calls, args.concurrency, halfway if kill_halfway else None
            )
        )
        wall = time.perf_counter() - t0
        rss1 = [rss_mb(g.pid) for g in gws]
        out = audit(urls[1], sids, tally)
    finally:
        for g in gws:
            g.stop()
    base50, base99 = pct(baseline, 0.5), pct(baseline, 0.99)
    p50, p99 = pct(tally.lat, 0.5), pct(tally.lat, 0.99)
    out.update(
        phase=label,
        wall_s=wall,
        calls_per_s=tally.sent / wall,
        p50_ms=p50 * 1e3,
        p99_ms=p99 * 1e3,
        added_p50_ms=(p50 - base50) * 1e3,
        added_p99_ms=(p99 - base99) * 1e3,
        rss_mb=f"{rss0[0]:.0f}->{rss1[0]:.0f} / {rss0[1]:.0f}->{rss1[1]:.0f}",
        **restarted,
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sessions", type=int, default=2000)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--fault-rate", type=float, default=0.01)
    ap.add_argument("--backend", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.backend:
        backend_main(args.backend, args.fault_rate)
        return
    from rollwire.testing.redis_server import RedisServer

    bport = free_port()
    backend = Proc(
        "faulty-null",
        [sys.executable, __file__, "--backend", str(bport), "--fault-rate", str(args.fault_rate)],
        f"http://127.0.0.1:{bport}/health",
    )
    backend_url = f"http://127.0.0.1:{bport}"
    rows = []
    with RedisServer() as redis:
        try:
            baseline = asyncio.run(direct_baseline(backend_url, 4000, args.concurrency))
            for label, kill in (("steady", False), ("kill -9 gateway A halfway", True)):
                store = f"{redis.url}?prefix={'k' if kill else 's'}:"
                rows.append(phase(label, args, store, backend_url, baseline, kill))
        finally:
            backend.stop()
    print(
        f"{args.sessions} sessions x {args.calls} calls, concurrency {args.concurrency}, "
        f"{args.fault_rate:.0%} backend faults, 2 gateways on one Redis; cpus={os.cpu_count()}"
    )
    for r in rows:
        print(f"\n== {r.pop('phase')}")
        for k, v in r.items():
            print(f"  {k:<16} {v:.3f}" if isinstance(v, float) else f"  {k:<16} {v}")
    ok = all(r["lost"] == 0 and r["double_trained"] == 0 for r in rows)
    print("\nzero lost, zero double-trained:", "MET" if ok else "NOT MET")


if __name__ == "__main__":
    main()
