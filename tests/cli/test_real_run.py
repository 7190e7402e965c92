"""docs/real-run.md's own agent and tasks file run as the page says (against the embedded engine
here, where the random model answers noise: the run must complete, not score)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

PAGE = Path(__file__).resolve().parents[2] / "docs" / "real-run.md"


def test_the_guide_agent_runs(cli: Callable[..., Any], tmp_path: Path) -> None:
    text = PAGE.read_text()
    agent = re.search(r"```python\n(# my_agent.py\n.*?)```", text, re.S)
    tasks = re.search(r"```json\n(.*?)```", text, re.S)
    assert agent is not None and tasks is not None
    (tmp_path / "my_agent.py").write_text(agent.group(1))
    (tmp_path / "tasks.jsonl").write_text(tasks.group(1))
    assert all(json.loads(line)["answer"] for line in tasks.group(1).splitlines())
    proc = cli(
        "run", "--agent", "my_agent:app", "--tasks", "tasks.jsonl", "--group-size", "2",
        "--backend", "embedded", "--max-tokens", "8", "--no-progress", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4 in 2 groups (completed 4)" in proc.stdout
