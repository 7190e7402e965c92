"""Every trainer on the same task, seeds and steps through ``rollwire train``: one table.

Each run is ``rollwire train --task lockbox --trainer T --seed S --steps N`` with the same shared
options for every trainer, in that trainer's own venv (``.venv-trl``, ``.venv-verl``,
``.venv-tinker``; rLLM in ``.venv-tinker`` with its checkout and deps on ``PYTHONPATH`` and a
SkyRL server this script starts, as ``--trainer rllm`` trains on a running Tinker service). A
trainer whose venv, plugin or checkout is missing is listed as skipped with the reason. The table
holds only what the runs wrote (``summary.json``, ``steps.jsonl``): held-out pass@1 before and
after with 95 % Wilson intervals, median time per step and its split, the median per step of
the mean |trainer - captured| log-prob over trained tokens (``logp_diff_mean``: the trainer's
log-probs before its update against those the server sampled with), and the verified syncs.

    uv run --frozen python benchmarks/trainers.py --trainers trl,verl,tinker,rllm --seeds 0,1 \\
        --steps 20 --rllm-src /tmp/rllm-src --rllm-deps /tmp/rllm-deps --out /tmp/rw-trainers

``--reuse`` reads finished runs in ``--out`` instead of running them again; ``--lr T=LR``
overrides one trainer's rate (the table says so in its ``lr`` column).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
VENVS = {"trl": ".venv-trl", "verl": ".venv-verl", "tinker": ".venv-tinker", "rllm": ".venv-tinker"}
SETUP = {
    "trl": "bash packages/adapter-trl/ci/setup-venv.sh",
    "verl": "bash packages/adapter-verl/ci/setup-venv.sh",
    "tinker": "bash packages/adapter-tinker/ci/setup-venv.sh",
    "rllm": "bash packages/adapter-tinker/ci/setup-venv.sh",
}
#: SkyRL's server for ``--trainer rllm``, started in the Tinker venv on the seed's dense model
#: (what ``--trainer tinker`` starts for itself); prints one JSON line, stops when stdin closes
SKYRL = """
import json, sys
from pathlib import Path
from rollwire_tinker.service import tinker_service
with tinker_service(Path(sys.argv[1]), base_url=None, base_model=None, model=None,
                    seed=int(sys.argv[2]), lora_rank=8, max_batch=32) as s:
    print(json.dumps({"url": s.base_url, "model": s.base_model, "tokenizer": s.tokenizer}),
          flush=True)
    sys.stdin.read()
