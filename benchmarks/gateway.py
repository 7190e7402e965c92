"""Gateway overhead benchmark: direct vs rollwire gateway vs rllm-model-gateway, on 127.0.0.1.

    uv run --frozen python benchmarks/gateway.py --requests 2000          # quick (< 2 min)
    uv run --frozen python benchmarks/gateway.py --requests 10000 --skip-rllm
    uv run --frozen python benchmarks/gateway.py --big-db-gb 1 --skip-rllm  # p50/p99 on a >1 GB file
    uv run --frozen python benchmarks/gateway.py --rss-calls 100000 --skip-rllm  # RSS after N calls

``--big-db-gb`` and ``--rss-calls`` run only their phase (add ``--main`` for the comparison too).
Every run ends with a "targets" block: met / not met for each target, with the measured value.

Every server runs in its own process: a null backend answering instantly with a fixed vLLM-shaped
body (~512 prompt ids, 64 completion ids with log-probs), the rollwire gateway (SQLite capture), the
rollwire gateway on the Redis store (``rollwire-redis``, a throwaway redis-server with AOF) and
rllm-model-gateway 0.1.0 (installed into a temporary venv; skipped with a reason if that fails).
The load generator (aiohttp) runs in its own process too, alternating targets round by round.
Reported: requests/s, p50/p99 latency and the latency added over the direct path, server CPU per
call served (each thread's run time, /proc/<pid>/task/*/schedstat), how busy the server's
busiest thread was over a round (``thread %``, median over rounds: near 100 the server is bound
by that one thread, its event loop), calls captured vs sent, gateway RSS, and the storage cost of
one 40-turn session whose context grows ~200 tokens a turn.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from _procs import Proc, cpu_seconds, free_port, rss_mb, thread_seconds

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- helpers
def http_json(method: str, url: str, body: Any = None, key: str | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("content-type", "application/json")
    if key:
        req.add_header("authorization", f"Bearer {key}")
    with urllib.request.urlopen(req, timeout=60) as r:
        raw = r.read()
    return json.loads(raw) if raw else None


def request_body() -> dict[str, Any]:
    """~8 KB, 20 messages."""
    messages = [{"role": "system", "content": "You are a careful assistant. " * 12}]
    for i in range(19):
        role = "user" if i % 2 == 0 else "assistant"
        messages.append({"role": role, "content": f"message {i}: " + "lorem ipsum dolor sit " * 17})
    return {"model": "policy", "messages": messages, "temperature": 1.0, "max_tokens": 64}


def responses_body() -> dict[str, Any]:
    """:func:`request_body` as a Responses API request (instructions + input items)."""
    chat = request_body()
    system, *rest = chat["messages"]
    return {
        "model": "policy",
        "instructions": system["content"],
        "input": [{"role": m["role"], "content": m["content"]} for m in rest],
        "temperature": 1.0,
        "max_output_tokens": 64,
    }


def messages_body() -> dict[str, Any]:
    """:func:`request_body` as an Anthropic Messages request (system + messages)."""
    chat = request_body()
    system, *rest = chat["messages"]
    return {
        "model": "policy",
        "system": system["content"],
        "messages": [{"role": m["role"], "content": m["content"]} for m in rest],
        "temperature": 1.0,
        "max_tokens": 64,
    }


#: The target served from ``--compare-src`` (another checkout's source tree).
OLD = "rollwire-old"

# Same gateway process, same conversation, the dialect routes: CPU per call next to chat's.
DIALECTS = {
    "rollwire-responses": ("/responses", responses_body),
    "rollwire-messages": ("/messages", messages_body),
}


# ----------------------------------------------------------------------------- load generator
async def _load(
    urls: list[str], body: bytes, n: int, concurrency: int, headers: list[dict[str, str]]
) -> dict[str, Any]:
    import aiohttp

    lat: list[float] = []
    errors = 0
    counter = iter(range(n))
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as http:

        async def worker(w: int) -> None:
            nonlocal errors
            url, hdr = urls[w % len(urls)], headers[w % len(headers)]
            for _ in counter:
                t = time.perf_counter()
                async with http.post(url, data=body, headers=hdr) as r:
                    await r.read()
                    if r.status != 200:
                        errors += 1
                lat.append(time.perf_counter() - t)

        started = time.perf_counter()
        # warm-up: one request per connection
        await asyncio.gather(
            *(
                http.post(urls[w % len(urls)], data=body, headers=headers[w % len(headers)])
                for w in range(concurrency)
            )
        )
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        wall = time.perf_counter() - t0
        busy = time.perf_counter() - started  # with the warm-up: what the server's CPU spans
    return {"lat": lat, "wall": wall, "busy": busy, "errors": errors, "sent": n + concurrency}


def loadgen_main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    if spec.get("mode") == "rss":
        print(json.dumps(asyncio.run(_rss_load(spec))))
        return
    if spec.get("mode") == "flat":
        print(json.dumps(asyncio.run(_flat_load(spec))))
        return
    out = asyncio.run(
        _load(spec["urls"], spec["body"].encode(), spec["n"], spec["concurrency"], spec["headers"])
    )
    print(json.dumps(out))


def run_load(
    urls: list[str], headers: list[dict[str, str]], body: bytes, n: int, concurrency: int
) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(
            {
                "urls": urls,
                "headers": headers,
                "body": body.decode(),
                "n": n,
                "concurrency": concurrency,
            },
            f,
        )
    res = subprocess.run(
        [sys.executable, __file__, "--loadgen", f.name], capture_output=True, text=True, check=True
    )
    os.unlink(f.name)
    return json.loads(res.stdout)


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


# ----------------------------------------------------------------------------- targets
def gateway_module(src: str | None) -> str:
    """The gateway's CLI module in the source tree ``src`` (None: this checkout); older trees
    (before the ``cli/`` package) had it at ``rollwire.gateway.cli``."""
    if src is None or Path(src, "rollwire", "cli", "gateway.py").exists():
        return "rollwire.cli.gateway"
    return "rollwire.gateway.cli"


def start_rollwire(
    tmp: Path, backend_url: str, name: str, store: str | None = None, src: str | None = None
) -> tuple[Proc, str, str]:
    """A gateway process on SQLite (or ``store``); from the source tree ``src`` (a checkout's
    ``packages/core/src``) when given, else from this one: same interpreter and dependencies."""
    port, key = free_port(), "bench-admin-key"
    proc = Proc(
        name,
        [
            sys.executable,
            "-m",
            gateway_module(src),
            "--port",
            str(port),
            "--backend",
            f"{backend_url}=vllm",
            "--store",
            store or f"sqlite:{tmp / (name + '.sqlite')}",
            "--admin-key",
            key,
        ],
        f"http://127.0.0.1:{port}/health",
        env={"PYTHONPATH": src} if src else None,
    )
    return proc, f"http://127.0.0.1:{port}", key


def rollwire_sessions(
    url: str, key: str, k: int, group: str = "bench", route: str = "/chat/completions"
) -> list[str]:
    return [
        http_json("POST", url + "/api/sessions", {"group_id": group}, key)["base_url"] + route
        for _ in range(k)
    ]


def install_rllm(tmp: Path) -> Path | None:
    venv = tmp / "rllm-venv"
    try:
        subprocess.run(
            [sys.executable if False else "python3", "-m", "venv", str(venv)],
            check=True,
            capture_output=True,
            timeout=120,
        )
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", "rllm-model-gateway==0.1.0"],
            check=True,
            capture_output=True,
            timeout=600,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        err = getattr(exc, "stderr", b"") or b""
        print(
            f"!! rllm-model-gateway could not be installed ({exc}); "
            f"continuing without it. {err.decode(errors='replace')[-500:]}"
        )
        return None
    return venv / "bin" / "python"


def start_rllm(py: Path, tmp: Path, backend_url: str, name: str) -> tuple[Proc, str, Path]:
    port = free_port()
    db = tmp / (name + ".sqlite")
    proc = Proc(
        name,
        [
            str(py),
            "-m",
            "rllm_model_gateway",
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "--worker",
            backend_url + "/v1",
            "--db-path",
            str(db),
            "--store",
            "sqlite",
            "--log-level",
            "warning",
        ],
        f"http://127.0.0.1:{port}/health",
    )
    return proc, f"http://127.0.0.1:{port}", db


# ----------------------------------------------------------------------------- measuring
def compare(
    targets: dict[str, dict[str, Any]],
    urls: Any,
    levels: list[int],
    requests: int,
    rounds: int,
    body: bytes,
) -> list[dict[str, Any]]:
    """Alternate the targets round by round at each concurrency level; one row per (target,
    level). ``urls(c)`` gives ``{target: (urls, headers)}``; "direct" is the baseline. Besides the
    totals, each row has the median over rounds of CPU per call and of req/s (the numbers to
    compare on a loaded machine), and the server's RSS after the level."""
    rows = []
    for c in levels:
        stats: dict[str, dict[str, Any]] = {
            t: {
                "lat": [],
                "wall": 0.0,
                "cpu": 0.0,
                "n": 0,
                "served": 0,
                "errors": 0,
                "cpus": [],
                "rpss": [],
                "busiest": [],
            }
            for t in targets
        }
        level_urls = urls(c)
        per_round = max(1, requests // rounds)
        for i in range(rounds):
            # Forward, then backward: no target always runs right after the same other one.
            for t in list(targets) if i % 2 == 0 else list(targets)[::-1]:
                pid = targets[t]["pid"]
                threads0 = thread_seconds(pid)
                res = run_load(
                    level_urls[t][0], level_urls[t][1], targets[t].get("body", body), per_round, c
                )
                st = stats[t]
                threads = {k: v - threads0.get(k, 0.0) for k, v in thread_seconds(pid).items()}
                cpu = sum(threads.values())
                # The busiest thread's run time over the round's time (warm-up included, as in
                # the CPU): near 100 % when one thread (an event loop) bounds the throughput.
                st["busiest"].append(100.0 * max(threads.values(), default=0.0) / res["busy"])
                st["cpu"] += cpu
                # Per call served: the round's CPU includes its warm-up call on each connection.
                st["cpus"].append(cpu / max(1, res["sent"]) * 1e6)
                st["served"] += res["sent"]
                st["rpss"].append(len(res["lat"]) / res["wall"])
                st["lat"] += res["lat"]
                st["wall"] += res["wall"]
                st["n"] += len(res["lat"])
                st["errors"] += res["errors"]
                targets[t]["sent"] = targets[t].get("sent", 0) + res["sent"]
        base50, base99 = pct(stats["direct"]["lat"], 0.5), pct(stats["direct"]["lat"], 0.99)
        for t, st in stats.items():
            p50, p99 = pct(st["lat"], 0.5), pct(st["lat"], 0.99)
            rows.append(
                {
                    "target": t,
                    "c": c,
                    "rps": st["n"] / st["wall"],
                    "p50_ms": p50 * 1e3,
                    "p99_ms": p99 * 1e3,
                    "added_p50_ms": (p50 - base50) * 1e3 if t != "direct" else 0.0,
                    "added_p99_ms": (p99 - base99) * 1e3 if t != "direct" else 0.0,
                    "cpu_us": st["cpu"] / max(1, st["served"]) * 1e6,
                    "cpu_med_us": statistics.median(st["cpus"]),
                    "cpu_rounds": st["cpus"],
                    "rps_med": statistics.median(st["rpss"]),
                    "busiest_pct": statistics.median(st["busiest"]),
                    "rss_mb": rss_mb(targets[t]["pid"]),
                    "load1": os.getloadavg()[0],
                    "errors": st["errors"],
                }
            )
    return rows


def print_rows(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'target':<20}{'conc':>5}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'+p50 ms':>9}{'+p99 ms':>9}{'CPU us/call':>13}{'CPU med':>9}{'thread %':>9}"
        f"{'RSS MB':>8}{'errors':>8}{'load':>6}"
    )
    for r in rows:
        print(
            f"{r['target']:<20}{r['c']:>5}{r['rps']:>9.0f}{r['p50_ms']:>9.3f}{r['p99_ms']:>9.3f}"
            f"{r['added_p50_ms']:>9.3f}{r['added_p99_ms']:>9.3f}{r['cpu_us']:>13.0f}"
            f"{r['cpu_med_us']:>9.0f}{r['busiest_pct']:>9.0f}{r['rss_mb']:>8.0f}{r['errors']:>8}"
            f"{r['load1']:>6.1f}"
        )


