"""A handler's result in another framework's shape, read as ``(reward, metrics)`` for RolloutApp."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rollwire.agent.handlers import InvalidReward
from rollwire.data.foreign import REWARD_KEYS, ListReward, read_result

__all__ = ["AgentReportedError", "reward_of"]


class AgentReportedError(RuntimeError):
    """The agent returned its framework's error result (``{"status": "error"}``)."""


def reward_of(
    result: Any, *, keys: Sequence[str] = REWARD_KEYS, list_reward: ListReward = "last"
) -> tuple[float, dict[str, float]]:
    """``(reward, metrics)``; an error result fails the rollout, a missing reward is invalid."""
    try:
        read = read_result(result, keys=keys, list_reward=list_reward)
    except ValueError as exc:
        raise InvalidReward(str(exc)) from exc
    if read.status == "failed" or read.reward is None:
        raise AgentReportedError(read.error or "the agent reported a failure")
    return read.reward, read.metrics
