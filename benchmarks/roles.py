"""One policy per role learns: the relay task (``rollwire.envs.relay``) trained with
``--roles planner,executor`` on the embedded engine, then each role's own held-out measure
before RL (the warmed-up model, whose zero-initialised adapters change nothing) and after (each
role's final adapter pushed as ``<role>@final``), with 95 % Wilson intervals.

    .venv-trl/bin/python benchmarks/roles.py --out /tmp/rollwire-roles [--steps 40] [--seed 0]

The planner's measure is ``note_correct`` (its note names the secret); the executor's is
``action_follows_note`` over the held-out rollouts whose note named a digit (it acts on the note
it was given, right or wrong); ``solved`` (both right) is the reward.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import orjson

ROLES = ["planner", "executor"]
AGENT = "rollwire.envs.relay.agent_openai:app"


def _train(args: argparse.Namespace) -> Path:
    from rollwire.envs.relay import make_tasks, warmup_conversations
    from rollwire.trainer.loop import RunSpec, run
    from rollwire_trl.policy_trainer import TrlTrainer

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sft = out / "sft.jsonl"
    conversations = warmup_conversations(
        args.warmup_steps * 32, teacher_accuracy=args.teacher_accuracy, seed=args.seed
    )
    sft.write_bytes(b"".join(orjson.dumps(c) + b"\n" for c in conversations))
    spec = RunSpec(
        out=out / "run", agent=AGENT, sft=sft, warmup_steps=args.warmup_steps,
        tasks=make_tasks(args.steps * 4, "train", args.seed), eval_tasks=make_tasks(8, "heldout", 99),
        steps=args.steps, lora_rank=8, roles=ROLES, learning_rate=args.lr, seed=args.seed,
        eval_every=0, eval_size=8, eval_k=1, save_every=args.steps, progress=False,
        options={"threads": 1},
    )  # fmt: skip
    trainer: Any = TrlTrainer(spec)
    run(spec, trainer)
    return out / "run"


def _line(name: str, counts: tuple[int, int]) -> str:
    from rollwire.evaluation.estimators import wilson_interval

    hits, n = counts
    e = wilson_interval(hits, n)
    return f"{name:<22} {e.value:.3f} [{e.low:.3f}, {e.high:.3f}] of {n}"


def main() -> None:
    """Train, measure before and after, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup-steps", type=int, default=150)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--teacher-accuracy", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--heldout", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    args = parser.parse_args()
    from rollwire.envs.relay import MEASURES, make_tasks, measure_roles

    t0 = time.perf_counter()
    run_dir = _train(args)
    train_s = time.perf_counter() - t0
    held = make_tasks(args.heldout, "heldout", args.seed + 1)
    adapters = {role: run_dir / "final" / role for role in ROLES}
    before = measure_roles(run_dir / "warmup", held, args.k)
    after = measure_roles(run_dir / "warmup", held, args.k, adapters)
    steps = [orjson.loads(x) for x in (run_dir / "steps.jsonl").read_bytes().splitlines()]
    loss = {r: statistics.fmean(s["roles"][r].get("loss", 0.0) for s in steps) for r in ROLES}
    print(f"relay, --roles planner,executor, {args.steps} steps, seed {args.seed}, "
          f"train {train_s:.0f} s; mean loss per role {loss}")  # fmt: skip
    for label, counts in (("before RL", before), ("after RL", after)):
        print(f"{label}:")
        for name in MEASURES:
            print("  " + _line(name, counts[name]))


if __name__ == "__main__":
    main()
