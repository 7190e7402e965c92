"""Helpers for the drop-in tests: a guide-shaped agent with one import line changed, loaded from
a scratch folder, and the scripted model that solves its math task with the calculator tool."""

from __future__ import annotations

import importlib.util
import shutil
import sys
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

AGENTS = Path(__file__).parent / "agents"
TASKS = [
    {"id": "q1", "prompt": "What is 17 * 23 + 4?", "answer": "395"},
    {"id": "q2", "prompt": "What is 17 * 23 + 5?", "answer": "400"},  # the script says 395: 0.0
]
CALL = (
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "17 * 23 + 4"}}\n</tool_call>'
)
FINAL = "17 * 23 + 4 = 395.\n#### 395"


def math_script(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
) -> str | None:
    """A calculator call first, then the final answer once the tool has answered."""
    if not tools:
        return None
    if messages and messages[-1].get("role") == "tool":
        return FINAL
    return CALL


def with_import(tmp_path: Path, name: str, changes: dict[str, str]) -> Path:
    """A copy of agent ``name`` with exactly these lines replaced (nothing else differs)."""
    source = (AGENTS / name).read_text()
    changed = source
    for old, new in changes.items():
        assert source.count(old) == 1, f"{name} must contain {old!r} exactly once"
        changed = changed.replace(old, new)
    before, after = source.splitlines(), changed.splitlines()
    assert len(before) == len(after)
    assert sum(a != b for a, b in zip(before, after)) == len(changes)
    folder = tmp_path / f"agent-{uuid.uuid4().hex[:6]}"
    folder.mkdir()
    (folder / name).write_text(changed)
    shutil.copy(AGENTS / "gsm8k_reward.py", folder)
    return folder


def load_agent(folder: Path, name: str) -> ModuleType:
    """Import ``folder/name`` as a fresh module (its folder on ``sys.path`` while it imports)."""
    sys.path.insert(0, str(folder))
    try:
        spec = importlib.util.spec_from_file_location(f"agent_{uuid.uuid4().hex}", folder / name)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(folder))
