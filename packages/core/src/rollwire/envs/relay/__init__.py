"""Relay, the two-role task of ``rollwire train --roles planner,executor``: a planner copies a
secret into a note, an executor acts on the note (:mod:`rollwire.envs.relay.game`); the agent
is ``rollwire.envs.relay.agent_openai:app``; :func:`measure_roles` measures each role on its own
(:mod:`rollwire.envs.relay.measure`)."""

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
from rollwire.envs.relay.measure import MEASURES, ROLE_MEASURES, measure_roles

#: the agent ``rollwire train --task relay`` runs; its calls ask for the models in ``ROLES``
AGENT = "rollwire.envs.relay.agent_openai:app"

__all__ = [
    "AGENT",
    "MEASURES",
    "ROLES",
    "ROLE_MEASURES",
    "SPLITS",
    "action_of",
    "executor_prompt",
    "make_tasks",
    "measure_roles",
    "note_of",
    "planner_prompt",
    "warmup_conversations",
]
