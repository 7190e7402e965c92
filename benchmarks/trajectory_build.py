"""Merge-mode trajectory building: 1,024 rollouts x 40 calls, contexts growing to ~8k tokens.

Each rollout's calls are views into one token array (prompt k = everything before completion k),
so the input costs ~33 MB and the measurement is the builder, not the data generator.
Prints rows/s, tokens/s and the median wall time of a few runs. Target: < 1 s on 2 cores.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from rollwire.data.protocol import ModelCall, Rollout
from rollwire.data.trajectory import TrajectoryBuilder


def make_rollouts(
    n: int, calls: int, first_prompt: int, ctx: int, completion: int
) -> list[Rollout]:
    rng = np.random.default_rng(0)
    per = first_prompt + calls * (ctx + completion)
    out: list[Rollout] = []
    for r in range(n):
        stream = rng.integers(0, 32_000, per, dtype=np.int32)
        lps = -rng.random(per, dtype=np.float32)
        cs: list[ModelCall] = []
        pos = first_prompt
        for k in range(calls):
            if k:
                pos += ctx
            cs.append(
                ModelCall.model_construct(
                    call_id=f"{r}-{k}",
                    session_id=str(r),
                    index=k,
                    prompt_ids=stream[:pos],
                    completion_ids=stream[pos : pos + completion],
                    logprobs=lps[pos : pos + completion],
                    routed_experts=None,
                    status="ok",
                    trainable=True,
                    off_policy=False,
                    finish_reason="stop",
                    policy_version=None,
                )
            )
            pos += completion
        out.append(
            Rollout(
                rollout_id=str(r), group_id=str(r // 8), status="completed", reward=1.0, calls=cs
            )
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rollouts", type=int, default=1024)
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    # 400 + 40 * (150 + 50) = 8,400 tokens at the end of each rollout
    batch = make_rollouts(args.rollouts, args.calls, first_prompt=400, ctx=150, completion=50)
    builder = TrajectoryBuilder("merge")
    times: list[float] = []
    rows = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        rows = [row for r in batch for row in builder.build(r)]
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    tokens = sum(int(r.input_ids.shape[0]) for r in rows)
    trained = sum(int(r.loss_mask.sum()) for r in rows)
    print(f"trajectory_build (merge): {args.rollouts} rollouts x {args.calls} calls")
    print(
        f"  rows {len(rows)}, tokens {tokens:,} (trainable {trained:,}), "
        f"{tokens // len(rows):,} tokens/row"
    )
    print(f"  runs: {', '.join(f'{t:.3f}s' for t in times)}; median {med:.3f}s")
    print(f"  {len(rows) / med:,.0f} rows/s, {tokens / med / 1e6:,.1f} M tokens/s")
    print(f"  target < 1 s: {'met' if med < 1.0 else 'NOT met'}")


if __name__ == "__main__":
    main()
