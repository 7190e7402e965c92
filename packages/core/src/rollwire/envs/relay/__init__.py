"""Relay, the two-role task of ``rollwire train --roles planner,executor``: a planner copies a
secret into a note, an executor acts on the note (:mod:`rollwire.envs.relay.game`); the agent
is ``rollwire.envs.relay.agent_openai:app``."""

from rollwire.envs.relay.game import (
    ROLES,
    SPLITS,
    action_of,
    executor_prompt,
    make_tasks,
    note_of,
    planner_prompt,
    warmup_conversations,
)

#: the agent ``rollwire train --task relay`` runs; its calls ask for the models in ``ROLES``
AGENT = "rollwire.envs.relay.agent_openai:app"

__all__ = [
    "AGENT",
    "ROLES",
    "SPLITS",
    "action_of",
    "executor_prompt",
    "make_tasks",
    "note_of",
    "planner_prompt",
    "warmup_conversations",
]
