"""A scripted Wordle policy for the embedded engine: reads the game from the messages, returns a guess.

It plays like a decent, slightly noisy player (a random word still consistent with all feedback,
and now and then an exploratory word) so groups get varied rewards. The engine teacher-forces the
returned text, so the log-probs recorded are the model's own for those tokens.
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Sequence
from typing import Any

from rollwire.envs.wordle.game import consistent, parse_feedback_text
from rollwire.envs.wordle.words import all_words

__all__ = ["WordleSolver", "tool_call_text"]


def tool_call_text(word: str) -> str:
    """The assistant text of one ``guess_word`` call in the Hermes/Qwen ``<tool_call>`` format."""
    body = json.dumps({"name": "guess_word", "arguments": {"word": word}})
    return f"<tool_call>\n{body}\n</tool_call>"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for p in content:
            if isinstance(p, str):
                parts.append(p)
            elif isinstance(p, dict):
                for key in ("text", "content", "json"):
                    if isinstance(p.get(key), str):
                        parts.append(p[key])
                    elif isinstance(p.get(key), list):
                        parts.append(_text(p[key]))
        return "\n".join(parts)
    return ""


class WordleSolver:
    """``solver(messages, tools) -> text | None``: the next guess as a ``<tool_call>``.

    Returns None (let the model sample) for requests that do not offer the ``guess_word`` tool,
    and a short closing sentence once the game is over. ``explore`` is the chance of a random
    (possibly inconsistent) guess instead of a consistent one.
    """

    def __init__(
        self, words: Sequence[str] | None = None, *, seed: int | None = None, explore: float = 0.2
    ) -> None:
        self.words = tuple(words) if words is not None else all_words()
        self.explore = explore
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def __call__(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> str | None:
        if not any(_tool_name(t) == "guess_word" for t in tools or []):
            return None
        seen = "\n".join(
            _text(m.get("content")) for m in messages if m.get("role") in ("tool", "user")
        )
        last = _text(messages[-1].get("content")) if messages else ""
        if "Solved in" in last or "Out of guesses" in last:
            return "Game over."
        history = parse_feedback_text(seen)
        with self._lock:
            if history and self._rng.random() >= self.explore:
                pool = [w for w in self.words if consistent(w, history)] or list(self.words)
            else:
                pool = list(self.words)
            return tool_call_text(self._rng.choice(pool))


def _tool_name(tool: Any) -> str | None:
    if not isinstance(tool, dict):
        return None
    fn = tool.get("function")
    if isinstance(fn, dict):
        return fn.get("name")
    return tool.get("name")
