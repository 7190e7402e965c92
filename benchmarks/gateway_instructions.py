"""Instructions per call of the rollwire gateway (valgrind's callgrind), beside another checkout's.

On a shared two-core machine the CPU time per call of ``benchmarks/gateway.py`` moves ±10-25 %
from round to round, more than most single changes win or lose. The instructions the gateway
process executes for the same traffic move by well under 1 % between runs, so this script is the
A/B for a change to the hot path; ``gateway.py`` stays the measure of time (callgrind counts user
space only: the kernel's share of a loopback call, ~a third of its CPU, is not in these numbers).

Each target is a fresh gateway on SQLite under ``valgrind --tool=callgrind --instr-atstart=no``
in front of the fixed null backend (the same process and traffic as ``gateway.py``); after a
warm-up, counting is switched on for ``--requests`` calls at each concurrency, then dumped.

    apt-get install -y valgrind
    git worktree add --detach /tmp/old f11dfb8
    uv run --frozen python benchmarks/gateway_instructions.py \
        --compare-src /tmp/old/packages/core/src
"""

from __future__ import annotations

import argparse
import glob
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import gateway as bench  # the benchmark's own helpers: null backend, sessions, load
from _procs import Proc, free_port


def instructions_per_call(
    tmp: Path, null_url: str, src: str | None, concurrency: int, n: int, warmup: int
) -> float:
    """Instructions per call of a fresh gateway (``src``'s tree, else this one) under callgrind."""
    port, key = free_port(), "bench-admin-key"
    out = tmp / f"callgrind-{port}.out"
    argv = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}",
        sys.executable,
        "-m",
        bench.gateway_module(src),
        "--port",
        str(port),
        "--backend",
        f"{null_url}=vllm",
        "--store",
        f"sqlite:{tmp / f'gw-{port}.sqlite'}",
        "--admin-key",
        key,
    ]
    url = f"http://127.0.0.1:{port}"
    env = {"PYTHONPATH": src} if src else None
    gw = Proc(f"callgrind-{port}", argv, url + "/health", env=env, timeout=600)
    try:
        urls = bench.rollwire_sessions(url, key, concurrency)
        body = json.dumps(bench.request_body()).encode()
        bench.run_load(urls, [{}], body, warmup, concurrency)
        ctl = ["callgrind_control"]
        subprocess.run([*ctl, "-i", "on", str(gw.pid)], check=True, capture_output=True)
        res = bench.run_load(urls, [{}], body, n, concurrency)
        subprocess.run([*ctl, "-d", str(gw.pid)], check=True, capture_output=True)
        if res["errors"]:
            raise RuntimeError(f"{res['errors']} calls failed")
        dumps = [f for f in glob.glob(f"{out}.*") if not f.endswith(".log")]
        if len(dumps) != 1:
            raise RuntimeError(f"expected one callgrind dump, found {dumps}")
        for line in Path(dumps[0]).read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1]) / res["sent"]
        raise RuntimeError(f"no totals in {dumps[0]}")
    finally:
        gw.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compare-src", help="another checkout's packages/core/src, as rollwire-old")
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--requests", type=int, default=1000, help="counted calls per target, level")
    ap.add_argument("--warmup", type=int, default=200)
    args = ap.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("valgrind is not installed (apt-get install -y valgrind)")
    targets: list[tuple[str, str | None]] = [("rollwire", None)]
    if args.compare_src:
        targets.insert(0, (bench.OLD, args.compare_src))
    levels = [int(c) for c in args.concurrency.split(",")]
    print(f"{args.requests} counted calls per target and level, {args.warmup} warm-up calls")
    print(f"{'target':<14} {'conc':>5} {'k instructions/call':>20} {'ratio':>7}")
    procs: list[Proc] = []
    rows: dict[tuple[str, int], float] = {}
    try:
        null_url = bench.start_null(procs)
        with tempfile.TemporaryDirectory(prefix="rollwire-callgrind-") as tmpname:
            for c in levels:
                for name, src in targets:
                    ir = instructions_per_call(
                        Path(tmpname), null_url, src, c, args.requests, args.warmup
                    )
                    rows[name, c] = ir
                    old = rows.get((bench.OLD, c))
                    ratio = f"{ir / old:.3f}x" if old and name != bench.OLD else ""
                    print(f"{name:<14} {c:>5} {ir / 1e3:>20,.1f} {ratio:>7}", flush=True)
    finally:
        for p in reversed(procs):
            p.stop()


if __name__ == "__main__":
    main()
