"""The Wordle agent written with LangChain/LangGraph: ``create_agent(model, tools, system_prompt)``.

Production code with two rollwire lines: ``app = RolloutApp(...)`` and the langgraph adapter's
``model(payload, ...)`` (``rollwire_langgraph.chat_model`` in your own code), which returns a
``ChatOpenAI`` wired to the rollout session, or the production model when the payload has no
``_rollwire`` key. It ships in core so ``rollwire demo --agent langgraph`` runs from any directory
once ``rollwire[langgraph]`` is installed: LangChain is imported when a game starts, and the
adapter is found through rollwire's plugin registry (core never imports an adapter). Like every
Wordle agent: an agent or game error scores -1.5 (metric ``agent_error=1``); an infrastructure
error (or a missing framework) is raised and the rollout recorded ``failed`` (:mod:`.failures`).
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

from rollwire.agent.app import RolloutApp
from rollwire.envs.wordle.agent_openai import secret_of
from rollwire.envs.wordle.failures import scores_agent_errors
from rollwire.envs.wordle.game import SYSTEM_PROMPT, WordleGame, task_prompt
from rollwire.envs.wordle.reward import NO_VALID_GUESS, score_game

__all__ = ["MAX_TURNS", "app", "play"]

log = logging.getLogger(__name__)

#: Model calls per game at most: six guesses plus room for a few turns without a guess.
MAX_TURNS = 9

app = RolloutApp(failure_reward=NO_VALID_GUESS)


@functools.cache
def _adapter() -> Any:
    """The ``langgraph`` agent adapter; a PluginError naming ``rollwire[langgraph]`` when absent."""
    from rollwire.plugins import load_agent

    return load_agent("langgraph")


@app.rollout_entrypoint
def play(payload: dict[str, Any]) -> dict[str, Any]:
    """Play one game of Wordle with a LangChain agent; returns ``{"reward", "metrics"}``."""
    _adapter()  # a missing framework fails the rollout: it is not the policy's doing
    return _scored_play(payload)


@scores_agent_errors
def _scored_play(payload: dict[str, Any]) -> dict[str, Any]:
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from langgraph.errors import GraphRecursionError

    game = WordleGame(secret_of(payload))

    @tool
    def guess_word(word: str) -> str:
        """Guess the secret five-letter word; returns per-letter feedback.

        Args:
            word: a five-letter English word
        """
        return game.guess(word).text

    model = _adapter().model(
        payload,
        model=os.environ.get("WORDLE_MODEL", "gpt-4o-mini"),
        max_tokens=512,
        streaming=os.environ.get("WORDLE_STREAM", "1") == "1",
    )
    agent = create_agent(model, tools=[guess_word], system_prompt=SYSTEM_PROMPT)
    turns = 0
    try:
        # one model node and one tool node per turn
        for update in agent.stream(
            {"messages": [{"role": "user", "content": task_prompt(game.max_guesses)}]},
            config={"recursion_limit": 2 * MAX_TURNS + 1},
            stream_mode="updates",
        ):
            turns += sum(1 for node in update if node == "model")
    except GraphRecursionError:  # the turn limit: the game so far is scored
        log.info("wordle langgraph agent stopped at the turn limit")
    score = score_game(game)
    return {"reward": score.reward, "metrics": {**score.metrics(), "turns": float(turns)}}
