"""Lockbox, the task the embedded model learns in ``rollwire train``: read a code from the
environment, then say it (:mod:`rollwire.envs.lockbox.game`); the agent is
``rollwire.envs.lockbox.agent_openai:app``."""

from rollwire.envs.lockbox.game import (
    ACTION,
    SPLITS,
    answer_of,
    make_tasks,
    observation,
    score,
    task_prompt,
    warmup_conversations,
)

#: the agent ``rollwire train --task lockbox`` runs (it asks for its own ``max_tokens``)
AGENT = "rollwire.envs.lockbox.agent_openai:app"

__all__ = [
    "ACTION",
    "AGENT",
    "SPLITS",
    "answer_of",
    "make_tasks",
    "observation",
    "score",
    "task_prompt",
    "warmup_conversations",
]
