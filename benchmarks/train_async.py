"""``rollwire train`` synchronous beside ``--async``, same seeds: time per step and held-out reward
at equal steps, and the staleness each async step really had (from the recorded versions).

Each run is ``rollwire train`` in the TRL venv on the lockbox task. With ``--engine process`` (the
default) the embedded engine runs as its own ``rollwire engine`` process behind ``--backend``, as
a vLLM server would, so rollouts and training can overlap on different cores; ``--engine
thread`` keeps it inside the trainer's process (the quick start's setup).

    bash packages/adapter-trl/ci/setup-venv.sh
    .venv-trl/bin/python benchmarks/train_async.py --seeds 0 1 --steps 12
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _procs import free_port, wait_http

ROLLWIRE = str(Path(sys.executable).with_name("rollwire"))


@contextlib.contextmanager
def _engine(kind: str, seed: int) -> Iterator[list[str]]:
    if kind == "thread":
        yield []
        return
    port = free_port()
    proc = subprocess.Popen(
        [ROLLWIRE, "engine", "--port", str(port), "--seed", str(seed)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=120)
        yield ["--backend", f"http://127.0.0.1:{port}"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _run(out: Path, seed: int, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    with _engine(args.engine, seed) as backend:
        cmd = [
            ROLLWIRE, "train", "--out", str(out), "--seed", str(seed), "--steps", str(args.steps),
            "--eval-size", str(args.eval_size), "--eval-k", "4", "--eval-every", "0",
            "--save-every", str(args.steps), "--threads", "1", "--no-progress", *backend,
        ]  # fmt: skip
        if mode == "async":
            cmd += ["--async", "--max-staleness", str(args.max_staleness)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ})
    if proc.returncode != 0:
        raise SystemExit(f"{mode} seed {seed} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    lags = [(s["step"] - 1) - min(int(v) for v in s["policy_versions"]) for s in steps]
    return {
        "mode": mode,
        "seed": seed,
        "step_s": statistics.median(s["wall_s"] for s in steps),
        "wait_s": statistics.median(s["rollout_wait_s"] for s in steps),
        "rollout_s": statistics.median(s["rollout_s"] for s in steps),
        "train_s": statistics.median(s["train_s"] for s in steps),
        "sync_s": statistics.median(s["sync_s"] for s in steps),
        "steps_s": sum(s["wall_s"] for s in steps),
        "before": summary["baseline"],
        "after": summary["final"],
        "max_lag": max(lags),
        "lag_hist": {str(k): lags.count(k) for k in sorted(set(lags))},
    }


def _fmt(e: dict[str, Any]) -> str:
    return f"{e['pass_at_1']:.3f} [{e['pass_at_1_low']:.3f}, {e['pass_at_1_high']:.3f}]"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--eval-size", type=int, default=32)
    p.add_argument("--max-staleness", type=int, default=1)
    p.add_argument("--engine", choices=("process", "thread"), default="process")
    p.add_argument("--json", type=Path, help="Also write every run's figures here.")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:  # interleaved: both modes see the same load
            for mode in ("sync", "async"):
                rows.append(_run(Path(tmp) / f"{mode}-{seed}", seed, mode, args))
                r = rows[-1]
                print(
                    f"[{mode} seed {seed}] step {r['step_s']:.2f}s  {_fmt(r['after'])}", flush=True
                )
    print(f"\nengine: {args.engine}; {args.steps} steps; held-out: {args.eval_size} tasks x 4")
    head = "mode   seed  step s  wait s  rollout s  train s  sync s  steps total s  max lag  held-out pass@1 before -> after"
    print(head)
    for r in rows:
        print(
            f"{r['mode']:<6} {r['seed']:>4}  {r['step_s']:6.2f}  {r['wait_s']:6.2f}  "
            f"{r['rollout_s']:9.2f}  {r['train_s']:7.2f}  {r['sync_s']:6.2f}  {r['steps_s']:13.1f}  "
            f"{r['max_lag']:>7}  {_fmt(r['before'])} -> {_fmt(r['after'])}"
        )
    for seed in args.seeds:
        s, a = (
            next(r for r in rows if r["mode"] == m and r["seed"] == seed) for m in ("sync", "async")
        )
        print(
            f"seed {seed}: async/sync time per step {a['step_s'] / s['step_s']:.2f}x, "
            f"held-out pass@1 after {a['after']['pass_at_1']:.3f} vs {s['after']['pass_at_1']:.3f}; "
            f"async lag per step {a['lag_hist']}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
