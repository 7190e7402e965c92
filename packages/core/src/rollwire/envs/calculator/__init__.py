"""Calculator, the multi-turn tool task of the SmolLM2 learning benchmark: a two-digit sum or
product, a calculator the policy types into, a final answer
(:mod:`rollwire.envs.calculator.game`); the agent is
``rollwire.envs.calculator.agent_openai:app``."""

from rollwire.envs.calculator.game import (
    OPERATORS,
    SPLITS,
    answer_of,
    calculate,
    make_tasks,
    observation,
    score,
    split_of,
    task_prompt,
    warmup_conversations,
)

#: the agent ``rollwire train --task calculator`` runs (it asks for its own ``max_tokens``)
AGENT = "rollwire.envs.calculator.agent_openai:app"

__all__ = [
    "AGENT",
    "OPERATORS",
    "SPLITS",
    "answer_of",
    "calculate",
    "make_tasks",
    "observation",
    "score",
    "split_of",
    "task_prompt",
    "warmup_conversations",
]
