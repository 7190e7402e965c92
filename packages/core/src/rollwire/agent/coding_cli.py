"""Coding-agent CLIs as rollout agents: Codex CLI (Responses API) and Claude Code (Messages).

:func:`run_coding_cli` starts the CLI non-interactively in a per-rollout working directory,
pointed at the rollout session (base URL and key from ``payload["_rollwire"]``), with telemetry,
update checks and error reporting switched off by their configuration and environment
variables, and its own home directory (no user config or credentials leak in). When the CLI
exits, ``reward(workdir)`` scores what it left behind; that is the rollout's outcome::

    @app.rollout_entrypoint
    async def solve(payload):
        return await run_coding_cli(
            "codex", payload, payload["prompt"], reward=lambda wd: float((wd / "ok").exists())
        )

Both CLIs still *try* to reach their vendors for some things; run the rollout worker where only
the gateway is reachable (a network namespace or an egress policy). Agent side: no gateway,
store or engine imports.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rollwire.agent.context import RolloutContext, rollout_context

__all__ = ["CliCommand", "CliResult", "claude_code_command", "codex_command", "run_coding_cli"]

CliKind = Literal["codex", "claude-code"]
RewardFn = Callable[[Path], Any]
_EXECUTABLES = {"codex": "codex", "claude-code": "claude"}
# Claude Code's switches for everything that is not a model call.
_CLAUDE_QUIET = {
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_BUG_COMMAND": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
    "IS_SANDBOX": "1",  # lets --dangerously-skip-permissions run as root in a container
}


@dataclass(frozen=True)
class CliCommand:
    """A CLI invocation: argv, the environment to add, and the home directory to create."""

    argv: list[str]
    env: dict[str, str]
    home: Path


@dataclass(frozen=True)
class CliResult:
    """How the CLI ended and what the reward function made of its working directory."""

    returncode: int
    stdout: str
    stderr: str
    workdir: Path
    outcome: Any


def _toml(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def codex_command(
    ctx: RolloutContext,
    task: str,
    home: Path,
    *,
    executable: str = "codex",
    instructions: str | None = None,
    extra_args: Sequence[str] = (),
) -> CliCommand:
    """``codex exec`` on the session's Responses API (a ``rollwire`` model provider in its own
    ``CODEX_HOME``), no approvals or sandbox (the rollout's workdir is the sandbox), web search,
    sub-agents, analytics and update checks off. ``instructions`` replaces Codex's base prompt."""
    lines = [
        f"model = {_toml(ctx.model)}",
        'model_provider = "rollwire"',
        "check_for_update_on_startup = false",
        'web_search = "disabled"',
    ]
    if instructions is not None:
        (home / "instructions.md").write_text(instructions, encoding="utf-8")
        lines.append(f"model_instructions_file = {_toml(str(home / 'instructions.md'))}")
    lines += [
        "[agents]",
        "enabled = false",
        "[analytics]",
        "enabled = false",
        "[features]",
        "goals = false",
        "[model_providers.rollwire]",
        'name = "rollwire"',
        f"base_url = {_toml(ctx.base_url)}",
        'env_key = "ROLLWIRE_SESSION_TOKEN"',
        'wire_api = "responses"',
        "request_max_retries = 0",
        "stream_max_retries = 0",
    ]
    (home / "config.toml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    argv = [
        executable,
        "exec",
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
        *extra_args,
        task,
    ]
    env = {"CODEX_HOME": str(home), "ROLLWIRE_SESSION_TOKEN": ctx.api_key}
    return CliCommand(argv, env, home)


def claude_code_command(
    ctx: RolloutContext,
    task: str,
    home: Path,
    *,
    executable: str = "claude",
    system_prompt: str | None = None,
    tools: Sequence[str] | None = None,
    extra_args: Sequence[str] = (),
) -> CliCommand:
    """``claude -p`` on the session's Messages API (``ANTHROPIC_BASE_URL`` / ``ANTHROPIC_API_KEY``
    from the session, every model role mapped to the session's model), permissions skipped,
    no user settings or MCP servers, telemetry and auto-update off. ``system_prompt`` and
    ``tools`` (built-in tool names) narrow what the model is shown."""
    env = {
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": ctx.anthropic_base_url,
        "ANTHROPIC_API_KEY": ctx.api_key,
        "ANTHROPIC_MODEL": ctx.model,
        "ANTHROPIC_SMALL_FAST_MODEL": ctx.model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": ctx.model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": ctx.model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": ctx.model,
        **_CLAUDE_QUIET,
    }
    argv = [
        executable,
        "-p",
        task,  # first: --tools takes every value that follows it
        "--dangerously-skip-permissions",
        "--model",
        ctx.model,
        "--strict-mcp-config",
        "--setting-sources",
        "",
        "--output-format",
        "json",
    ]
    if system_prompt is not None:
        argv += ["--system-prompt", system_prompt]
    if tools is not None:
        argv += ["--tools", ",".join(tools)]
    argv += list(extra_args)
    return CliCommand(argv, env, home)


def _outcome(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float, Mapping)):
        raise TypeError(
            f"the reward function must return a number or {{'reward', 'metrics'}}, got {value!r}"
        )
    return dict(value) if isinstance(value, Mapping) else float(value)


async def run_coding_cli(
    kind: CliKind,
    payload: Mapping[str, Any],
    task: str,
    *,
    reward: RewardFn,
    workdir: str | os.PathLike[str] | None = None,
    executable: str | None = None,
    timeout: float | None = None,
    **options: Any,
) -> CliResult:
    """Run the ``kind`` CLI on ``task`` for the rollout in ``payload``; score its workdir.

    ``workdir`` defaults to a fresh temporary directory (kept: the reward may want it); the
    CLI's home is a temporary directory removed afterwards. ``options`` go to
    :func:`codex_command` / :func:`claude_code_command`. The timeout defaults to the rollout's
    deadline. A CLI that fails still gets its workdir scored (the CLI's exit code is in the
    result; the reward function decides what a half-done task is worth).
    """
    ctx = rollout_context(payload)
    if ctx is None:
        raise ValueError("run_coding_cli needs a rollout payload (with the '_rollwire' key)")
    exe = executable or shutil.which(_EXECUTABLES[kind])
    if exe is None:
        raise FileNotFoundError(
            f"{_EXECUTABLES[kind]!r} not found on PATH: npm install -g "
            + ("@openai/codex" if kind == "codex" else "@anthropic-ai/claude-code")
        )
    wd = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="rollwire-cli-"))
    wd.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rollwire-cli-home-") as tmp:
        home = Path(tmp)
        build = codex_command if kind == "codex" else claude_code_command
        cmd = build(ctx, task, home, executable=exe, **options)
        env = {**os.environ, **cmd.env}
        proc = await asyncio.create_subprocess_exec(
            *cmd.argv,
            cwd=wd,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(
                proc.communicate(), timeout if timeout is not None else ctx.call_timeout(3600.0)
            )
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            raise
    outcome = _outcome(reward(wd))
    code = proc.returncode if proc.returncode is not None else -1
    return CliResult(code, out.decode(errors="replace"), err.decode(errors="replace"), wd, outcome)
