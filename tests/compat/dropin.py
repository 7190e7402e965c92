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
    """A calculator call first, then the final answer once the tool has answered (at once when
    the agent offers no tools)."""
    if not tools:
        return FINAL
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


class AgentProcess:
    """``uvicorn module:app`` in a child process on a free loopback port, always stopped."""

    def __init__(
        self, folder: Path, target: str, env: dict[str, str], ready: str = "/ping"
    ) -> None:
        import os

        from rollwire.agent.serving import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._cmd = [
            sys.executable, "-m", "uvicorn", target, "--app-dir", str(folder),
            "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning",
        ]  # fmt: skip
        self._env = {**os.environ, **env}
        self._proc: Any = None
        self._ready = ready

    def __enter__(self) -> AgentProcess:
        import subprocess
        import time

        import httpx

        self._proc = subprocess.Popen(self._cmd, env=self._env)
        end = time.monotonic() + 180  # heavy imports (sagemaker-train) on a busy machine
        while time.monotonic() < end:
            if self._proc.poll() is not None:
                raise RuntimeError(f"{self._cmd} exited with {self._proc.returncode}")
            try:
                if httpx.get(f"{self.url}{self._ready}", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.1)
        self.__exit__()
        raise TimeoutError(f"the agent at {self.url} did not answer {self._ready} within 180s")

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except Exception:
                self._proc.kill()
                self._proc.wait(5)


FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-west-2",
    "AWS_REGION": "us-west-2",
    "AWS_EC2_METADATA_DISABLED": "true",
}
