"""One scripted coding task for a coding-agent CLI, run *inside* a network namespace that has only
loopback (``test_coding_clis.py`` starts it with ``unshare -n``): the embedded engine, the gateway
and the CLI all live there, so nothing can leave the machine, and a CLI that needed anything
beyond loopback fails its task.

Usage: ``python cli_task.py {codex|claude-code} EXECUTABLE OUT_JSON``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from rollwire.agent.coding_cli import run_coding_cli
from rollwire.engine import EmbeddedEngine, EngineConfig
from rollwire.engine.model import ModelConfig
from rollwire.gateway import serve_in_thread

CONTENT = "hello from the policy"
TASK = "Create the file hello.txt containing exactly: " + CONTENT


def _tool_call(name: str, arguments: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def make_script(kind: str, where: dict[str, Path]) -> Any:
    """The policy: the dialect's tool call that writes the file, then (after its result) stop.
    ``where["workdir"]`` is the current rollout's working directory."""

    def script(messages: list[dict[str, Any]], tools: Any) -> str | None:
        # On the token-in route (capture="tokens") the engine sees the rendered prompt only:
        # tools and tool results are read from the text then.
        texts = [str(m.get("content")) for m in messages]
        names = {t["function"]["name"] for t in tools or ()}
        names |= {n for n in ("exec_command", "Write") if any(f'"{n}"' in t for t in texts)}
        if any(m.get("role") == "tool" for m in messages) or any(
            "<tool_response>" in t for t in texts
        ):
            return "Done: hello.txt is written."
        if kind == "codex" and "exec_command" in names:
            return _tool_call("exec_command", {"cmd": f"printf '%s' '{CONTENT}' > hello.txt"})
        if kind == "claude-code" and "Write" in names:
            path = str(where["workdir"] / "hello.txt")
            return _tool_call("Write", {"file_path": path, "content": CONTENT})
        return f"I have no tool to write files with (tools: {sorted(names)})."

    return script


def _only_loopback() -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show", "up"], capture_output=True, text=True)
    return [line.split(":")[1].strip() for line in out.stdout.splitlines() if line.strip()]


def _reward(path: Path) -> float:
    target = path / "hello.txt"
    return float(target.exists() and target.read_text() == CONTENT)


def run_once(client: Any, kind: str, executable: str, capture: str, wd: Path) -> dict[str, Any]:
    """One rollout: a session, the CLI on the task, the reward, and what was captured."""
    h = client.create_session(capture=capture, metadata={"cli": kind})
    payload = {
        "_rollwire": {
            "session_id": h.session_id,
            "base_url": h.base_url,
            "api_key": h.token,
            "complete_url": h.complete_url,
            "model": "policy",
        }
    }
    if kind == "claude-code":
        options: dict[str, Any] = {"system_prompt": "You write files.", "tools": ["Write"]}
    else:
        options = {"instructions": "You write files with exec_command."}
    run = asyncio.run(
        run_coding_cli(
            kind,  # type: ignore[arg-type]
            payload,
            TASK,
            reward=_reward,
            workdir=wd,
            executable=executable,
            timeout=240,
            **options,
        )
    )
    client.complete(h.session_id, reward=run.outcome)
    calls = client.calls(h.session_id)
    info = client.get_session(h.session_id)
    return {
        "returncode": run.returncode,
        "stdout": run.stdout[-3000:],
        "stderr": run.stderr[-3000:],
        "reward": info.reward,
        "status": info.status,
        "calls": [
            {
                "status": c.status,
                "error": c.error,
                "trainable": c.trainable,
                "experts": c.routed_experts is not None,
                "tool_calls": [
                    t["function"]["name"]
                    for t in (c.response.get("choices") or [{}])[0]
                    .get("message", {})
                    .get("tool_calls")
                    or ()
                ],
            }
            for c in calls
        ],
        "rows": len(client.trajectory(h.session_id)),
    }


def main(kind: str, executable: str, out_path: str) -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    result: dict[str, Any] = {"interfaces": _only_loopback()}
    workdir = Path(tempfile.mkdtemp(prefix="rollwire-cli-task-"))
    where = {"workdir": workdir}
    cfg = EngineConfig(
        scripted=make_script(kind, where),
        return_routed_experts=True,
        default_max_tokens=256,
        model=ModelConfig(max_model_len=32768),
    )
    with (
        EmbeddedEngine(cfg) as eng,
        serve_in_thread(backends=[(eng.url, "vllm")]) as gw,
        gw.client() as client,
    ):
        for capture in ("passthrough", "tokens"):
            wd = where["workdir"] = workdir / capture
            result[capture] = run_once(client, kind, executable, capture, wd)
    Path(out_path).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:4])