def captured_calls(url: str, key: str, group: str) -> int:
    sessions = http_json("GET", f"{url}/api/sessions?group_id={group}", key=key)["sessions"]
    return sum(s["num_calls"] for s in sessions)


def start_redis(procs: list[Proc]) -> str | None:
    """A redis-server (AOF on, as the Redis store wants it) for the Redis row; None without one."""
    from rollwire.testing.redis_server import RedisServer, redis_server_binary

    if redis_server_binary() is None:
        print("redis-server not installed: no rollwire-redis row (apt-get install redis-server)")
        return None
    server = RedisServer().start()

    class _Stop:  # a Proc-like handle so the run's cleanup stops it with the rest
        pid = server.proc.pid if server.proc else 0

        def stop(self) -> None:
            server.close()

    procs.append(_Stop())  # type: ignore[arg-type]
    return server.url


def start_null(procs: list[Proc], fixed: bool = True) -> str:
    """The null backend: a fixed vLLM-shaped answer, or (``fixed=False``) prompt ids that follow
    the messages, so a growing conversation has a growing prompt."""
    nport = free_port()
    null = Proc(
        "null" if fixed else "echo",
        [sys.executable, "-m", "rollwire.testing.null_backend", "--port", str(nport)]
        + (["--fixed"] if fixed else []),
        f"http://127.0.0.1:{nport}/health",
    )
    procs.append(null)
    return f"http://127.0.0.1:{nport}"


