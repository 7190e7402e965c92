"""A scripted office assistant for the embedded engine: reads the conversation, returns the next
assistant text (a ``<tool_call>`` or the closing sentence), so tests and demos run end to end.

``mistake_rate`` makes it email the organiser of a wrong meeting now and then, so a group of
rollouts earns different rewards.
"""

from __future__ import annotations

import json
import random
import re
import threading
from typing import Any

__all__ = ["OfficeSolver"]

_NOW = re.compile(r"It is now (\S+?)\. I am (\w+)\.")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _call(name: str, arguments: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def _listed_events(text: str) -> list[dict[str, Any]] | None:
    # the list_events result, wherever the chat template put it
    start = text.find('{"user"')
    if start < 0:
        return None
    listing, _ = json.JSONDecoder().raw_decode(text[start:])
    return list(listing["events"])


class OfficeSolver:
    """``solver(messages, tools) -> text | None``; None for requests without the office tools."""

    def __init__(self, *, mistake_rate: float = 0.0, seed: int | None = None) -> None:
        self.mistake_rate = mistake_rate
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def __call__(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> str | None:
        names = {(t.get("function") or {}).get("name") for t in tools or [] if isinstance(t, dict)}
        if tools and "list_events" not in names:
            return None
        texts = [_text(m.get("content")) for m in messages]
        head = next((m for t in texts if (m := _NOW.search(t))), None)
        if head is None:
            return None
        now, user = head.group(1), head.group(2)
        if any("Email sent to" in t for t in texts):
            return "Done: I emailed the organiser."
        events = _listed_events("\n".join(texts))
        if events is None:
            return _call("list_events", {"user": user})
        upcoming = sorted(
            (e for e in events if e["start"] > now), key=lambda e: (e["start"], e["id"])
        )
        if not upcoming:
            return "You have no upcoming meetings."
        with self._lock:
            wrong = len(upcoming) > 1 and self._rng.random() < self.mistake_rate
        meeting = upcoming[1] if wrong else upcoming[0]
        return _call(
            "send_email",
            {
                "to": meeting["organizer"],
                "subject": f"Running late: {meeting['title']}",
                "body": "Sorry, I am running about ten minutes late.",
            },
        )
