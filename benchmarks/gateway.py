"""Gateway overhead benchmark: direct vs rollwire gateway vs rllm-model-gateway, on 127.0.0.1.

    uv run --frozen python benchmarks/gateway.py --requests 2000          # quick (< 2 min)
    uv run --frozen python benchmarks/gateway.py --requests 10000 --skip-rllm

Every server runs in its own process: a null backend answering instantly with a fixed vLLM-shaped
body (~512 prompt ids, 64 completion ids with log-probs), the rollwire gateway (SQLite capture) and
rllm-model-gateway 0.1.0 (installed into a temporary venv; skipped with a reason if that fails).
The load generator (aiohttp) runs in its own process too, alternating targets round by round.
Reported: requests/s, p50/p99 latency and the latency added over the direct path, server CPU per
call (from /proc/<pid>/stat), calls captured vs sent, gateway RSS, and the storage cost of one
40-turn session whose context grows ~200 tokens a turn.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TICKS = os.sysconf("SC_CLK_TCK")


# ----------------------------------------------------------------------------- helpers
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status < 500:
                    return
        except Exception:
            time.sleep(0.1)
    raise TimeoutError(f"{url} did not come up within {timeout}s")


def http_json(method: str, url: str, body: Any = None, key: str | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("content-type", "application/json")
    if key:
        req.add_header("authorization", f"Bearer {key}")
    with urllib.request.urlopen(req, timeout=60) as r:
        raw = r.read()
    return json.loads(raw) if raw else None


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Proc:
    """A server subprocess, always terminated."""

    def __init__(self, name: str, argv: list[str], health: str, env: dict[str, str] | None = None):
        self.name = name
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 (lives as long as the process)
            prefix=f"bench-{name}-", suffix=".log", delete=False
        )
        self.p = subprocess.Popen(
            argv, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
        try:
            wait_http(health)
        except TimeoutError as exc:
            self.stop()
            raise RuntimeError(
                f"{name} failed to start; log: {Path(self.log.name).read_text()[-2000:]}"
            ) from exc

    @property
    def pid(self) -> int:
        return self.p.pid

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


def request_body() -> dict[str, Any]:
    """~8 KB, 20 messages."""
    messages = [{"role": "system", "content": "You are a careful assistant. " * 12}]
    for i in range(19):
        role = "user" if i % 2 == 0 else "assistant"
        messages.append({"role": role, "content": f"message {i}: " + "lorem ipsum dolor sit " * 17})
    return {"model": "policy", "messages": messages, "temperature": 1.0, "max_tokens": 64}


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
    return {"lat": lat, "wall": wall, "errors": errors, "sent": n + concurrency}


def loadgen_main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
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
def start_rollwire(tmp: Path, backend_url: str, name: str) -> tuple[Proc, str, str]:
    port, key = free_port(), "bench-admin-key"
    proc = Proc(
        name,
        [
            sys.executable,
            "-m",
            "rollwire.gateway.cli",
            "--port",
            str(port),
            "--backend",
            f"{backend_url}=vllm",
            "--store",
            f"sqlite:{tmp / (name + '.sqlite')}",
            "--admin-key",
            key,
        ],
        f"http://127.0.0.1:{port}/health",
    )
    return proc, f"http://127.0.0.1:{port}", key


def rollwire_sessions(url: str, key: str, k: int) -> list[str]:
    return [
        http_json("POST", url + "/api/sessions", {"group_id": "bench"}, key)["base_url"]
        + "/chat/completions"
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


# ----------------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--requests", type=int, default=2000, help="requests per target and level")
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--rounds", type=int, default=4, help="alternating rounds per level")
    ap.add_argument("--skip-rllm", action="store_true")
    ap.add_argument("--turns", type=int, default=40)
    ap.add_argument("--loadgen", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.loadgen:
        loadgen_main(args.loadgen)
        return
    levels = [int(x) for x in args.concurrency.split(",")]
    tmpdir = tempfile.TemporaryDirectory(prefix="rollwire-bench-")
    tmp = Path(tmpdir.name)
    procs: list[Proc] = []
    try:
        rllm_py = None if args.skip_rllm else install_rllm(tmp)
        nport = free_port()
        null = Proc(
            "null",
            [
                sys.executable,
                "-m",
                "rollwire.gateway.null_backend",
                "--fixed",
                "--port",
                str(nport),
            ],
            f"http://127.0.0.1:{nport}/health",
        )
        procs.append(null)
        null_url = f"http://127.0.0.1:{nport}"
        rw, rw_url, key = start_rollwire(tmp, null_url, "rollwire")
        procs.append(rw)
        targets: dict[str, dict[str, Any]] = {
            "direct": {"pid": null.pid, "sent": 0},
            "rollwire": {"pid": rw.pid, "sent": 0, "rss0": rss_mb(rw.pid)},
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
        body = json.dumps(request_body()).encode()
        print(
            f"request body: {len(body)} bytes, {len(request_body()['messages'])} messages; "
            f"{args.requests} requests per target per level; cpus={os.cpu_count()}"
        )
        rows = []
        for c in levels:
            stats: dict[str, dict[str, Any]] = {
                t: {"lat": [], "wall": 0.0, "cpu": 0.0, "n": 0, "errors": 0} for t in targets
            }
            urls: dict[str, tuple[list[str], list[dict[str, str]]]] = {
                "direct": (
                    [null_url + "/v1/chat/completions"],
                    [{"content-type": "application/json"}],
                ),
                "rollwire": (
                    rollwire_sessions(rw_url, key, c),
                    [{"content-type": "application/json"}],
                ),
            }
            if "rllm-model-gateway" in targets:
                base = targets["rllm-model-gateway"]["url"]
                urls["rllm-model-gateway"] = (
                    [f"{base}/sessions/bench-{c}-{i}/v1/chat/completions" for i in range(c)],
                    [{"content-type": "application/json"}],
                )
            per_round = max(1, args.requests // args.rounds)
            for _ in range(args.rounds):
                for t in targets:
                    pid = targets[t]["pid"]
                    cpu0 = cpu_seconds(pid)
                    res = run_load(urls[t][0], urls[t][1], body, per_round, c)
                    st = stats[t]
                    st["cpu"] += cpu_seconds(pid) - cpu0
                    st["lat"] += res["lat"]
                    st["wall"] += res["wall"]
                    st["n"] += len(res["lat"])
                    st["errors"] += res["errors"]
                    targets[t]["sent"] += res["sent"]
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
                        "cpu_us": st["cpu"] / max(1, st["n"]) * 1e6,
                        "errors": st["errors"],
                    }
                )
        # Captured vs sent.
        time.sleep(1.0)
        sessions = http_json("GET", rw_url + "/api/sessions?group_id=bench", key=key)["sessions"]
        targets["rollwire"]["captured"] = sum(s["num_calls"] for s in sessions)
        targets["rollwire"]["rss1"] = rss_mb(rw.pid)
        if "rllm-model-gateway" in targets:
            base = targets["rllm-model-gateway"]["url"]
            http_json("POST", base + "/admin/flush", {})
            sess = http_json("GET", base + "/sessions")
            targets["rllm-model-gateway"]["captured"] = sum(s.get("trace_count", 0) for s in sess)
            targets["rllm-model-gateway"]["rss1"] = rss_mb(targets["rllm-model-gateway"]["pid"])

        print()
        print(
            f"{'target':<20}{'conc':>5}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}"
            f"{'+p50 ms':>9}{'+p99 ms':>9}{'CPU us/call':>13}{'errors':>8}"
        )
        for r in rows:
            print(
                f"{r['target']:<20}{r['c']:>5}{r['rps']:>9.0f}{r['p50_ms']:>9.3f}{r['p99_ms']:>9.3f}"
                f"{r['added_p50_ms']:>9.3f}{r['added_p99_ms']:>9.3f}{r['cpu_us']:>13.0f}"
                f"{r['errors']:>8}"
            )
        print()
        for t in ("rollwire", "rllm-model-gateway"):
            if t in targets:
                d = targets[t]
                print(
                    f"{t}: captured {d['captured']} of {d['sent']} sent; RSS "
                    f"{d['rss0']:.0f} MB -> {d['rss1']:.0f} MB"
                )
        storage(tmp, rllm_py, args.turns, procs)
    finally:
        for p in reversed(procs):
            p.stop()
        tmpdir.cleanup()


def storage(tmp: Path, rllm_py: Path | None, turns: int, procs: list[Proc]) -> None:
    """One session of ``turns`` turns, ~200 new tokens a turn, through each gateway."""
    eport = free_port()
    echo = Proc(
        "echo",
        [sys.executable, "-m", "rollwire.gateway.null_backend", "--port", str(eport)],
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