# ----------------------------------------------------------------------------- big database
def grow_db(path: Path, gb: float) -> float:
    """Pre-grow a rollwire SQLite file past ``gb`` GB with synthetic completed sessions
    (4 calls each, ~4 KB a call: 3 KB of new prompt ids, 256 B ids, 256 B log-probs, 300 B
    messages), by bulk SQL without a journal. Returns the file size in GB."""
    from rollwire.store.sqlite import _SCHEMA

    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=OFF")
    conn.execute("PRAGMA synchronous=OFF")
    conn.executescript(_SCHEMA)
    row_bytes = 3000 + 256 + 256 + 300 + 120
    n_calls = int(gb * 1024**3 / row_bytes * 1.08)
    n_sessions = n_calls // 4 + 1
    chunk = 50_000
    conn.execute("BEGIN")
    for lo in range(0, n_sessions, chunk):
        hi = min(n_sessions, lo + chunk)
        conn.execute(
            "WITH RECURSIVE n(i) AS (SELECT ? UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?)"
            " INSERT INTO sessions (session_id, group_id, task_id, status, created_at,"
            " num_calls, num_tokens, data) SELECT printf('big-%09d', i), 'big', NULL,"
            " 'completed', 0.0, 4, 256, '{}' FROM n",
            (lo, hi),
        )
    for lo in range(0, n_calls, chunk):
        hi = min(n_calls, lo + chunk)
        conn.execute(
            "WITH RECURSIVE n(i) AS (SELECT ? UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?)"
            " INSERT INTO calls (session_id, idx, call_id, parent_call_id, shared_prefix_len,"
            " new_prompt, completion, logprobs, experts, shared_messages, new_messages, meta)"
            " SELECT printf('big-%09d', i / 4), i % 4, printf('bigc%010d', i), NULL, 0,"
            " randomblob(3000), randomblob(256), randomblob(256), NULL, 0, randomblob(300),"
            ' \'{"status":"ok"}\' FROM n',
            (lo, hi),
        )
    conn.execute("COMMIT")
    conn.close()
    return path.stat().st_size / 1024**3


def big_db_phase(
    args: argparse.Namespace, tmp: Path, procs: list[Proc], body: bytes
) -> dict[str, Any]:
    null_url = start_null(procs)
    db = tmp / "rollwire-big.sqlite"
    t = time.perf_counter()
    size = grow_db(db, args.big_db_gb)
    print(f"\nbig database: grew {db.name} to {size:.2f} GB in {time.perf_counter() - t:.0f}s")
    rw, rw_url, key = start_rollwire(tmp, null_url, "rollwire-big")
    procs.append(rw)
    targets: dict[str, dict[str, Any]] = {
        "direct": {"pid": procs[-2].pid},
        "rollwire-bigdb": {"pid": rw.pid},
    }
    hdr = [{"content-type": "application/json"}]

    def urls(c: int) -> dict[str, tuple[list[str], list[dict[str, str]]]]:
        return {
            "direct": ([null_url + "/v1/chat/completions"], hdr),
            "rollwire-bigdb": (rollwire_sessions(rw_url, key, c, group="bigbench"), hdr),
        }

    rows = compare(targets, urls, [1, 64], args.big_db_requests, args.rounds, body)
    time.sleep(1.0)
    captured = captured_calls(rw_url, key, "bigbench")
    sent = targets["rollwire-bigdb"]["sent"]
    size = sum(p.stat().st_size for p in tmp.glob("rollwire-big.sqlite*")) / 1024**3
    print(f"\nagainst a {size:.2f} GB SQLite file (file + WAL after the run):")
    print_rows(rows)
    print(f"rollwire-bigdb: captured {captured} of {sent} sent")
    return {"rows": rows, "captured": captured, "sent": sent, "size_gb": size}


