"""Wordle, the demo environment: the game, its reward, a word list with a train/validation split,
a scripted solver for the embedded engine, and an agent written with the plain OpenAI client
(``rollwire.envs.wordle.agent_openai``). ``examples/wordle`` in the repository builds on this package.
"""

from rollwire.envs.wordle.game import (
    GUESS_TOOL,
    MAX_GUESSES,
    SYSTEM_PROMPT,
    GuessResult,
    Knowledge,
    WordleGame,
    consistent,
    feedback,
    parse_feedback_text,
    task_prompt,
)
from rollwire.envs.wordle.reward import WordleScore, outcome_reward, score_game, shaping_score
from rollwire.envs.wordle.solver import WordleSolver, tool_call_text
from rollwire.envs.wordle.words import all_words, split_words

__all__ = [
    "GUESS_TOOL",
    "MAX_GUESSES",
    "SYSTEM_PROMPT",
    "GuessResult",
    "Knowledge",
    "WordleGame",
    "WordleScore",
    "WordleSolver",
    "all_words",
    "consistent",
    "feedback",
    "make_tasks",
    "outcome_reward",
    "parse_feedback_text",
    "score_game",
    "shaping_score",
    "split_words",
    "task_prompt",
    "tool_call_text",
]


def make_tasks(n: int, split: str = "train", seed: int = 0) -> list[dict[str, object]]:
    """``n`` Wordle tasks ``{"task_id", "secret"}`` drawn without replacement (cycling if needed)."""
    import random

    words = list(split_words(split))  # type: ignore[arg-type]
    random.Random(seed).shuffle(words)
    return [{"task_id": f"wordle-{split}-{i}", "secret": words[i % len(words)]} for i in range(n)]
