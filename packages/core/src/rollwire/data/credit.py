"""Step-level credit: a rollout's per-turn rewards as per-token advantages (issue 25.5).

The gateway lays a per-turn reward list onto the calls (``ModelCall.step_reward``,
:func:`rollwire.data.rewards.attach_step_rewards`). With turns ``t = 0..T-1`` (the rollout's
trainable calls in call order) and rewards ``r_t`` (a turn without one counts 0):

- ``broadcast``: every sampled token of turn ``t`` gets ``r_t``;
- ``discounted``: every sampled token of turn ``t`` gets the return
  ``G_t = r_t + gamma * G_{t+1}`` (``G_T = 0``), i.e. ``sum_{k >= t} gamma^(k-t) r_k``.

Turns run across rows: a rollout that forked still discounts over all of its turns. Tokens with
loss mask 0 (context, non-trainable calls) get 0. A rollout none of whose calls has a step reward
has no step credit (``None``), so every export behaves exactly as without this module.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from rollwire.data.protocol import ModelCall, Rollout

__all__ = ["CreditMode", "StepCredit", "step_values", "token_advantages"]

CreditMode = Literal["broadcast", "discounted"]


@dataclass(frozen=True)
class StepCredit:
    """How per-turn rewards become per-token advantages (see the module docstring)."""

    mode: CreditMode = "broadcast"
    gamma: float = 1.0

    def __post_init__(self) -> None:
        if self.mode not in ("broadcast", "discounted"):
            raise ValueError(
                f"unknown step credit mode {self.mode!r}: use 'broadcast' or 'discounted'"
            )
        if not (math.isfinite(self.gamma) and 0.0 <= self.gamma <= 1.0):
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma!r}")


def as_credit(credit: StepCredit | CreditMode | None) -> StepCredit | None:
    """``credit`` as a :class:`StepCredit` (a bare mode name means ``gamma=1``)."""
    if credit is None or isinstance(credit, StepCredit):
        return credit
    return StepCredit(mode=credit)


def _turns(calls: Sequence[ModelCall]) -> list[ModelCall]:
    # the same turn order as attach_step_rewards: trainable calls by index
    return sorted((c for c in calls if c.trainable), key=lambda c: c.index)


def step_values(rollout: Rollout, credit: StepCredit) -> dict[str, float] | None:
    """Each turn's credit by call id (``r_t`` or ``G_t``), or None when no call has a step
    reward. Raises ValueError for a step reward that is not finite."""
    turns = _turns(rollout.calls)
    if all(c.step_reward is None for c in turns):
        return None
    rewards = []
    for c in turns:
        r = 0.0 if c.step_reward is None else float(c.step_reward)
        if not math.isfinite(r):
            raise ValueError(
                f"call {c.call_id} of rollout {rollout.rollout_id!r} has step reward {r!r}; "
                "step rewards must be finite numbers"
            )
        rewards.append(r)
    values = list(rewards)
    if credit.mode == "discounted":
        g = 0.0
        for t in range(len(rewards) - 1, -1, -1):
            g = rewards[t] + credit.gamma * g
            values[t] = g
    return {c.call_id: v for c, v in zip(turns, values)}


def token_advantages(
    turn_ids: np.ndarray,
    loss_mask: np.ndarray,
    value_of_turn: dict[int, float],
) -> np.ndarray:
    """Per-response-token advantages: ``value_of_turn[turn_ids[j]]`` where the mask is 1, else 0
    (context tokens, turn id -1, and masked calls get 0)."""
    out = np.zeros(turn_ids.shape[0], dtype=np.float32)
    for turn, value in value_of_turn.items():
        out[turn_ids == turn] = value
    out[loss_mask == 0] = 0.0
    return out
