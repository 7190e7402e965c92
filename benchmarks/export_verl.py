"""Export to a padded verl DataProto: 1,024 rollouts x 40 calls, ~8k-token final context each.

Run in the verl venv (torch + verl are kept out of the uv workspace):
``bash packages/adapter-verl/ci/setup-venv.sh && .venv-verl/bin/python benchmarks/export_verl.py
[--rollouts 1024] [--calls 40] [--context 8192] [--runs 3]``.
Timed: ``rollwire_verl.to_dataproto`` (trajectory building + padded layout + tensors), median of
``--runs``. Target on a 2-core machine: <= 2 s for the default size.

Each synthetic rollout owns one token array and one log-prob array; every call's prompt and
completion are views into them (no per-call copies), so building the input costs little memory.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from rollwire.data.protocol import Group, ModelCall, Rollout
from rollwire_verl import to_dataproto
from rollwire_verl.layout import build_layout_rows


def _rollout(rid: int, calls: int, context: int, rng: np.random.Generator, group: str) -> Rollout:
    prompt0 = context // 16
    per_turn = (context - prompt0) // calls
    sampled = max(per_turn * 3 // 4, 1)  # the rest of a turn is tool output / template tokens
    full = rng.integers(0, 150_000, size=context, dtype=np.int32)
    logprobs = -rng.random(context, dtype=np.float32)
    out: list[ModelCall] = []
    pos = prompt0
    for i in range(calls):
        out.append(
            ModelCall(
                call_id=f"r{rid}-c{i}",
                session_id=f"r{rid}",
                index=i,
                prompt_ids=full[:pos],
                completion_ids=full[pos : pos + sampled],
                logprobs=logprobs[pos : pos + sampled],
            )
        )
        pos += per_turn
    return Rollout(
        rollout_id=f"r{rid}",
        group_id=group,
        task_id=group,
        status="completed",
        reward=float(rid % 2),
        metrics={"acc": float(rid % 2)},
        calls=out,
    )


def build_batch(rollouts: int, calls: int, context: int, group_size: int = 8) -> list[Group]:
    """``rollouts`` synthetic rollouts in groups of ``group_size``."""
    rng = np.random.default_rng(0)
    groups: list[Group] = []
    for g in range(0, rollouts, group_size):
        gid = f"g{g // group_size}"
        members = [
            _rollout(g + k, calls, context, rng, gid) for k in range(min(group_size, rollouts - g))
        ]
        groups.append(Group(group_id=gid, task_id=gid, rollouts=members))
    return groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=1024)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    t0 = time.perf_counter()
    import torch  # noqa: F401 - imported once up front: not part of the export cost
    import verl  # noqa: F401

    print(f"imported torch + verl in {time.perf_counter() - t0:.1f} s (not timed below)")
    t0 = time.perf_counter()
    batch = build_batch(args.rollouts, args.calls, args.context)
    print(
        f"built {args.rollouts} rollouts x {args.calls} calls in {time.perf_counter() - t0:.1f} s"
    )
    times: list[float] = []
    tokens = 0
    shape: tuple[int, ...] = ()
    for _ in range(args.runs):
        t = time.perf_counter()
        data = to_dataproto(batch, pad_token_id=0)
        times.append(time.perf_counter() - t)
        tokens = int(data.batch["attention_mask"].sum())
        shape = tuple(data.batch["input_ids"].shape)
        del data
    build: list[float] = []
    for _ in range(args.runs):
        t = time.perf_counter()
        build_layout_rows(batch)
        build.append(time.perf_counter() - t)
    med = statistics.median(times)
    print(f"to_dataproto: input_ids {shape}, {tokens:,} tokens")
    print(f"  runs: {', '.join(f'{t:.3f}' for t in times)} s")
    print(f"  median {med:.3f} s, {tokens / med / 1e6:.1f} M tokens/s (target <= 2 s)")
    print(
        f"  of which trajectory building (rollwire core): median {statistics.median(build):.3f} s"
    )


if __name__ == "__main__":
    main()
