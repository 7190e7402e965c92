"""Write ``tasks.jsonl`` and ``heldout.jsonl`` for ``notes_agent`` (topics never shared)."""

from __future__ import annotations

import json
from pathlib import Path

TOPICS = ["rain", "tea", "maps", "bells", "boats", "glass", "ink", "salt", "wool", "clay"]


def write(folder: Path = Path(".")) -> None:
    """Eight training topics, two held-out ones; the keyword is the topic's first letter."""
    for name, topics in (("tasks.jsonl", TOPICS[:8]), ("heldout.jsonl", TOPICS[8:])):
        lines = [json.dumps({"topic": t, "keyword": t[0]}) for t in topics]
        (folder / name).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    write()
