"""The Wordle agent written with Strands Agents: a real ``Agent`` with a ``@tool guess_word``.

Production code with two rollwire lines: ``app = RolloutApp(...)`` and the strands adapter's
``model(payload, ...)`` (``rollwire_strands.model`` in your own code), which returns an
``OpenAIModel`` wired to the rollout session, or the production model when the payload has no
``_rollwire`` key. It ships in core so ``rollwire demo --agent strands`` runs from any directory
once ``rollwire[strands]`` is installed: Strands is imported when a game starts, and the adapter is
found through rollwire's plugin registry (core never imports an adapter). Like every Wordle agent:
an agent or game error scores -1.5 (metric ``agent_error=1``); an infrastructure error (or a
missing framework) is raised and the rollout recorded ``failed`` (:mod:`.failures`).
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

from rollwire.agent.app import RolloutApp
from rollwire.envs.wordle.agent_openai import secret_of
from rollwire.envs.wordle.failures import TurnLimitReached, caused_by, scores_agent_errors
from rollwire.envs.wordle.game import SYSTEM_PROMPT, WordleGame, task_prompt
from rollwire.envs.wordle.reward import NO_VALID_GUESS, score_game

__all__ = ["MAX_TURNS", "app", "play"]

log = logging.getLogger(__name__)

#: Model calls per game at most: six guesses plus room for a few turns without a guess.
MAX_TURNS = 9

app = RolloutApp(failure_reward=NO_VALID_GUESS)


@functools.cache
def _adapter() -> Any:
    """The ``strands`` agent adapter; a PluginError naming ``rollwire[strands]`` when absent."""
    from rollwire.plugins import load_agent

    return load_agent("strands")


@app.rollout_entrypoint
def play(payload: dict[str, Any]) -> dict[str, Any]:
    """Play one game of Wordle with a Strands agent; returns ``{"reward", "metrics"}``."""
    _adapter()  # a missing framework fails the rollout: it is not the policy's doing
    return _scored_play(payload)


@scores_agent_errors
def _scored_play(payload: dict[str, Any]) -> dict[str, Any]:
    from strands import Agent, tool
    from strands.agent.conversation_manager import NullConversationManager
    from strands.hooks import BeforeModelCallEvent

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

    model = _adapter().model(
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
