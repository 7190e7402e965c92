"""Embedded-engine throughput over HTTP: single-stream decode tokens/s and aggregate at 16 concurrent.

Run: ``uv run --frozen python benchmarks/engine.py [--tokens 256] [--runs 3] [--concurrency 16]``.
Targets on a 2-core machine: >= 300 tok/s single stream; aggregate at 16 >= 2x single.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import httpx

from rollwire.engine import EmbeddedEngine, EngineConfig

MSGS = [{"role": "user", "content": "Write a long story about a robot."}]


async def _one(client: httpx.AsyncClient, url: str, tokens: int, seed: int) -> int:
    body = {
        "messages": MSGS,
        "max_tokens": tokens,
        "ignore_eos": True,
        "seed": seed,
        "return_token_ids": True,
    }
    r = await client.post(url, json=body)
    r.raise_for_status()
    return len(r.json()["choices"][0]["token_ids"])


async def _measure(url: str, tokens: int, concurrency: int, seed: int) -> float:
    async with httpx.AsyncClient(
        timeout=300, limits=httpx.Limits(max_connections=concurrency)
    ) as client:
        await _one(client, url, 8, seed)  # warm the connection pool
        t0 = time.perf_counter()
        counts = await asyncio.gather(
            *[_one(client, url, tokens, seed + i) for i in range(concurrency)]
        )
        return sum(counts) / (time.perf_counter() - t0)


def main() -> None:
    """Print single-stream and concurrent tokens/s (medians of several runs) and their ratio."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=16)
    args = ap.parse_args()
    with EmbeddedEngine(EngineConfig()) as eng:
        url = eng.base_url + "/chat/completions"
        single = statistics.median(
            asyncio.run(_measure(url, args.tokens, 1, r)) for r in range(args.runs)
        )
        agg = statistics.median(
            asyncio.run(_measure(url, args.tokens, args.concurrency, 100 * r))
            for r in range(args.runs)
        )
    print(f"single-stream decode: {single:8.1f} tok/s   (target >= 300)")
    print(f"aggregate @ {args.concurrency:<2d}       : {agg:8.1f} tok/s")
    print(f"ratio                : {agg / single:8.2f}x       (target >= 2x)")


if __name__ == "__main__":
    main()
