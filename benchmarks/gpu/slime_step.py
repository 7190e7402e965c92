"""Helper of ``slime_step.sh``: its prompts, its agent, and the checks of slime's debug dumps.

    python benchmarks/gpu/slime_step.py prompts OUT.jsonl [--n 8]
    python benchmarks/gpu/slime_step.py check --rollout ROLLOUT.pt --train TRAIN.pt

``agent`` (``ROLLWIRE_AGENT=slime_step:agent``, with this folder on ``PYTHONPATH``) is rollwire's
mixed-batch agent: in every four rollouts a clean one (two calls merged into one row), a forked one
(two rows under one rollout id), a failed one and one that never calls the model — the batch every
trainer adapter must survive. ``check`` reads what slime wrote with ``--save-debug-rollout-data``
(the Samples rollwire's hooks returned) and ``--save-debug-train-data`` (the actor's view after
its step) and says whether they are what rollwire's contract promises.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Any


@functools.cache
def _agent() -> Any:
    from rollwire.testing.mixed_batch import MixedAgent  # needs pytest, like rollwire.testing

    return MixedAgent()


def __getattr__(name: str) -> Any:
    """``agent`` is built on first use, so ``prompts`` and ``check`` need no rollwire."""
    if name == "agent":
        return _agent()
    raise AttributeError(name)


def write_prompts(path: Path, n: int) -> None:
    """``n`` arithmetic prompts as slime's ``--prompt-data`` JSONL (``prompt``, ``label``)."""
    lines = [
        json.dumps(
            {"prompt": f"What is {i} + {i + 2}? Answer with the number.", "label": str(2 * i + 2)}
        )
        for i in range(n)
    ]
    path.write_text("\n".join(lines) + "\n")


def _load(path: Path) -> dict[str, Any]:
    import torch

    return torch.load(path, weights_only=False)  # type: ignore[no-any-return]


def check_rollout(samples: list[dict[str, Any]]) -> list[str]:
    """Problems with the samples rollwire's hooks handed slime (empty: none)."""
    problems: list[str] = []
    by_rollout: dict[Any, list[dict[str, Any]]] = {}
    for s in samples:
        meta = (s.get("metadata") or {}).get("rollwire")
        if meta is None:
            problems.append(f"sample {s.get('index')}: no metadata['rollwire']")
            continue
        n = s["response_length"]
        if len(s["loss_mask"]) != n or len(s["rollout_log_probs"]) != n:
            problems.append(f"sample {s['index']}: mask/log-prob length != response {n}")
        if s["remove_sample"] and any(s["loss_mask"]):
            problems.append(f"sample {s['index']}: removed but its mask trains tokens")
        by_rollout.setdefault(s["rollout_id"], []).append(s)
    kinds = {"forked": 0, "failed": 0, "placeholder": 0, "clean": 0}
    for rows in by_rollout.values():
        meta = rows[0]["metadata"]["rollwire"]
        if meta["placeholder"]:
            kinds["placeholder"] += 1
        elif rows[0]["remove_sample"]:
            kinds["failed"] += 1
        elif len(rows) > 1:
            kinds["forked"] += 1
        else:
            kinds["clean"] += 1
    print(f"rollout: {len(samples)} samples from {len(by_rollout)} rollouts, kinds {kinds}")
    problems += [f"no {kind} rollout in the batch" for kind, n in kinds.items() if n == 0]
    versions = {v for s in samples if not s["remove_sample"] for v in s["weight_versions"]}
    print(f"rollout: weight versions reported by SGLang {sorted(versions)}")
    return problems


def check_train(samples: list[dict[str, Any]], max_diff: float) -> list[str]:
    """Problems with the actor's train data (empty: none): removed rows train nothing, and
    Megatron's log-probs of the response tokens agree with the ones rollwire captured."""
    import torch

    problems: list[str] = []
    diffs, tokens = 0.0, 0
    for s in samples:
        mask = torch.as_tensor(s["loss_masks"], dtype=torch.float32)
        rollout = torch.as_tensor(s["rollout_log_probs"], dtype=torch.float32)
        if "log_probs" in s:
            train = torch.as_tensor(s["log_probs"], dtype=torch.float32)
            diffs += float(((train - rollout).abs() * mask).sum())
            tokens += int(mask.sum())
        if not mask.any() and float(s.get("rewards", 0.0)) != 0.0:
            problems.append(
                f"sample {s.get('sample_index')}: no trained token, reward {s['rewards']}"
            )
    if tokens == 0:
        problems.append("no trained token with Megatron log-probs in the train dump")
        return problems
    mean = diffs / tokens
    print(f"train: mean |megatron - rollout| log-prob over {tokens} trained tokens = {mean:.4f}")
    if mean > max_diff:
        problems.append(f"log-probs disagree: mean abs diff {mean:.4f} > {max_diff}")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prompts", help="write slime's --prompt-data JSONL")
    p.add_argument("out", type=Path)
    p.add_argument("--n", type=int, default=8)
    c = sub.add_parser("check", help="check slime's debug dumps of one step")
    c.add_argument("--rollout", type=Path, required=True, help="--save-debug-rollout-data file")
    c.add_argument("--train", type=Path, required=True, help="--save-debug-train-data file")
    c.add_argument(
        "--max-logprob-diff",
        type=float,
        default=0.1,
        help="largest mean |log p| gap between Megatron and SGLang (bf16: a few hundredths)",
    )
    args = ap.parse_args(argv)
    if args.command == "prompts":
        write_prompts(args.out, args.n)
        return 0
    problems = check_rollout(_load(args.rollout)["samples"])
    problems += check_train(_load(args.train)["samples"], args.max_logprob_diff)
    for problem in problems:
        print(f"FAIL: {problem}", file=sys.stderr)
    print("ok" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
