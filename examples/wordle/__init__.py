"""Wordle as an RL environment for LLM agents (the ``rollwire demo`` task).

The game, reward, word lists and solver live in core (``rollwire.envs.wordle``) so that ``rollwire
demo`` runs from an installed wheel; this folder holds the agents, one per framework:
``agent_openai.py`` (plain OpenAI client), ``agent_strands.py``, ``agent_langgraph.py``.
"""

from rollwire.envs.wordle import (
    GUESS_TOOL,
    SYSTEM_PROMPT,
    WordleGame,
    WordleScore,
    WordleSolver,
    feedback,
    make_tasks,
    score_game,
    split_words,
)

__all__ = [
    "GUESS_TOOL",
    "SYSTEM_PROMPT",
    "WordleGame",
    "WordleScore",
    "WordleSolver",
    "feedback",
    "make_tasks",
    "score_game",
    "split_words",
]