"""


@dataclass
class Run:
    """One trainer and seed: where it ran, how, and what it wrote (or why it did not)."""

    trainer: str
    seed: int
    out: Path
    lr: str = "default"
    skipped: str = ""
    failed: str = ""
    wall_s: float = 0.0
    summary: dict[str, Any] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)


def _python(trainer: str) -> Path:
    return ROOT / VENVS[trainer] / "bin" / "python"


def _missing(trainer: str, args: argparse.Namespace) -> str:
    """Why ``trainer`` cannot run here ("" when it can)."""
    python = _python(trainer)
    if not python.exists():
        return f"no {VENVS[trainer]} ({SETUP[trainer]})"
    if trainer == "rllm" and (args.rllm_src is None or not (args.rllm_src / "rllm").is_dir()):
        return f"no rLLM checkout at --rllm-src {args.rllm_src}"
    check = (
        "import importlib.metadata as m, sys; "
        f"sys.exit(0 if {trainer!r} in {{e.name for e in m.entry_points(group='rollwire.trainers')}}"
        " else 1)"
    )
    if subprocess.run([str(python), "-c", check], check=False).returncode:
        pkg = f"packages/adapter-{trainer}"
        return f"no {trainer} trainer plugin in {VENVS[trainer]} (pip install --no-deps -e {pkg})"
    if trainer == "rllm":  # the plugin checks rLLM's installed metadata, not just its import
        has = "import importlib.metadata as m; m.version('rllm')"
        env = _env(trainer, args)
        if subprocess.run([str(python), "-c", has], env=env, capture_output=True).returncode:
            return (
                "rLLM is not installed where the plugin looks (its metadata): pip install "
                "--no-deps --target DEPS RLLM_SRC, and --rllm-deps DEPS"
            )
    return ""


def _env(trainer: str, args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if trainer in ("tinker", "rllm"):
        env.setdefault("JAX_PLATFORMS", "cpu")
        env.setdefault("JAX_COMPILATION_CACHE_DIR", str(Path.home() / ".cache/rollwire/jax"))
    if trainer == "rllm":
        paths = [str(args.rllm_src.resolve())]
        if args.rllm_deps is not None:
            paths.append(str(args.rllm_deps.resolve()))
        env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _shared(run: Run, args: argparse.Namespace) -> list[str]:
    """The options every trainer gets alike (plus its ``--lr`` when overridden)."""
    cmd = [
        "--task", "lockbox", "--trainer", run.trainer, "--seed", str(run.seed),
        "--steps", str(args.steps), "--eval-size", str(args.eval_size),
        "--eval-k", str(args.eval_k), "--eval-every", "0", "--save-every", str(args.steps),
        "--out", str(run.out), "--no-progress",
        # the task's teacher warm-up, which the embedded model gets anyway; said explicitly
        # because --trainer rllm trains on a service's model and warms up only when asked
        "--sft", "teacher",
    ]  # fmt: skip
    if run.lr != "default":
        cmd += ["--lr", run.lr]
    return cmd


def _train(run: Run, args: argparse.Namespace) -> None:
    """``rollwire train`` for ``run`` (its SkyRL server first, for rLLM); log in ``OUT.log``."""
    env = _env(run.trainer, args)
    python = str(_python(run.trainer))
    cmd = [
        python,
        "-c",
        "import sys; from rollwire.cli import main; sys.exit(main())",
        "train",
        *_shared(run, args),
    ]
    log = run.out.with_suffix(".log")
    server = None
    t0 = time.perf_counter()
    with log.open("w") as f:
        try:
            if run.trainer == "rllm":
                service = run.out.with_name(run.out.name + "-service")
                server = subprocess.Popen(
                    [python, "-c", SKYRL, str(service), str(run.seed)],
                    env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=f, text=True,
                )  # fmt: skip
                assert server.stdout is not None
                line = server.stdout.readline()
                if not line:
                    run.failed = f"SkyRL's server did not start (see {log})"
                    return
                info = json.loads(line)
                cmd += ["--base-url", info["url"], "--base-model", info["model"]]
                cmd += ["--tokenizer", info["tokenizer"]]
            f.write("$ " + shlex.join(cmd) + "\n")
            f.flush()
            code = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
        finally:
            if server is not None:
                assert server.stdin is not None
                server.stdin.close()
                try:
                    server.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait()
    run.wall_s = time.perf_counter() - t0
    run.out.mkdir(parents=True, exist_ok=True)
    (run.out / "bench.json").write_text(
        json.dumps({"command": cmd, "wall_s": run.wall_s, "exit": code})
    )
    if code:
        last = [ln for ln in log.read_text().splitlines() if ln.strip()][-1:] or ["(no output)"]
        run.failed = f"exit {code}: {last[0].strip()[:160]} (log: {log})"


def _read(run: Run) -> None:
    summary, steps = run.out / "summary.json", run.out / "steps.jsonl"
    bench = run.out / "bench.json"
    if bench.exists():
        run.wall_s = float(json.loads(bench.read_text())["wall_s"])
    if steps.exists():
        run.steps = [json.loads(ln) for ln in steps.read_text().splitlines() if ln.strip()]
    if summary.exists():
        run.summary = json.loads(summary.read_text())
    elif not run.failed:
        run.failed = f"no summary.json in {run.out}"


def _point(p: dict[str, Any]) -> str:
    return f"{p['pass_at_1']:.3f} [{p['pass_at_1_low']:.3f}, {p['pass_at_1_high']:.3f}]"


def _median(steps: list[dict[str, Any]], key: str, sub: str | None = None) -> float:
    values = [
        float((s.get(sub) or {}).get(key, "nan") if sub else s[key])
        for s in steps
        if (key in (s.get(sub) or {}) if sub else key in s)
    ]
    return statistics.median(values) if values else float("nan")


def _row(run: Run) -> str:
    head = f"| {run.trainer} | {run.seed} | {run.lr} |"
    if run.skipped:
        return f"{head} skipped: {run.skipped} | | | | |"
    if run.failed and not run.steps:
        return f"{head} failed: {run.failed} | | | | |"
    s = run.summary
    evals = f"{_point(s['baseline'])} → {_point(s['final'])}" if s else "no final evaluation"
    if run.failed:
        evals += f" (failed after {len(run.steps)} steps: {run.failed})"
    st = run.steps
    split = (
        f"{_median(st, 'wall_s'):.2f} ({_median(st, 'rollout_s'):.2f} / "
        f"{_median(st, 'train_s'):.2f} / {_median(st, 'sync_s'):.2f})"
    )
    diffs = [float(x["trainer"]["logp_diff_max"]) for x in st if "logp_diff_max" in x["trainer"]]
    mismatch = f"{_median(st, 'logp_diff_mean', 'trainer'):.1e}"
    mismatch += f" ({max(diffs):.1e})" if diffs else ""
    verified = sum(
        1
        for x in st
        if x["sync"].get("sync/servers_failed", 1) == 0 and x["sync"].get("sync/servers_verified")
    )
    attempts = s["final"]["attempts"] if s else 0
    wall = s.get("wall_s", run.wall_s) if s else run.wall_s
    return (
        f"{head} {evals} | {attempts} | {split} | {mismatch} | {verified}/{len(st)} | {wall:.0f} |"
    )


def table(runs: list[Run]) -> str:
    """The markdown table of ``runs``, in order."""
    lines = [
        "| trainer | seed | lr | held-out pass@1 before → after | attempts | "
        "step s: median (rollout / train / sync) | \\|Δ log-prob\\| per step: median (max) | "
        "syncs verified | run s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    return "\n".join(lines + [_row(r) for r in runs])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trainers", default="trl,verl,tinker,rllm")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--eval-size", type=int, default=32, help="held-out tasks")
    ap.add_argument("--eval-k", type=int, default=4, help="attempts per held-out task")
    ap.add_argument("--lr", action="append", default=[], metavar="T=LR",
                    help="one trainer's learning rate (default: rollwire train's)")  # fmt: skip
    ap.add_argument("--rllm-src", type=Path, default=None, help="an rLLM checkout")
    ap.add_argument("--rllm-deps", type=Path, default=None,
                    help="a folder with rLLM's imports the Tinker venv lacks")  # fmt: skip
    ap.add_argument("--out", type=Path, default=Path("/tmp/rollwire-trainers"))
    ap.add_argument("--reuse", action="store_true", help="read finished runs, rerun none")
    args = ap.parse_args()
    trainers = [t for t in args.trainers.split(",") if t]
    unknown = sorted(set(trainers) - set(VENVS))
    if unknown:
        ap.error(f"unknown trainer(s) {', '.join(unknown)}: choose from {', '.join(VENVS)}")
    rates = dict(x.split("=", 1) for x in args.lr)
    args.out.mkdir(parents=True, exist_ok=True)
    runs: list[Run] = []
    t0 = time.perf_counter()
    missing = {t: _missing(t, args) for t in trainers}
    for seed in [int(s) for s in args.seeds.split(",")]:
        for trainer in trainers:
            lr = rates.get(trainer, "default")
            name = f"{trainer}-seed{seed}" + ("" if lr == "default" else f"-lr{lr}")
            run = Run(trainer, seed, args.out / name, lr)
            runs.append(run)
            if missing[trainer]:
                run.skipped = missing[trainer]
                continue
            if not args.reuse and not (run.out / "summary.json").exists():
                if run.out.exists():
                    sys.exit(f"{run.out} holds an unfinished run: remove it, or pass --reuse")
                print(f"[trainers] {trainer} seed {seed} → {run.out}", flush=True)
                _train(run, args)
            _read(run)
            print(f"[trainers] {trainer} seed {seed}: {run.failed or 'done'}", flush=True)
    print(f"\nwall {time.perf_counter() - t0:.0f} s\n")
    print(table(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