# ----------------------------------------------------------------------------- RSS
async def _rss_load(spec: dict[str, Any]) -> dict[str, Any]:
    """Sessions of ``per_session`` calls each, created through /api and completed with their
    own token when done; ``concurrency`` sessions at a time until ``calls`` calls were sent."""
    import aiohttp

    api, key, body = spec["api"], spec["key"], spec["body"].encode()
    n_sessions = -(-spec["calls"] // spec["per_session"])
    todo = iter(range(n_sessions))
    sent = errors = 0
    admin = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

        async def worker() -> None:
            nonlocal sent, errors
            for i in todo:
                async with http.post(
                    api + "/api/sessions", data=b'{"group_id": "rss"}', headers=admin
                ) as r:
                    h = await r.json()
                url = h["base_url"] + "/chat/completions"
                k = min(spec["per_session"], spec["calls"] - i * spec["per_session"])
                for _ in range(k):
                    async with http.post(
                        url, data=body, headers={"content-type": "application/json"}
                    ) as r:
                        await r.read()
                        sent += 1
                        errors += r.status != 200
                async with http.post(
                    h["complete_url"],
                    data=b'{"reward": 1.0}',
                    headers={
                        "authorization": f"Bearer {h['token']}",
                        "content-type": "application/json",
                    },
                ) as r:
                    await r.read()

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(spec["concurrency"])))
    return {"sent": sent, "errors": errors, "wall": time.perf_counter() - t0}


def rss_phase(
    args: argparse.Namespace, tmp: Path, procs: list[Proc], body: bytes
) -> dict[str, Any]:
    null_url = start_null(procs)
    rw, rw_url, key = start_rollwire(tmp, null_url, "rollwire-rss")
    procs.append(rw)
    # Warm up (imports, pools, caches) before the "before" reading.
    warm = _spawn_loadgen(
        {
            "mode": "rss",
            "api": rw_url,
            "key": key,
            "body": body.decode(),
            "calls": 640,
            "per_session": 20,
            "concurrency": 64,
        }
    )
    rss0 = rss_mb(rw.pid)
    cpu0 = cpu_seconds(rw.pid)
    res = _spawn_loadgen(
        {
            "mode": "rss",
            "api": rw_url,
            "key": key,
            "body": body.decode(),
            "calls": args.rss_calls,
            "per_session": 20,
            "concurrency": 64,
        }
    )
    cpu = cpu_seconds(rw.pid) - cpu0
    time.sleep(1.0)
    rss1 = rss_mb(rw.pid)
    captured = captured_calls(rw_url, key, "rss")
    sent = res["sent"] + warm["sent"]
    print(
        f"\nRSS: {res['sent']} calls in {res['wall']:.0f}s ({res['sent'] / res['wall']:.0f}/s, "
        f"{cpu / max(1, res['sent']) * 1e6:.0f} us CPU/call) over sessions of 20 calls at "
        f"concurrency 64: gateway RSS {rss0:.0f} MB -> {rss1:.0f} MB; captured {captured} of "
        f"{sent} sent; errors {res['errors'] + warm['errors']}"
    )
    return {"rss0": rss0, "rss1": rss1, "calls": res["sent"], "captured": captured, "sent": sent}


# ----------------------------------------------------------------------------- RSS, phase by phase
FLAT_MB = 10  # RSS growth allowed from the 10% point to the end of a --flat-calls shape

#: The traffic shapes of the benchmark's phases, each driven through a fresh gateway while its RSS
#: is sampled: long-lived sessions (the main phase: sessions never completed, here 64 of them
#: at concurrency 64) on each route; sessions of 20 calls completed as they end (the RSS phase);
#: sessions of 40 turns whose context grows every turn, then completed (the storage phase).
FLAT_SHAPES = {
    "chat-long": ("long", "/chat/completions", request_body),
    "responses-long": ("long", "/responses", responses_body),
    "messages-long": ("long", "/messages", messages_body),
    "chat-20-call": ("short", "/chat/completions", request_body),
    "chat-growing-40-turn": ("growing", "/chat/completions", request_body),
}


