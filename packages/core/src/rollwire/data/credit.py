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

__all__ = [
    "CreditMode",
    "CreditSpec",
    "StepCredit",
    "as_credit",
    "parse_credit",
    "step_rewards",
    "step_values",
    "token_advantages",
    "token_step_rewards",
]

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


#: a :class:`StepCredit` or its text form (``"broadcast"``, ``"discounted"``, ``"discounted:0.9"``)
CreditSpec = StepCredit | str


def as_credit(credit: CreditSpec | None) -> StepCredit | None:
    """``credit`` as a :class:`StepCredit` (text as :func:`parse_credit` reads it)."""
    if credit is None or isinstance(credit, StepCredit):
        return credit
    return parse_credit(credit)


def parse_credit(spec: str | None) -> StepCredit | None:
    """``"broadcast"``, ``"discounted"`` or ``"discounted:GAMMA"`` (a setting's text) as a
    :class:`StepCredit`; empty or None: no step credit."""
    if spec is None or not spec.strip():
        return None
    mode, _, gamma = spec.strip().partition(":")
    try:
        value = float(gamma) if gamma else 1.0
    except ValueError:
        raise ValueError(f"step credit {spec!r}: gamma {gamma!r} is not a number") from None
    return StepCredit(mode=mode, gamma=value)  # type: ignore[arg-type]


def _turns(calls: Sequence[ModelCall]) -> list[ModelCall]:
    # the same turn order as attach_step_rewards: trainable calls by index
    return sorted((c for c in calls if c.trainable), key=lambda c: c.index)


def step_rewards(rollout: Rollout) -> dict[str, float] | None:
    """Each turn's step reward ``r_t`` by call id (0 for a turn without one), or None when no
    call has a step reward. Raises ValueError for a step reward that is not finite."""
    turns = _turns(rollout.calls)
    if all(c.step_reward is None for c in turns):
        return None
    out: dict[str, float] = {}
    for c in turns:
        r = 0.0 if c.step_reward is None else float(c.step_reward)
        if not math.isfinite(r):
            raise ValueError(
                f"call {c.call_id} of rollout {rollout.rollout_id!r} has step reward {r!r}; "
                "step rewards must be finite numbers"
            )
        out[c.call_id] = r
    return out


def step_values(rollout: Rollout, credit: StepCredit) -> dict[str, float] | None:
    """Each turn's credit by call id (``r_t`` or ``G_t``), or None when no call has a step
    reward (see :func:`step_rewards`)."""
    rewards = step_rewards(rollout)
    if rewards is None or credit.mode == "broadcast":
        return rewards
    ids = list(rewards)
    values: dict[str, float] = {}
    g = 0.0
    for call_id in reversed(ids):
        g = rewards[call_id] + credit.gamma * g
        values[call_id] = g
    return {call_id: values[call_id] for call_id in ids}


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


def token_step_rewards(
    turn_ids: np.ndarray, loss_mask: np.ndarray, reward_of_turn: dict[int, float]
) -> np.ndarray:
    """Per-response-token rewards: each turn's reward on its last mask-1 token, 0 elsewhere
    (the token-level scores a per-token estimator such as GAE discounts itself)."""
    out = np.zeros(turn_ids.shape[0], dtype=np.float32)
    for turn, reward in reward_of_turn.items():
        at = np.flatnonzero((turn_ids == turn) & (loss_mask == 1))
        if at.size:
            out[at[-1]] = reward
    return out
