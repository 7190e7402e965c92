"""The vault agent written with LangChain/LangGraph: ``create_agent(model, tools, system_prompt)``
with two ``@tool`` functions; ``open_box`` returns directly, so opening ends the episode.

Production code with two rollwire lines: ``app = RolloutApp(...)`` and the langgraph adapter's
``model(payload, ...)`` (``rollwire_langgraph.chat_model`` in your own code), which returns a
``ChatOpenAI`` wired to the rollout session, or the production model when the payload has no
``_rollwire`` key. The tools go to the server as OpenAI ``tools``; the server's parser turns the
model's output into ``tool_calls``, which LangGraph runs. The reward is the outcome only
(:class:`~rollwire.envs.vault.game.Vault`). An infrastructure error (the model endpoint
unreachable, 4xx/5xx) or a missing framework is raised, so the rollout is recorded ``failed``.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

from rollwire.agent.app import RolloutApp
from rollwire.envs.vault.game import SYSTEM_PROMPT, Vault, task_prompt

__all__ = ["MAX_TURNS", "app", "play"]

log = logging.getLogger(__name__)

#: model calls per episode at most: two are needed, two more are allowed
MAX_TURNS = 4

app = RolloutApp(failure_reward=0.0)


@functools.cache
def _adapter() -> Any:
    """The ``langgraph`` agent adapter; a PluginError naming ``rollwire[langgraph]`` when absent."""
    from rollwire.plugins import load_agent

    return load_agent("langgraph")


@app.rollout_entrypoint
def play(payload: dict[str, Any]) -> dict[str, Any]:
    """One vault episode with a LangGraph agent: ``{"reward", "metrics"}``."""
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langgraph.errors import GraphRecursionError

    vault = Vault(str(payload["box"]), int(payload["code"]))

    @tool(parse_docstring=True)
    def read_code(box: str) -> str:
        """Read the code of a locked box.

        Args:
            box: the box's letter
        """
        return vault.read_code(box)

    @tool(return_direct=True, parse_docstring=True)
    def open_box(box: str, code: str) -> str:
        """Open a locked box with its code.

        Args:
            box: the box's letter
            code: the box's code
        """
        return vault.open_box(box, code)

    model = _adapter().model(
        payload,
        model=os.environ.get("VAULT_MODEL", "gpt-4o-mini"),
        max_tokens=64,
        streaming=os.environ.get("VAULT_STREAM", "0") == "1",
    )
    agent = create_agent(model, tools=[read_code, open_box], system_prompt=SYSTEM_PROMPT)
    prompt = payload.get("prompt") or task_prompt(vault.box)
    turns = 0
    try:
        for update in agent.stream(
            {"messages": [{"role": "user", "content": prompt}]},
            config={"recursion_limit": 2 * MAX_TURNS + 1},
            stream_mode="updates",
        ):
            turns += sum(1 for node in update if node == "model")
    except GraphRecursionError:  # the turn limit: the episode so far is scored
        log.info("vault agent stopped at the turn limit")
    return {"reward": vault.reward(), "metrics": {**vault.metrics(), "turns": float(turns)}}
