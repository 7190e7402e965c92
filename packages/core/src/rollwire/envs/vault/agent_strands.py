"""The vault agent written with Strands: ``Agent(model, tools, system_prompt)`` with the same two
tools as the LangGraph agent (:mod:`rollwire.envs.vault.agent_langgraph`), which Strands sends as
the same OpenAI ``tools`` (names, descriptions and schemas equal to
:data:`~rollwire.envs.vault.game.TOOLS`, so the task's warm-up teaches this agent too).

Production code with two rollwire lines: ``app = RolloutApp(...)`` and the strands adapter's
``model(payload, ...)`` (``rollwire_strands.model`` in your own code), an ``OpenAIModel`` wired to
the rollout session, or the production model when the payload has no ``_rollwire`` key. Strands
streams, so the server parses the tool calls out of a stream. Opening the box ends the episode
(``agent.cancel(after_current_tools=True)``, the cooperative stop), and a hook stops an agent
that keeps calling the model past :data:`MAX_TURNS`. An answer cut at ``max_tokens`` (Strands
raises ``MaxTokensReachedException``) ends the episode too, with its outcome, so the loop trains
on it rather than dropping a failed rollout. The reward is the outcome only. Run it with
``rollwire train --task vault --agent rollwire.envs.vault.agent_strands:app``."""

from __future__ import annotations

import functools
import os
from typing import Any

from rollwire.agent.app import RolloutApp
from rollwire.envs.vault.game import SYSTEM_PROMPT, Vault, task_prompt

__all__ = ["MAX_TURNS", "app", "play"]

#: model calls per episode at most, as the LangGraph agent
MAX_TURNS = 4

app = RolloutApp(failure_reward=0.0)


@functools.cache
def _adapter() -> Any:
    """The ``strands`` agent adapter; a PluginError naming ``rollwire[strands]`` when absent."""
    from rollwire.plugins import load_agent

    return load_agent("strands")


@app.rollout_entrypoint
def play(payload: dict[str, Any]) -> dict[str, Any]:
    """One vault episode with a Strands agent: ``{"reward", "metrics"}``."""
    from strands import Agent, tool
    from strands.agent.conversation_manager import NullConversationManager
    from strands.hooks import AfterModelCallEvent
    from strands.types.exceptions import MaxTokensReachedException

    vault = Vault(str(payload["box"]), int(payload["code"]))
    turns = 0
    agent: Any = None

    @tool
    def read_code(box: str) -> str:
        """Read the code of a locked box.

        Args:
            box: the box's letter
        """
        return vault.read_code(box)

    @tool
    def open_box(box: str, code: str) -> str:
        """Open a locked box with its code.

        Args:
            box: the box's letter
            code: the box's code
        """
        agent.cancel(after_current_tools=True)  # opening ends the episode
        return vault.open_box(box, code)

    def count(event: AfterModelCallEvent) -> None:
        nonlocal turns
        turns += 1
        if turns >= MAX_TURNS:
            event.agent.cancel(after_current_tools=True)

    model = _adapter().model(
        payload,
        model_id=os.environ.get("VAULT_MODEL", "gpt-4o-mini"),
        params={"max_tokens": 64},
    )
    agent = Agent(
        model=model,
        tools=[read_code, open_box],
        system_prompt=SYSTEM_PROMPT,
        callback_handler=None,
        conversation_manager=NullConversationManager(),  # the history whole: one training row
    )
    agent.hooks.add_callback(AfterModelCallEvent, count)
    truncated = 0.0
    try:
        agent(payload.get("prompt") or task_prompt(vault.box))
    except MaxTokensReachedException:
        # the model ran out of tokens mid-answer (a tool call's arguments repeated until the
        # limit, say): the episode ends there, an outcome like any other, and trains as one
        truncated = 1.0
    metrics = {**vault.metrics(), "turns": float(turns), "truncated": truncated}
    return {"reward": vault.reward(), "metrics": metrics}
