"""Tokens mode vs passthrough: rows per rollout, trainable tokens kept, and render+heal CPU cost.

Part 1 — 200 scripted multi-turn rollouts (in-process, the embedded engine's tokenizer and chat
template): each turn the "policy" writes reasoning and a tool call or an answer (tool-call JSON
compact in a third of the turns, as models often write it); the agent sends the reply back the way
frameworks do (reasoning dropped, arguments re-serialized). Passthrough = the server re-renders
the history each call; tokens = the gateway's healer. Rows come from ``TrajectoryBuilder`` (merge).
"Kept" counts sampled tokens in the rollout's last row, i.e. what survives when a trainer keeps
one sequence per rollout (or drops forked rollouts — see "rollouts without a fork").

Part 2 — CPU time to build the prompt of the last call of an N-turn conversation (N = 8, 32, 128):
healing (render only the new suffix) vs a full re-render of the history.

Run: ``uv run --frozen python benchmarks/tokens_mode.py [--rollouts 200] [--json]``.
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import random
import statistics
import time
from typing import Any

import numpy as np

from rollwire.data.protocol import ModelCall, Rollout
from rollwire.data.trajectory import TrajectoryBuilder
from rollwire.engine import tokenizer_dir
from rollwire.gateway.tokens.heal import Healer
from rollwire.gateway.tokens.parsers import HermesParser
from rollwire.gateway.tokens.render import ChatRenderer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "book",
            "parameters": {"type": "object", "properties": {"item": {"type": "integer"}}},
        },
    },
]
WORDS = [
    "red",
    "shoes",
    "socks",
    "wool",
    "runner",
    "size",
    "stock",
    "price",
    "item",
    "book",
    "search",
    "find",
    "cheap",
    "fast",
    "blue",
]


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def _sampled(rng: random.Random, final: bool) -> str:
    think = (
        f"<think>\n{_sentence(rng, rng.randint(4, 20))}\n</think>\n\n" if rng.random() < 0.8 else ""
    )
    if final:
        return think + _sentence(rng, rng.randint(5, 30))
    args: dict[str, Any] = (
        {"query": _sentence(rng, 3)} if rng.random() < 0.5 else {"item": rng.randint(1, 99)}
    )
    name = "search" if "query" in args else "book"
    sep = (",", ":") if rng.random() < 0.33 else None
    call = json.dumps({"name": name, "arguments": args}, separators=sep)
    return f"{think}<tool_call>\n{call}\n</tool_call>"


def _client(msg: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": msg.get("content") or ""}
    if msg.get("tool_calls"):
        out["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {
                    "name": c["function"]["name"],
                    "arguments": json.dumps(json.loads(c["function"]["arguments"])),
                },
            }
            for c in msg["tool_calls"]
        ]
    return out


def _call(
    rid: str, k: int, prompt: np.ndarray, completion: np.ndarray, rng: np.random.Generator
) -> ModelCall:
    return ModelCall(
        call_id=f"{rid}-{k}",
        session_id=rid,
        index=k,
        prompt_ids=prompt,
        completion_ids=completion,
        logprobs=-rng.random(completion.shape[0], dtype=np.float32),
    )


def simulate(renderer: ChatRenderer, n_rollouts: int, seed: int = 0) -> dict[str, dict[str, Any]]:
    """Rows and token accounting for both capture modes over ``n_rollouts`` scripted rollouts."""
    parser = HermesParser()
    builder = TrajectoryBuilder(tokenizer=renderer)
    eos = np.asarray([renderer.eos_id], np.int32)
    stats: dict[str, dict[str, Any]] = {
        mode: {
            "rows": 0,
            "row_tokens": 0,
            "sampled": 0,
            "kept": 0,
            "unforked": 0,
            "lost": 0,
            "kinds": collections.Counter(),
        }
        for mode in ("passthrough", "tokens")
    }
    for r in range(n_rollouts):
        rng = random.Random(seed * 1_000_003 + r)
        nrng = np.random.default_rng(r)
        turns = rng.randint(3, 10)
        msgs: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a shop assistant."},
            {"role": "user", "content": _sentence(rng, 8)},
        ]
        healer = Healer(renderer)
        calls: dict[str, list[ModelCall]] = {"passthrough": [], "tokens": []}
        for k in range(turns):
            final = k == turns - 1 or rng.random() < 0.25
            text = _sampled(rng, final)
            completion = np.concatenate([renderer.encode(text), eos])
            heal = healer.prompt(msgs, TOOLS)
            calls["tokens"].append(_call(str(r), k, heal.prompt_ids, completion, nrng))
            calls["passthrough"].append(
                _call(str(r), k, renderer.render(msgs, TOOLS), completion, nrng)
            )
            msg = parser.parse(text, TOOLS).message()
            healer.record(heal, msgs, TOOLS, None, completion, msg)
            msgs = [*msgs, _client(msg)]
            if msg.get("tool_calls"):
                msgs.append({"role": "tool", "tool_call_id": "c", "content": _sentence(rng, 6)})
            else:
                msgs.append({"role": "user", "content": _sentence(rng, 6)})
        for mode, cs in calls.items():
            rows = builder.build(Rollout(rollout_id=str(r), calls=cs, reward=1.0))
            s = stats[mode]
            s["rows"] += len(rows)
            s["row_tokens"] += sum(int(x.input_ids.shape[0]) for x in rows)
            s["sampled"] += sum(int(c.completion_ids.shape[0]) for c in cs)
            s["kept"] += int(rows[-1].loss_mask.sum())
            s["unforked"] += int(len(rows) == 1)
            for x in rows:
                if x.fork is not None:
                    s["kinds"][x.fork.kind] += 1
                    s["lost"] += x.fork.tokens_lost
    for s in stats.values():
        s["rows_per_rollout"] = s["rows"] / n_rollouts
        s["kept_fraction"] = s["kept"] / max(s["sampled"], 1)
        s["kinds"] = dict(s["kinds"])
    return stats


def _conversation(turns: int) -> list[dict[str, Any]]:
    rng = random.Random(turns)
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a shop assistant."},
        {"role": "user", "content": _sentence(rng, 8)},
    ]
    return msgs


def timing(renderer: ChatRenderer, turns: int, repeats: int = 50) -> dict[str, float]:
    """Median ms to build the last prompt of a ``turns``-call conversation: heal vs full render."""
    rng = random.Random(turns)
    parser = HermesParser()
    eos = np.asarray([renderer.eos_id], np.int32)
    healer = Healer(renderer)
    msgs = _conversation(turns)
    for _ in range(turns - 1):
        text = _sampled(rng, False)
        heal = healer.prompt(msgs, TOOLS)
        msg = parser.parse(text, TOOLS).message()
        healer.record(heal, msgs, TOOLS, None, np.concatenate([renderer.encode(text), eos]), msg)
        msgs = [
            *msgs,
            _client(msg),
            {"role": "tool", "tool_call_id": "c", "content": _sentence(rng, 6)},
        ]
    # A new request arrives as freshly parsed JSON: heal a deep copy, not the recorded objects.
    msgs = copy.deepcopy(msgs)
    assert healer.prompt(msgs, TOOLS).healed
    heal_ms, full_ms = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        res = healer.prompt(msgs, TOOLS)
        heal_ms.append((time.perf_counter() - t) * 1e3)
    for _ in range(repeats):
        t = time.perf_counter()
        renderer.render(msgs, TOOLS)
        full_ms.append((time.perf_counter() - t) * 1e3)
    return {
        "turns": turns,
        "prompt_tokens": int(res.prompt_ids.shape[0]),
        "heal_ms": statistics.median(heal_ms),
        "full_render_ms": statistics.median(full_ms),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=200)
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args()
    renderer = ChatRenderer.from_dir(tokenizer_dir())
    t = time.perf_counter()
    stats = simulate(renderer, args.rollouts)
    sim_s = time.perf_counter() - t
    times = [timing(renderer, n) for n in (8, 32, 128)]
    if args.json:
        print(json.dumps({"rollouts": args.rollouts, "modes": stats, "timing": times}, indent=2))
        return
    print(f"{args.rollouts} scripted rollouts ({sim_s:.1f}s)")
    print(
        f"{'mode':<12}{'rows/rollout':>13}{'unforked':>10}{'sampled':>9}{'kept':>9}{'kept %':>8}{'row tokens':>12}  forks"
    )
    for mode, s in stats.items():
        print(
            f"{mode:<12}{s['rows_per_rollout']:>13.2f}{s['unforked']:>10}{s['sampled']:>9}{s['kept']:>9}"
            f"{100 * s['kept_fraction']:>7.1f}%{s['row_tokens']:>12}  {s['kinds']}"
        )
    print("\nprompt build for the last call (median ms)")
    print(f"{'turns':>6}{'prompt tokens':>15}{'heal':>9}{'full render':>13}")
    for row in times:
        print(
            f"{row['turns']:>6}{row['prompt_tokens']:>15}{row['heal_ms']:>9.3f}{row['full_render_ms']:>13.3f}"
        )


if __name__ == "__main__":
    main()
