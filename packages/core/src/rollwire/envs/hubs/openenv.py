"""An OpenEnv environment as a rollwire task: ``rollwire.envs.hubs.openenv:app``.

Each task names a running OpenEnv server and how to reset it::

    {"env_url": "http://127.0.0.1:8001", "reset": {"box": "C", "code": 482},
     "prompt": "Open box C.", "system": "You open locked boxes. Use the tools."}

One rollout is one episode over the server's WebSocket session (``openenv-core``'s
``MCPToolClient``): ``reset(episode_id=<rollwire session id>, **reset)``, the server's MCP tools
offered to the policy as OpenAI ``tools``, and each tool call the policy makes sent as a
``CallToolAction`` step. The policy is called through the rollout session (the OpenAI client of
:func:`rollwire.agent.context.async_openai_client`), so every call is captured. Each step's
``reward`` is summed per model call into ``step_reward/<turn>``; the rollout's reward is the
episode's return (their sum). The episode ends when a step says ``done``, when the policy answers
without a tool call, or after ``max_turns`` model calls (default 4).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from rollwire.agent.app import RolloutApp
from rollwire.agent.context import async_openai_client, rollout_context, rollout_create_kwargs
from rollwire.envs.hubs.episode import episode_result, import_framework, task_field

__all__ = ["Episode", "app", "openai_tool", "play", "result_text"]

#: the package to install for this environment standard
REQUIREMENT = "openenv-core>=0.3"

app = RolloutApp(failure_reward=0.0)


@dataclass
class Episode:
    """One task's settings, read from its fields."""

    env_url: str
    prompt: str
    system: str | None = None
    reset: dict[str, Any] = field(default_factory=dict)
    max_turns: int = 4
    max_tokens: int = 64

    @classmethod
    def from_task(cls, task: dict[str, Any]) -> Episode:
        """The settings of ``task`` (``env_url`` may come from ``ROLLWIRE_OPENENV_URL``)."""
        reset = task.get("reset") or {}
        if not isinstance(reset, dict):
            raise ValueError(
                f"the task's 'reset' must be an object of reset() arguments: {reset!r}"
            )
        return cls(
            env_url=str(task_field(task, "env_url", "ROLLWIRE_OPENENV_URL")),
            prompt=str(task_field(task, "prompt")),
            system=task.get("system"),
            reset=dict(reset),
            max_turns=int(task.get("max_turns") or 4),
            max_tokens=int(task.get("max_tokens") or 64),
        )


def openai_tool(tool: Any) -> dict[str, Any]:
    """An MCP tool (OpenEnv's ``Tool``: name, description, input schema) as an OpenAI tool."""
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description or "",
            "parameters": tool.input_schema or {"type": "object", "properties": {}},
        },
    }


def result_text(observation: Any) -> str:
    """What a tool step's observation tells the policy: the tool's text, or its error."""
    error = getattr(observation, "error", None)
    if error is not None:
        return f"error: {getattr(error, 'message', error)}"
    result = getattr(observation, "result", None)
    if isinstance(result, dict):
        if result.get("data") is not None:
            return str(result["data"])
        parts = [c.get("text", "") for c in result.get("content") or [] if isinstance(c, dict)]
        if parts:
            return "".join(parts)
    return "" if result is None else str(result)


def _assistant(message: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": c.function.arguments},
            }
            for c in message.tool_calls
        ]
    return out


async def _turn(env: Any, calls: list[Any], messages: list[dict[str, Any]]) -> tuple[float, bool]:
    """Run one model call's tool calls as steps: ``(reward of the steps, done)``."""
    types = import_framework("openenv.core.env_server.mcp_types", REQUIREMENT)
    reward, done = 0.0, False
    for call in calls:
        try:
            arguments = json.loads(call.function.arguments or "{}")
        except json.JSONDecodeError as exc:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": f"error: {exc}"})
            continue
        action = types.CallToolAction(tool_name=call.function.name, arguments=arguments)
        step = await env.step(action)
        reward += float(step.reward or 0.0)
        messages.append(
            {"role": "tool", "tool_call_id": call.id, "content": result_text(step.observation)}
        )
        if step.done:
            return reward, True
    return reward, done


@app.rollout_entrypoint
async def play(payload: dict[str, Any]) -> dict[str, Any]:
    """One OpenEnv episode: ``{"reward", "metrics": {"turns", "done", "step_reward/<i>"...}}``."""
    mcp_client = import_framework("openenv.core.mcp_client", REQUIREMENT)
    episode = Episode.from_task(payload)
    ctx = rollout_context(payload)
    episode_id = ctx.session_id if ctx is not None else payload.get("task_id")
    create = rollout_create_kwargs(
        payload,
        model=os.environ.get("OPENENV_MODEL", "gpt-4o-mini"),
        max_tokens=episode.max_tokens,
    )
    messages: list[dict[str, Any]] = []
    if episode.system:
        messages.append({"role": "system", "content": episode.system})
    messages.append({"role": "user", "content": episode.prompt})
    steps: list[float] = []
    done = False
    client = async_openai_client(payload)
    try:
        async with mcp_client.MCPToolClient(base_url=episode.env_url) as env:
            await env.reset(episode_id=episode_id, **episode.reset)
            tools = [openai_tool(t) for t in await env.list_tools()]
            while len(steps) < episode.max_turns and not done:
                answer = await client.chat.completions.create(
                    messages=messages,  # type: ignore[arg-type]
                    tools=tools,  # type: ignore[arg-type]
                    **create,
                )
                message = answer.choices[0].message
                messages.append(_assistant(message))
                if not message.tool_calls:
                    steps.append(0.0)
                    break
                reward, done = await _turn(env, list(message.tool_calls), messages)
                steps.append(reward)
    finally:
        await client.close()
    metrics = {"turns": float(len(steps)), "done": float(done)}
    return episode_result(sum(steps), metrics, steps)
