"""The Wordle agent written with Strands Agents: a real ``Agent`` with a ``@tool guess_word``.

Production code with two rollwire lines: ``app = RolloutApp(...)`` and
``rollwire_strands.model(payload, ...)``, which returns an ``OpenAIModel`` wired to the rollout
session, or the production model when the payload has no ``_rollwire`` key. Run it as a server
with ``python examples/wordle/agent_strands.py`` (port 8080, AgentCore's contract) or through
``rollwire demo --agent strands``. Like every Wordle agent: an agent or game error scores -1.5
(metric ``agent_error=1``); an infrastructure error is raised and the rollout recorded ``failed``
(:mod:`rollwire.envs.wordle.failures`).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from strands import Agent, tool
from strands.agent.conversation_manager import NullConversationManager
from strands.hooks import BeforeModelCallEvent

import rollwire_strands
from rollwire.agent.app import RolloutApp
from rollwire.envs.wordle.agent_openai import secret_of
from rollwire.envs.wordle.failures import (
    TurnLimitReached,
    caused_by,
    scores_agent_errors,
)
from rollwire.envs.wordle.game import SYSTEM_PROMPT, WordleGame, task_prompt
from rollwire.envs.wordle.reward import NO_VALID_GUESS, score_game

__all__ = ["app", "play"]

log = logging.getLogger(__name__)

#: Model calls per game at most: six guesses plus room for a few turns without a guess.
MAX_TURNS = 9

app = RolloutApp(failure_reward=NO_VALID_GUESS)


@app.rollout_entrypoint
@scores_agent_errors
def play(payload: dict[str, Any]) -> dict[str, Any]:
    """Play one game of Wordle with a Strands agent; returns ``{"reward", "metrics"}``."""
    return _play(payload)


def _play(payload: dict[str, Any]) -> dict[str, Any]:
    game = WordleGame(secret_of(payload))
    turns = 0

    @tool
    def guess_word(word: str) -> str:
        """Guess the secret five-letter word; returns per-letter feedback.

        Args:
            word: a five-letter English word
        """
        return game.guess(word).text

    def count_turns(event: BeforeModelCallEvent) -> None:
        nonlocal turns
        turns += 1
        if turns > MAX_TURNS:  # a policy that never stops calling tools still ends the game
            raise TurnLimitReached(f"no answer after {MAX_TURNS} model calls")

    model = rollwire_strands.model(
        payload,
        model_id=os.environ.get("WORDLE_MODEL", "gpt-4o-mini"),
        client_args={"max_retries": 2},
        params={"max_tokens": 512},
    )
    agent = Agent(
        model=model,
        tools=[guess_word],
        system_prompt=SYSTEM_PROMPT,
        # no printing, and no history trimming: a trimmed history breaks the prefix the
        # trainer merges turns on (one training row per game instead of several)
        callback_handler=None,
        conversation_manager=NullConversationManager(),
    )
    agent.hooks.add_callback(BeforeModelCallEvent, count_turns)
    try:
        agent(task_prompt(game.max_guesses))
    except Exception as exc:
        if not caused_by(exc, TurnLimitReached):
            raise
        log.info("wordle strands agent stopped at the turn limit")  # the game so far is scored
    score = score_game(game)
    return {"reward": score.reward, "metrics": {**score.metrics(), "turns": float(turns)}}


if __name__ == "__main__":
    app.run()
