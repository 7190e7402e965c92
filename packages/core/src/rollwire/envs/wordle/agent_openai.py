"""The Wordle agent, written with the plain OpenAI client: a tools loop around ``guess_word``.

Production code with two rollwire lines: ``app = RolloutApp(...)`` and ``openai_client(payload)``
(which points the client at the rollout session, or at production when the payload has no
``_rollwire`` key). The agent keeps the game, so it computes its own reward. An error of the
agent or the game still returns a reward (-1.5, metric ``agent_error=1``); an infrastructure error
(the model endpoint unreachable, 401/429/5xx) is raised, so the rollout is recorded ``failed``
instead of training the policy on an outage (see :mod:`rollwire.envs.wordle.failures`). A guess
written as text instead of a tool call is played, with a small penalty
(:mod:`rollwire.envs.wordle.text_guess`).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from rollwire.agent.app import RolloutApp
from rollwire.agent.context import openai_client, rollout_create_kwargs
from rollwire.envs.wordle.failures import scores_agent_errors
from rollwire.envs.wordle.game import GUESS_TOOL, SYSTEM_PROMPT, WordleGame, task_prompt
from rollwire.envs.wordle.reward import NO_VALID_GUESS, score_game
from rollwire.envs.wordle.text_guess import TEXT_GUESS_PENALTY, parse_text_guess

__all__ = ["app", "play", "secret_of"]

log = logging.getLogger(__name__)

#: Model calls per game at most: six guesses plus room for a few turns without a tool call.
MAX_TURNS = 9
#: Consecutive answers without a tool call after which the agent gives up.
MAX_IDLE_TURNS = 2
TOOL_REMINDER = "Call the guess_word tool with your next five-letter guess."

app = RolloutApp(failure_reward=NO_VALID_GUESS)


def secret_of(payload: dict[str, Any]) -> str:
    """The secret word of a task (``secret``, or ``answer`` as in many datasets)."""
    secret = payload.get("secret") or payload.get("answer")
    if not isinstance(secret, str):
        raise ValueError(f"a Wordle task needs a 'secret' word, got keys {sorted(payload)}")
    return secret


@app.rollout_entrypoint
@scores_agent_errors
def play(payload: dict[str, Any]) -> dict[str, Any]:
    """Play one game of Wordle; returns ``{"reward", "metrics"}``."""
    return _play(payload)


def _play(payload: dict[str, Any]) -> dict[str, Any]:
    game = WordleGame(secret_of(payload))
    client = openai_client(payload, max_retries=2)
    # the session's model and sampling in a rollout; production's settings otherwise
    create = rollout_create_kwargs(payload, model=os.environ.get("WORDLE_MODEL", "gpt-4o-mini"))
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task_prompt(game.max_guesses)},
    ]
    turns = idle = text_guesses = 0
    try:
        while not game.over and turns < MAX_TURNS and idle < MAX_IDLE_TURNS:
            turns += 1
            resp = client.chat.completions.create(
                messages=messages,  # type: ignore[arg-type]
                tools=[GUESS_TOOL],  # type: ignore[list-item]
                **create,
            )
            msg = resp.choices[0].message
            assistant: dict[str, Any] = {"role": "assistant", "content": msg.content}
            if msg.tool_calls:
                assistant["tool_calls"] = [
                    {
                        "id": tc.id,
                        "type": "function",
                        "function": {"name": tc.function.name, "arguments": tc.function.arguments},
                    }
                    for tc in msg.tool_calls
                    if tc.type == "function"
                ]
            messages.append(assistant)
            if not msg.tool_calls and (word := parse_text_guess(msg.content)) is not None:
                text_guesses += 1  # a guess written as text: played, with a small penalty
                idle = 0
                feedback = game.guess(word).text
                messages.append({"role": "user", "content": f"{feedback}\n{TOOL_REMINDER}"})
                continue
            if not msg.tool_calls:
                idle += 1
                messages.append(
                    {
                        "role": "user",
                        "content": TOOL_REMINDER,
                    }
                )
                continue
            idle = 0
            for call in assistant["tool_calls"]:
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": call["id"],
                        "content": _run_tool(game, call["function"]),
                    }
                )
    finally:
        client.close()
    score = score_game(game)
    reward = score.reward - TEXT_GUESS_PENALTY * text_guesses if game.history else score.reward
    metrics = {**score.metrics(), "turns": float(turns), "text_guesses": float(text_guesses)}
    return {"reward": reward, "metrics": metrics}


def _run_tool(game: WordleGame, function: dict[str, Any]) -> str:
    if function.get("name") != "guess_word":
        game.invalid += 1
        return f"Unknown tool {function.get('name')!r}: the only tool is guess_word."
    try:
        args = json.loads(function.get("arguments") or "{}")
    except ValueError:
        args = None
    if not isinstance(args, dict):
        game.invalid += 1
        return 'The arguments must be a JSON object like {"word": "crane"}.'
    return game.guess(args.get("word")).text
