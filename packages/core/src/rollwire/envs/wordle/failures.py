"""How the Wordle agents end when something goes wrong: agent errors score, infrastructure fails.

The agents' contract: an error of the agent or the game (a bad tool argument, a parsing bug, the
turn limit) still ends in a reward (:data:`~rollwire.envs.wordle.reward.NO_VALID_GUESS`, with metric
``agent_error=1``), so the policy is trained on it. An infrastructure error (the gateway or the
model endpoint unreachable, a 401/429/5xx: ``openai.APIConnectionError`` or ``APIStatusError``,
however a framework wraps it) is raised, and RolloutApp records the rollout ``failed``: the policy
did nothing wrong, and training on an outage would teach it nothing.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from rollwire.envs.wordle.reward import NO_VALID_GUESS

__all__ = [
    "TurnLimitReached",
    "agent_error_result",
    "caused_by",
    "is_infrastructure_error",
    "scores_agent_errors",
]

log = logging.getLogger(__name__)


class TurnLimitReached(Exception):
    """Raised by an agent's turn counter to stop a policy that never stops; the game is scored."""


def caused_by(
    exc: BaseException, kind: type[BaseException] | tuple[type[BaseException], ...]
) -> bool:
    """True when ``exc`` or an exception it was raised from (``__cause__``/``__context__``) is
    a ``kind`` — frameworks wrap model errors in their own exception types."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def is_infrastructure_error(exc: BaseException) -> bool:
    """True for errors of the model endpoint, not of the agent: ``openai.APIConnectionError``
    (timeouts included) and ``openai.APIStatusError`` (the endpoint answered 4xx/5xx)."""
    try:
        import openai
    except ImportError:  # no OpenAI client, no OpenAI errors
        return False
    return caused_by(exc, (openai.APIConnectionError, openai.APIStatusError))


def agent_error_result(exc: BaseException, **metrics: float) -> dict[str, Any]:
    """The result of a game the agent broke off with an error of its own."""
    log.warning("wordle agent failed: %s: %s", type(exc).__name__, exc)
    return {"reward": NO_VALID_GUESS, "metrics": {**metrics, "agent_error": 1.0}}


def scores_agent_errors(
    play: Callable[[dict[str, Any]], dict[str, Any]],
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Wrap a Wordle agent's ``play(payload)`` with the contract above: an agent or game error
    becomes :func:`agent_error_result`, an infrastructure error is raised."""

    @functools.wraps(play)
    def wrapper(payload: dict[str, Any]) -> dict[str, Any]:
        try:
            return play(payload)
        except Exception as exc:
            if is_infrastructure_error(exc):
                raise  # not the policy's doing: RolloutApp records the rollout failed
            return agent_error_result(exc)

    return wrapper