async def _flat_load(spec: dict[str, Any]) -> dict[str, Any]:
    """``calls`` calls of one shape at ``concurrency``; the gateway's RSS sampled as they go."""
    import aiohttp

    total, conc, pid = spec["calls"], spec["concurrency"], spec["pid"]
    body = spec["body"].encode()
    hdr = {"content-type": "application/json"}
    admin = {"authorization": f"Bearer {spec['key']}", "content-type": "application/json"}
    state = {"done": 0, "errors": 0}
    samples: list[tuple[int, float]] = []
    todo = iter(range(total))

    async def sample() -> None:
        while True:
            samples.append((state["done"], rss_mb(pid)))
            await asyncio.sleep(0.25)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

        async def post(url: str, data: bytes, headers: dict[str, str]) -> Any:
            async with http.post(url, data=data, headers=headers) as r:
                out = await r.read()
                ok = 200 <= r.status < 300
                state["errors"] += not ok
                return json.loads(out) if ok else None

        async def session() -> dict[str, Any]:
            return dict(await post(spec["api"] + "/api/sessions", b'{"group_id": "flat"}', admin))

        async def complete(h: dict[str, Any]) -> None:
            auth = {"authorization": f"Bearer {h['token']}", "content-type": "application/json"}
            await post(h["complete_url"], b'{"reward": 1.0}', auth)

        async def long(w: int) -> None:
            url = spec["urls"][w % len(spec["urls"])]
            for _ in todo:
                await post(url, body, hdr)
                state["done"] += 1

        async def short(w: int) -> None:
            while True:
                h = await session()
                for _ in range(20):
                    if next(todo, None) is None:
                        return await complete(h)
                    await post(h["base_url"] + spec["route"], body, hdr)
                    state["done"] += 1
                await complete(h)

        async def growing(w: int) -> None:
            base = json.loads(body)
            while True:
                h = await session()
                messages = [{"role": "system", "content": "You are a helpful agent. " * 8}]
                for turn in range(40):
                    if next(todo, None) is None:
                        return await complete(h)
                    messages.append({"role": "user", "content": f"turn {turn}: " + "obs " * 48})
                    req = _compact_json({**base, "messages": messages})
                    out = await post(h["base_url"] + spec["route"], req, hdr)
                    state["done"] += 1
                    reply = out["choices"][0]["message"]["content"] if out else ""
                    messages.append({"role": "assistant", "content": reply})
                await complete(h)

        worker = {"long": long, "short": short, "growing": growing}[spec["shape"]]
        sampler = asyncio.ensure_future(sample())
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(conc)))
        wall = time.perf_counter() - t0
        sampler.cancel()
    samples.append((state["done"], rss_mb(pid)))
    return {"samples": samples, "sent": state["done"], "errors": state["errors"], "wall": wall}


