"""slime's reward post-process hook, with statistics over rollouts instead of rows.

slime calls ``fn(args, samples) -> (raw_rewards, rewards)`` (``--custom-reward-post-process-path``)
with the flat list of samples. Its default group normalisation reshapes the rewards to
``[-1, n_samples_per_prompt]`` and, when the count is not ``rollout_batch_size × n``, silently falls
back to one whole-batch group; and a rollout that forked into 3 rows weighs 3× in its group.
:func:`normalize_rewards` groups by ``group_index`` and counts each ``rollout_id`` once (a sample exported with step credit, whose reward is its own turns' credit,
counts as its own unit).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from rollwire.data.rewards import normalize_row_rewards

__all__ = ["normalize_rewards"]

#: estimators that slime normalises per group (mean-centred), and those it also divides by std.
_CENTRED = frozenset({"grpo", "gspo", "cispo", "sapo", "reinforce_plus_plus_baseline"})
_STD_SCALED = frozenset({"grpo", "gspo", "cispo", "sapo"})


def _get(sample: Any, name: str, default: Any = None) -> Any:
    if isinstance(sample, dict):
        return sample.get(name, default)
    return getattr(sample, name, default)


def _rollwire_meta(sample: Any) -> dict[str, Any]:
    meta = _get(sample, "metadata") or {}
    inner = meta.get("rollwire") if isinstance(meta, dict) else None
    return inner if isinstance(inner, dict) else {}


def _reward_value(sample: Any, reward_key: str | None, position: int) -> float:
    reward = _get(sample, "reward")
    if reward_key and isinstance(reward, dict):
        if reward_key not in reward:
            raise ValueError(
                f"sample {position} (index {_get(sample, 'index')}): reward has no key "
                f"{reward_key!r} (--reward-key); keys are {sorted(reward)}"
            )
        reward = reward[reward_key]
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        raise ValueError(
            f"sample {position} (index {_get(sample, 'index')}) has reward {reward!r}; "
            "normalize_rewards needs a number (set --reward-key when rewards are dicts)"
        )
    value = float(reward)
    if not math.isfinite(value):
        raise ValueError(f"sample {position} (index {_get(sample, 'index')}) reward is {value}")
    return value


def _group_key(sample: Any, position: int, n_per_prompt: int | None) -> object:
    gi = _get(sample, "group_index")
    if gi is not None:
        return ("group_index", gi)
    gid = _rollwire_meta(sample).get("group_id")
    if gid is not None:
        return ("group_id", gid)
    if n_per_prompt:
        return ("position", position // n_per_prompt)
    return ("batch", 0)


def _rollout_key(sample: Any, position: int) -> object:
    if _rollwire_meta(sample).get("step_credit"):
        # a sample's reward is its own turn's credit: each sample is a unit of the statistics
        return ("sample", position)
    rid = _get(sample, "rollout_id")
    if rid is not None:
        return ("rollout_id", rid)
    rid = _rollwire_meta(sample).get("rollout_id")
    if rid is not None:
        return ("rollwire", rid)
    return ("sample", position)


def normalize_rewards(args: Any, samples: Sequence[Any]) -> tuple[list[float], list[float]]:
    """``(raw_rewards, rewards)`` for slime: per-group normalisation counting each rollout once.

    Follows slime's switches: ``advantage_estimator`` (grpo/gspo/cispo/sapo centre and divide by
    the unbiased std; reinforce_plus_plus_baseline only centres; others pass rewards through),
    ``rewards_normalization``, ``grpo_std_normalization`` and ``reward_key``. Samples flagged
    ``remove_sample`` do not enter the statistics and get 0. A group whose rollouts all scored
    the same gets 0. Works on ``Sample`` objects and on their dict form.
    """
    reward_key = getattr(args, "reward_key", None)
    raw = [_reward_value(s, reward_key, i) for i, s in enumerate(samples)]
    estimator = getattr(args, "advantage_estimator", "grpo")
    if estimator not in _CENTRED or not getattr(args, "rewards_normalization", True):
        return raw, list(raw)
    scale = estimator in _STD_SCALED and bool(getattr(args, "grpo_std_normalization", True))
    n_per_prompt = getattr(args, "n_samples_per_prompt", None)
    active = [i for i, s in enumerate(samples) if not _get(s, "remove_sample", False)]
    out = np.zeros(len(samples), dtype=np.float64)
    if active:
        groups = [_group_key(samples[i], i, n_per_prompt) for i in active]
        # a rollout id is only unique within its group's numbering, so key rollouts by both
        rollouts = [(g, _rollout_key(samples[i], i)) for g, i in zip(groups, active)]
        adv = normalize_row_rewards([raw[i] for i in active], groups, rollouts, scale_by_std=scale)
        out[active] = adv
    return raw, out.tolist()
