"""Embedded-engine throughput over HTTP: single-stream decode tokens/s, aggregate at 16 concurrent,
time to prefill a 4,096-token prompt, and a 10-turn scripted conversation.

Run: ``uv run --frozen python benchmarks/engine.py [--tokens 256] [--runs 3] [--concurrency 16]``.
Targets on a 2-core machine: >= 300 tok/s single stream; aggregate at 16 >= 2x single.

With ``--model DIR`` (a Hugging Face folder the engine loads, e.g. SmolLM2-135M-Instruct) it
measures that model instead: greedy single-stream decode of ``--tokens`` (default 64) tokens,
with the prompt's prefill timed apart (time to first token), aggregate at ``--concurrency``
(default 4) and a 1,024-token prefill.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from rollwire.engine import EmbeddedEngine, EngineConfig

MSGS = [{"role": "user", "content": "Write a long story about a robot."}]


async def _one(
    client: httpx.AsyncClient, url: str, tokens: int, seed: int, temperature: float = 1.0
) -> int:
    body = {
        "messages": MSGS,
        "max_tokens": tokens,
        "ignore_eos": True,
        "seed": seed,
        "temperature": temperature,
        "return_token_ids": True,
    }
    r = await client.post(url, json=body)
    r.raise_for_status()
    return len(r.json()["choices"][0]["token_ids"])


async def _measure(
    url: str, tokens: int, concurrency: int, seed: int, temperature: float = 1.0
) -> float:
    async with httpx.AsyncClient(
        timeout=600, limits=httpx.Limits(max_connections=concurrency)
    ) as client:
        await _one(client, url, 8, seed)  # warm the connection pool
        t0 = time.perf_counter()
        counts = await asyncio.gather(
            *[_one(client, url, tokens, seed + i, temperature) for i in range(concurrency)]
        )
        return sum(counts) / (time.perf_counter() - t0)


def _seconds(url: str, tokens: int) -> float:
    """Wall time of one greedy chat request of ``tokens`` tokens."""
    body = {"messages": MSGS, "max_tokens": tokens, "ignore_eos": True, "temperature": 0}
    t0 = time.perf_counter()
    httpx.post(url, json=body, timeout=600).raise_for_status()
    return time.perf_counter() - t0


def _model_main(folder: Path, tokens: int, runs: int, concurrency: int) -> None:
    """The ``--model`` measurements (the prefix cache off, so every run prefills its prompt)."""
    with EmbeddedEngine(EngineConfig(model_dir=folder, prefix_cache_tokens=0)) as eng:
        url = eng.base_url + "/chat/completions"
        cfg = eng.model.config
        prompt = len(eng.tokenizer.apply_chat_template(MSGS))
        _seconds(url, 2)  # warm up
        first = statistics.median(_seconds(url, 1) for _ in range(runs))
        total = statistics.median(_seconds(url, tokens) for _ in range(runs))
        agg = statistics.median(
            asyncio.run(_measure(url, tokens, concurrency, 100 * r)) for r in range(runs)
        )
        prefill_1k = statistics.median(_long_prompt(eng.url, 1024, r) for r in range(runs))
    heads = f"{cfg.n_heads}/{cfg.kv_heads} heads"
    print(
        f"model: {folder.name} ({cfg.model_type}, {cfg.n_layers} layers, d_model {cfg.d_model}, "
        f"{heads}{', tied' if cfg.tie_embeddings else ''})"
    )
    print(
        f"single-stream greedy decode: {(tokens - 1) / (total - first):7.1f} tok/s "
        f"({tokens} tokens; {tokens / total:.1f} tok/s counting the prefill)"
    )
    print(f"time to first token        : {first:7.2f} s     ({prompt}-token prompt)")
    print(f"aggregate @ {concurrency:<2d}              : {agg:7.1f} tok/s")
    print(f"1,024-token prefill        : {prefill_1k:7.2f} s")


def _long_prompt(url: str, n: int, seed: int = 0) -> float:
    """Seconds to prefill an ``n``-token prompt (random ids, so no prefix is shared)."""
    rng = random.Random(seed)
    ids = [rng.randrange(10, 1300) for _ in range(n)]
    t0 = time.perf_counter()
    r = httpx.post(url + "/v1/completions", json={"prompt": ids, "max_tokens": 1}, timeout=600)
    r.raise_for_status()
    return time.perf_counter() - t0


_REPLY = (
    '<tool_call>\n{"name": "search", "arguments": {"query": "rollwire engine prefix cache"}}\n'
    "</tool_call>"
)


def _script(messages: list[dict[str, Any]], tools: Any) -> str:
    return _REPLY + "\nChecking the results before the next step. " * 4


def _scripted_conversation(url: str, turns: int, run: int = 0) -> tuple[float, int]:
    """Seconds for a ``turns``-turn scripted chat (each turn resends the history) and the last
    prompt's length; ``run`` varies the first token so runs share no prefix."""
    msgs: list[dict[str, Any]] = [
        {
            "role": "system",
            "content": f"Run {run}. " + "You are a careful research assistant. " * 40,
        },
        {"role": "user", "content": "Find out how the engine reuses prompt prefixes."},
    ]
    t0 = time.perf_counter()
    prompt_len = 0
    with httpx.Client(timeout=600) as client:
        for turn in range(turns):
            body = {"messages": msgs, "logprobs": True, "return_token_ids": True}
            d = client.post(url + "/v1/chat/completions", json=body).json()
            prompt_len = len(d["prompt_token_ids"])
            msgs.append({"role": "assistant", "content": d["choices"][0]["message"]["content"]})
            msgs.append({"role": "user", "content": f"Result {turn}: " + "more findings. " * 30})
    return time.perf_counter() - t0, prompt_len


def main() -> None:
    """Print single-stream and concurrent tokens/s (medians of several runs) and their ratio."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=None, help="default 256 (64 with --model)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=None, help="default 16 (4 with --model)")
    ap.add_argument(
        "--model", type=Path, default=None, metavar="DIR", help="a Hugging Face folder to serve"
    )
    args = ap.parse_args()
    if args.model is not None:
        _model_main(args.model, args.tokens or 64, args.runs, args.concurrency or 4)
        return
    args.tokens = args.tokens or 256
    args.concurrency = args.concurrency or 16
    with EmbeddedEngine(EngineConfig()) as eng:
        url = eng.base_url + "/chat/completions"
        single = statistics.median(
            asyncio.run(_measure(url, args.tokens, 1, r)) for r in range(args.runs)
        )
        agg = statistics.median(
            asyncio.run(_measure(url, args.tokens, args.concurrency, 100 * r))
            for r in range(args.runs)
        )
        prefill_4k = statistics.median(_long_prompt(eng.url, 4096, r) for r in range(args.runs))
    with EmbeddedEngine(EngineConfig(scripted=_script)) as eng:
        convo = [_scripted_conversation(eng.url, 10, r) for r in range(args.runs)]
        convo_s = statistics.median(t for t, _ in convo)
        convo_len = convo[0][1]
    print(f"single-stream decode: {single:8.1f} tok/s   (target >= 300)")
    print(f"aggregate @ {args.concurrency:<2d}       : {agg:8.1f} tok/s")
    print(f"ratio                : {agg / single:8.2f}x       (target >= 2x)")
    print(f"4,096-token prefill  : {prefill_4k:8.2f} s")
    print(f"10-turn scripted chat: {convo_s:8.2f} s      (last prompt {convo_len} tokens)")


if __name__ == "__main__":
    main()