def _compact_json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def flat_phase(args: argparse.Namespace, tmp: Path, procs: list[Proc]) -> list[dict[str, Any]]:
    """Each shape of :data:`FLAT_SHAPES` through its own fresh gateway for ``--flat-calls``
    calls: RSS once the first 10% are done (caches warm) and at the end."""
    null_url, echo_url = start_null(procs), start_null(procs, fixed=False)
    out = []
    names = args.flat_shapes.split(",") if args.flat_shapes else list(FLAT_SHAPES)
    for name in names:
        shape, route, make_body = FLAT_SHAPES[name]
        backend = echo_url if shape == "growing" else null_url
        rw, rw_url, key = start_rollwire(tmp, backend, f"rollwire-flat-{name}")
        try:
            urls = rollwire_sessions(rw_url, key, 64, "flat", route) if shape == "long" else []
            spec = {
                "mode": "flat",
                "shape": shape,
                "route": route,
                "urls": urls,
                "api": rw_url,
                "key": key,
                "body": json.dumps(make_body()),
                "calls": args.flat_calls,
                "concurrency": 64,
                "pid": rw.pid,
            }
            cpu0 = cpu_seconds(rw.pid)
            load0 = os.getloadavg()[0]
            res = _spawn_loadgen(spec)
            cpu = cpu_seconds(rw.pid) - cpu0
            samples = res["samples"]
            warm = next(r for d, r in samples if d >= args.flat_calls // 10)
            row = {
                "shape": name,
                "calls": res["sent"],
                "errors": res["errors"],
                "rps": res["sent"] / res["wall"],
                "cpu_us": cpu / max(1, res["sent"]) * 1e6,
                "rss_start": samples[0][1],
                "rss_warm": warm,
                "rss_peak": max(r for _, r in samples),
                "rss_end": samples[-1][1],
                "load": (load0, os.getloadavg()[0]),
            }
            out.append(row)
            print(
                f"flat {name:<22} {row['calls']} calls ({row['rps']:.0f}/s, {row['cpu_us']:.0f} us "
                f"CPU/call, errors {row['errors']}): RSS {row['rss_start']:.0f} -> "
                f"{row['rss_warm']:.0f} MB at 10% -> {row['rss_end']:.0f} MB at the end "
                f"(peak {row['rss_peak']:.0f}); load {load0:.1f} -> {row['load'][1]:.1f}",
                flush=True,
            )
        finally:
            rw.stop()
    return out


def _spawn_loadgen(spec: dict[str, Any]) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
    try:
        res = subprocess.run(
            [sys.executable, __file__, "--loadgen", f.name], capture_output=True, text=True
        )
    finally:
        os.unlink(f.name)
    if res.returncode != 0:
        raise RuntimeError(f"the load generator failed: {res.stderr[-3000:]}")
    return dict(json.loads(res.stdout))


# ----------------------------------------------------------------------------- targets
def targets_block(
    main_rows: list[dict[str, Any]] | None,
    main_lost: tuple[int, int] | None,
    rllm: bool,
    big: dict[str, Any] | None,
    rss: dict[str, Any] | None,
    flat: list[dict[str, Any]] | None = None,
) -> None:
    """Met / not met for each target (issues 4 and 22), with the measured value."""
    out: list[tuple[str, str, str]] = []

    def row(rows: list[dict[str, Any]] | None, target: str, c: int) -> dict[str, Any] | None:
        for r in rows or ():
            if r["target"] == target and r["c"] == c:
                return r
        return None

    def add(name: str, ok: bool | None, value: str) -> None:
        out.append((name, "not measured" if ok is None else "MET" if ok else "NOT MET", value))

    r1 = row(main_rows, "rollwire", 1)
    if r1 is not None:
        add(
            "added p50 <= 1 ms at concurrency 1",
            r1["added_p50_ms"] <= 1.0,
            f"{r1['added_p50_ms']:.2f} ms",
        )
    else:
        add("added p50 <= 1 ms at concurrency 1", None, "run without --big-db-gb/--rss-calls")
    r64, l64 = row(main_rows, "rollwire", 64), row(main_rows, "rllm-model-gateway", 64)
    if r64 is not None and l64 is not None:
        ratio = r64["rps_med"] / l64["rps_med"]
        add(
            "throughput at 64 >= 20x rllm-model-gateway (medians over rounds)",
            ratio >= 20,
            f"{r64['rps_med']:.0f} vs {l64['rps_med']:.0f} req/s = {ratio:.1f}x; busiest "
            f"thread {r64['busiest_pct']:.0f} % vs {l64['busiest_pct']:.0f} % busy",
        )
    else:
        add("throughput at 64 >= 20x rllm-model-gateway", None, "needs the main run with rllm")
    for c in sorted({r["c"] for r in main_rows or ()}):
        new, old = row(main_rows, "rollwire", c), row(main_rows, OLD, c)
        limit = 1.0 if c == 1 else 0.85
        name = f"CPU/call at {c} <= {limit:.2f}x {OLD} (medians over rounds)"
        if new is None or old is None:
            add(name, None, "needs --compare-src")
            continue
        ratio = new["cpu_med_us"] / old["cpu_med_us"]
        paired = sorted(a / b for a, b in zip(new["cpu_rounds"], old["cpu_rounds"]))
        k = len(paired)
        add(
            name,
            ratio <= limit,
            f"{new['cpu_med_us']:.0f} vs {old['cpu_med_us']:.0f} us = {ratio:.2f}x; round by "
            f"round {statistics.median(paired):.2f}x, {paired[0]:.2f}-{paired[-1]:.2f} over {k} "
            f"rounds ({100 * (1 - 2 ** (1 - k)):.0f}% interval of the median)",
        )
    hi = [r for r in main_rows or () if r["target"] == "rollwire" and r["c"] >= 16]
    if hi:
        worst = max(r["cpu_us"] for r in hi)
        add(
            "server CPU <= 500 us/call at concurrency >= 16",
            worst <= 500,
            ", ".join(f"{r['cpu_us']:.0f} us at {r['c']}" for r in hi),
        )
    else:
        add("server CPU <= 500 us/call at concurrency >= 16", None, "")
    if r1 is not None:
        add(
            "server CPU <= 650 us/call at concurrency 1",
            r1["cpu_us"] <= 650,
            f"{r1['cpu_us']:.0f} us",
        )
    else:
        add("server CPU <= 650 us/call at concurrency 1", None, "")
    for name in DIALECTS:
        pairs = [
            (r, row(main_rows, name, r["c"])) for r in main_rows or () if r["target"] == "rollwire"
        ]
        ratios = [(d["cpu_us"] / r["cpu_us"], r["c"]) for r, d in pairs if d is not None]
        add(
            f"{name.removeprefix('rollwire-')} CPU/call <= 1.3x chat completions",
            (max(x for x, _ in ratios) <= 1.3) if ratios else None,
            ", ".join(f"{x:.2f}x at {c}" for x, c in ratios),
        )
    for label, rows, tname in (
        ("", main_rows, "rollwire"),
        (" (>1 GB db)", big["rows"] if big else None, "rollwire-bigdb"),
    ):
        for c, limit in ((64, 100.0), (1, 20.0)):
            r = row(rows, tname, c)
            name = f"p99 <= {limit:.0f} ms at concurrency {c}{label}"
            if r is None:
                add(name, None, "")
            else:
                add(name, r["p99_ms"] <= limit, f"{r['p99_ms']:.1f} ms")
    lost: list[str] = []
    ok_lost: bool | None = None
    for what, pair in (
        ("main", main_lost),
        ("big db", (big["captured"], big["sent"]) if big else None),
        ("rss", (rss["captured"], rss["sent"]) if rss else None),
    ):
        if pair is not None:
            lost.append(f"{what}: {pair[0]} of {pair[1]}")
            ok_lost = (ok_lost is not False) and pair[0] == pair[1]
    add("zero calls lost (captured == sent)", ok_lost, "; ".join(lost))
    s64, x64 = row(main_rows, "rollwire", 64), row(main_rows, "rollwire-redis", 64)
    name = "Redis store CPU/call at 64 <= 1.5x SQLite's"
    if s64 is not None and x64 is not None:
        ratio = x64["cpu_us"] / s64["cpu_us"]
        add(name, ratio <= 1.5, f"{x64['cpu_us']:.0f} vs {s64['cpu_us']:.0f} us = {ratio:.2f}x")
    else:
        add(name, None, "needs the main run with redis-server installed")
    if rss is not None:
        add(
            f"gateway RSS < 150 MB after {rss['calls']} calls",
            rss["rss1"] < 150,
            f"{rss['rss0']:.0f} MB -> {rss['rss1']:.0f} MB",
        )
    else:
        add("gateway RSS < 150 MB after 100k calls", None, "use --rss-calls 100000")
    for f in flat or ():
        growth = f["rss_end"] - f["rss_warm"]
        add(
            f"RSS flat over {f['calls']} calls, {f['shape']} (end <= 10% point + {FLAT_MB} MB)",
            growth <= FLAT_MB and f["errors"] == 0,
            f"{f['rss_warm']:.0f} -> {f['rss_end']:.0f} MB ({growth:+.0f}), errors {f['errors']}",
        )
    if flat is None:
        add("RSS of every phase flat over >= 50k calls", None, "use --flat-calls 50000")
    print("\ntargets (issues 4 and 22):")
    width = max(len(n) for n, _, _ in out)
    for name, verdict, value in out:
        print(f"  {name:<{width}}  {verdict:<13} {value}")
    if not rllm:
        print("  (rllm-model-gateway not run: the 20x throughput target needs it)")


# ----------------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--requests", type=int, default=2000, help="requests per target and level")
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--rounds", type=int, default=4, help="alternating rounds per level")
    ap.add_argument("--skip-rllm", action="store_true")
    ap.add_argument("--skip-redis", action="store_true", help="no rollwire-redis row")
    ap.add_argument("--turns", type=int, default=40)
    ap.add_argument(
        "--big-db-gb",
        type=float,
        default=0.0,
        help="pre-grow a rollwire SQLite file past this many GB, then measure c=1 and c=64",
    )
    ap.add_argument("--big-db-requests", type=int, default=6000, help="per level, big-db phase")
    ap.add_argument(
        "--rss-calls", type=int, default=0, help="drive this many calls and report gateway RSS"
    )
    ap.add_argument(
        "--main",
        action="store_true",
        help="also run the main comparison when --big-db-gb or --rss-calls is given",
    )
    ap.add_argument(
        "--backend",
        choices=["null", "vllm"],
        default="null",
        help="null: the instant null backend (default); vllm: real vLLM (CPU build) from "
        "--vllm-python, direct vs through the gateway only (see benchmarks/_vllm.py)",
    )
    ap.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    ap.add_argument(
        "--flat-calls",
        type=int,
        default=0,
        help="drive this many calls through a fresh gateway for each traffic shape of the "
        "benchmark's phases (long-lived sessions on each route, 20-call sessions, 40-turn "
        "sessions with growing context) and check that its RSS stays flat after the first 10%%",
    )
    ap.add_argument("--flat-shapes", help="comma-separated subset of the --flat-calls shapes")
    ap.add_argument(
        "--compare-src",
        help="also serve the rollwire gateway from this source tree (another checkout's "
        "packages/core/src, e.g. an older commit's) as target rollwire-old, run right before "
        "rollwire in every round; CPU per call compared by the median over rounds",
    )
    ap.add_argument("--loadgen", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.loadgen:
        loadgen_main(args.loadgen)
        return
    if args.backend == "vllm":
        from _vllm import vllm_phase

        with tempfile.TemporaryDirectory(prefix="rollwire-bench-vllm-") as tmpname:
            vllm_procs: list[Proc] = []
            try:
                vllm_phase(args, Path(tmpname), vllm_procs)
            finally:
                for p in reversed(vllm_procs):
                    p.stop()
        return
    levels = [int(x) for x in args.concurrency.split(",")]
    run_main = args.main or not (args.big_db_gb or args.rss_calls or args.flat_calls)
    tmpdir = tempfile.TemporaryDirectory(prefix="rollwire-bench-")
    tmp = Path(tmpdir.name)
    procs: list[Proc] = []
    body = json.dumps(request_body()).encode()
    print(
        f"request body: {len(body)} bytes, {len(request_body()['messages'])} messages; "
        f"{args.requests} requests per target per level; cpus={os.cpu_count()}"
    )
    rows: list[dict[str, Any]] | None = None
    lost: tuple[int, int] | None = None
    big = rss = None
    flat: list[dict[str, Any]] | None = None
    print(f"load average at the start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    rllm_py = None
    try:
        if run_main:
            rllm_py = None if args.skip_rllm else install_rllm(tmp)
            rows, lost = main_phase(args, levels, tmp, procs, body, rllm_py)
        if args.big_db_gb:
            big = big_db_phase(args, tmp, procs, body)
        if args.rss_calls:
            rss = rss_phase(args, tmp, procs, body)
        if args.flat_calls:
            flat = flat_phase(args, tmp, procs)
        if run_main:
            storage(tmp, rllm_py, args.turns, procs)
    finally:
        for p in reversed(procs):
            p.stop()
        tmpdir.cleanup()
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    targets_block(rows, lost, rllm_py is not None, big, rss, flat)


def main_phase(
    args: argparse.Namespace,
    levels: list[int],
    tmp: Path,
    procs: list[Proc],
    body: bytes,
    rllm_py: Path | None,
) -> tuple[list[dict[str, Any]], tuple[int, int]]:
    null_url = start_null(procs)
    null = procs[-1]
    rw, rw_url, key = start_rollwire(tmp, null_url, "rollwire")
    procs.append(rw)
    targets: dict[str, dict[str, Any]] = {"direct": {"pid": null.pid, "sent": 0}}
    if args.compare_src:
        # Right before "rollwire" in every round: old, new, old, new ... on the same backend.
        old, old_url, _ = start_rollwire(tmp, null_url, OLD, src=args.compare_src)
        procs.append(old)
        targets[OLD] = {"pid": old.pid, "sent": 0, "rss0": rss_mb(old.pid), "url": old_url}
    targets["rollwire"] = {"pid": rw.pid, "sent": 0, "rss0": rss_mb(rw.pid)}
    for name, (_, make_body) in DIALECTS.items():
        targets[name] = {"pid": rw.pid, "sent": 0, "body": json.dumps(make_body()).encode()}
    redis_url = start_redis(procs) if not args.skip_redis else None
    if redis_url is not None:
        rr, rr_url, _ = start_rollwire(tmp, null_url, "rollwire-redis", redis_url)
        procs.append(rr)
        targets["rollwire-redis"] = {
            "pid": rr.pid,
            "sent": 0,
            "rss0": rss_mb(rr.pid),
            "url": rr_url,
        }
    if rllm_py is not None:
        rl, rl_url, _ = start_rllm(rllm_py, tmp, null_url, "rllm")
        procs.append(rl)
        targets["rllm-model-gateway"] = {
            "pid": rl.pid,
            "sent": 0,
            "rss0": rss_mb(rl.pid),
            "url": rl_url,
        }
    hdr = [{"content-type": "application/json"}]

    def urls(c: int) -> dict[str, tuple[list[str], list[dict[str, str]]]]:
        out = {
            "direct": ([null_url + "/v1/chat/completions"], hdr),
            "rollwire": (rollwire_sessions(rw_url, key, c), hdr),
        }
        if OLD in targets:
            out[OLD] = (rollwire_sessions(targets[OLD]["url"], key, c), hdr)
        for name, (route, _) in DIALECTS.items():
            out[name] = (rollwire_sessions(rw_url, key, c, "bench-" + name, route), hdr)
        if "rollwire-redis" in targets:
            out["rollwire-redis"] = (
                rollwire_sessions(targets["rollwire-redis"]["url"], key, c),
                hdr,
            )
        if "rllm-model-gateway" in targets:
            base = targets["rllm-model-gateway"]["url"]
            out["rllm-model-gateway"] = (
                [f"{base}/sessions/bench-{c}-{i}/v1/chat/completions" for i in range(c)],
                hdr,
            )
        return out

    rows = compare(targets, urls, levels, args.requests, args.rounds, body)
    # Captured vs sent.
    time.sleep(1.0)
    targets["rollwire"]["captured"] = captured_calls(rw_url, key, "bench")
    targets["rollwire"]["rss1"] = rss_mb(rw.pid)
    for name in ("rollwire-redis", OLD):
        if name in targets:
            d = targets[name]
            d["captured"] = captured_calls(d["url"], key, "bench")
            d["rss1"] = rss_mb(d["pid"])
    if "rllm-model-gateway" in targets:
        base = targets["rllm-model-gateway"]["url"]
        http_json("POST", base + "/admin/flush", {})
        sess = http_json("GET", base + "/sessions")
        targets["rllm-model-gateway"]["captured"] = sum(s.get("trace_count", 0) for s in sess)
        targets["rllm-model-gateway"]["rss1"] = rss_mb(targets["rllm-model-gateway"]["pid"])
    print()
    print_rows(rows)
    print()
    for t in ("rollwire", OLD, "rollwire-redis", "rllm-model-gateway"):
        if t in targets:
            d = targets[t]
            print(
                f"{t}: captured {d['captured']} of {d['sent']} sent; RSS "
                f"{d['rss0']:.0f} MB -> {d['rss1']:.0f} MB"
            )
    return rows, (targets["rollwire"]["captured"], targets["rollwire"]["sent"])


def storage(tmp: Path, rllm_py: Path | None, turns: int, procs: list[Proc]) -> None:
    """One session of ``turns`` turns, ~200 new tokens a turn, through each gateway."""
    eport = free_port()
    echo = Proc(
        "echo",
        [sys.executable, "-m", "rollwire.testing.null_backend", "--port", str(eport)],
        f"http://127.0.0.1:{eport}/health",
    )
    procs.append(echo)
    echo_url = f"http://127.0.0.1:{eport}"
    rw, rw_url, key = start_rollwire(tmp, echo_url, "rollwire-storage")
    procs.append(rw)
    targets = {"rollwire": (rollwire_sessions(rw_url, key, 1)[0], tmp / "rollwire-storage.sqlite")}
    if rllm_py is not None:
        rl, rl_url, db = start_rllm(rllm_py, tmp, echo_url, "rllm-storage")
        procs.append(rl)
        targets["rllm-model-gateway"] = (f"{rl_url}/sessions/storage/v1/chat/completions", db)
    final: dict[str, Any] = {}
    for url, _ in targets.values():
        messages = [{"role": "system", "content": "You are a helpful agent. " * 8}]
        for turn in range(turns):
            messages.append({"role": "user", "content": f"turn {turn}: " + "observation " * 12})
            out = http_json("POST", url, {"model": "p", "messages": messages})
            messages.append(
                {"role": "assistant", "content": out["choices"][0]["message"]["content"]}
            )
            final = out
        final["request_bytes"] = len(json.dumps({"model": "p", "messages": messages[:-1]}))
    if "rllm-model-gateway" in targets:
        http_json("POST", rl_url + "/admin/flush", {})
    time.sleep(1.5)
    for p in procs[-len(targets) :]:
        p.stop()  # checkpoint WAL / flush before measuring files
    ctx = final["usage"]["prompt_tokens"] + final["usage"]["completion_tokens"]
    print(
        f"\nstorage: one {turns}-turn session, final context {ctx} tokens "
        f"(~{ctx // turns} per turn), final request {final['request_bytes']} B; "
        f"lower bound ctx*4 B = {ctx * 4} B"
    )
    for name, (_, db) in targets.items():
        size = sum(p.stat().st_size for p in db.parent.glob(db.name + "*"))
        conn = sqlite3.connect(db)
        if name == "rollwire":
            payload = (
                conn.execute(
                    "SELECT SUM(length(new_prompt)+length(completion)+length(logprobs)"
                    "+COALESCE(length(experts),0)+COALESCE(length(new_messages),0)+length(meta))"
                    " FROM calls"
                ).fetchone()[0]
                + conn.execute("SELECT COALESCE(SUM(length(data)),0) FROM blobs").fetchone()[0]
            )
        else:
            payload = conn.execute("SELECT SUM(length(data)) FROM traces").fetchone()[0]
        conn.close()
        print(
            f"  {name:<20} payload {payload:>10,} B   file {size:>10,} B   "
            f"({payload / (ctx * 4):.1f}x ctx*4)"
        )


if __name__ == "__main__":
    main()
