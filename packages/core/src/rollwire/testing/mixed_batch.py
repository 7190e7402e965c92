"""One MoE batch that mixes every kind of rollout a trainer adapter must survive.

Trainer adapters' end-to-end tests run :class:`MixedAgent` through a real gateway over the embedded
engine (scripted with :func:`script`, routing on) as one group of four rollouts: a clean one (two
calls merged into one row), a forked one (the second call rewrites the history: two rows), a failed
one (one call, then the agent raises) and one that never called the model (the agent raises first).
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

__all__ = ["KINDS", "MixedAgent", "script"]

#: The rollout kinds, in the order :class:`MixedAgent` hands them out.
KINDS: tuple[str, ...] = ("clean", "forked", "failed", "no_call")

#: reward of each kind that completes
REWARDS = {"clean": 1.0, "forked": 0.5}


def script(messages: list[dict[str, Any]], tools: Any) -> str:
    """The engine's scripted reply: an answer after a tool message, else a first step."""
    last = messages[-1]["content"] if messages else ""
    return "The answer is 4." if str(last).startswith("tool:") else "Let me compute."


class MixedAgent:
    """Agent handler whose n-th rollout is ``KINDS[n % 4]`` (kinds go out in order, under a lock).

    A completed rollout reports its kind as the metric ``<kind>`` = 1.0, so the metric keys differ
    between rollouts (as they do between an agent's success and error paths).
    """

    def __init__(self) -> None:
        self._counter = itertools.count()
        self._lock = threading.Lock()
        self.kinds: list[str] = []

    def _next_kind(self) -> str:
        with self._lock:
            kind = KINDS[next(self._counter) % len(KINDS)]
            self.kinds.append(kind)
            return kind

    async def __call__(self, payload: dict[str, Any]) -> dict[str, Any]:
        from rollwire.agent.context import async_openai_client

        kind = self._next_kind()
        if kind == "no_call":
            raise RuntimeError("agent crashed before its first model call")
        client = async_openai_client(payload)
        msgs: list[Any] = [{"role": "user", "content": str(payload.get("prompt") or "2+2?")}]
        first = await client.chat.completions.create(model="policy", messages=msgs)
        if kind == "failed":
            raise RuntimeError("tool crashed after the first model call")
        if kind == "forked":
            history: list[Any] = [
                {"role": "system", "content": "summary: asked 2+2"},
                {"role": "user", "content": "tool: 4"},
            ]
        else:
            text = first.choices[0].message.content or ""
            history = [
                *msgs,
                {"role": "assistant", "content": text},
                {"role": "user", "content": "tool: 4"},
            ]
        await client.chat.completions.create(model="policy", messages=history)
        return {"reward": REWARDS[kind], "metrics": {kind: 1.0, "turns": 2.0}}
