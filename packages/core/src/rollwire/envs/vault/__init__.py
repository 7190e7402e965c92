"""Vault, a tool-calling task with real OpenAI ``tools``: read a box's code with one tool, open
the box with it with another (:mod:`rollwire.envs.vault.game`); the agent is written with
LangGraph, ``rollwire.envs.vault.agent_langgraph:app`` (``rollwire[langgraph]``), and again with
Strands, ``rollwire.envs.vault.agent_strands:app`` (``rollwire[strands]``, ``--agent``)."""

from rollwire.envs.vault.game import (
    SPLITS,
    SYSTEM_PROMPT,
    TOOLS,
    Vault,
    make_tasks,
    task_prompt,
    teacher_conversation,
    warmup_conversations,
)

#: the agent ``rollwire train --task vault`` runs (it asks for its own ``max_tokens``)
AGENT = "rollwire.envs.vault.agent_langgraph:app"

__all__ = [
    "AGENT",
    "SPLITS",
    "SYSTEM_PROMPT",
    "TOOLS",
    "Vault",
    "make_tasks",
    "task_prompt",
    "teacher_conversation",
    "warmup_conversations",
]
