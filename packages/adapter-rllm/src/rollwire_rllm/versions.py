"""Weight versions and step-level credit on rLLM ``Step``s (issues 23.4, 25.2, 25.5).

rLLM types ``Step.weight_version`` (and ``ModelOutput.weight_version``) as one int per step, read
for async staleness. A step whose call crossed a weight sync (tokens mode, vLLM's ``keep`` pause)
gets its **oldest** version there — the staleness of its oldest token, which is what a bound
``current - version <= max_staleness`` must see — and the exact spans go to
``info["rollwire"]["weight_versions"]`` as ``[version, start, end]`` over ``response_ids``; the
Episode's ``info["rollwire"]["weight_versions"]`` lists every version of the rollout.

With ``step_credit`` (:mod:`rollwire.data.credit`) and a rollout whose calls carry step rewards,
each Step gets ``reward = r_t`` (what rLLM's ``stepwise_advantage.mode=per_step`` trains on),
``mc_return = G_t`` with the credit's gamma (as rLLM's ``compute_mc_return``), and ``advantage``
the per-token credit list (read when ``rllm.algorithm.use_precomputed_advantage=true``).
"""

from __future__ import annotations

from typing import Any

from rollwire.data.credit import StepCredit, step_rewards, step_values
from rollwire.data.protocol import ModelCall, Rollout, VersionSpan

__all__ = [
    "int_version",
    "spans_from_info",
    "step_credit_fields",
    "step_version",
    "version_info",
]


def int_version(version: str | None) -> int | None:
    """rLLM's int ``weight_version`` of a rollwire version label, or None (``"step-7"``)."""
    if version is None:
        return None
    try:
        return int(version)
    except ValueError:
        return None


def step_version(call: ModelCall) -> int | None:
    """The step's ``weight_version``: its oldest sampling version (see the module docstring)."""
    spans = call.version_spans()
    return int_version(spans[0].version if spans else call.policy_version)


def version_info(call: ModelCall) -> list[list[Any]]:
    """``[version, start, end]`` spans over the step's ``response_ids``."""
    return [[s.version, s.start, s.end] for s in call.version_spans()]


def spans_from_info(info: Any) -> list[VersionSpan] | None:
    """Inverse of :func:`version_info` (None when the step carried none)."""
    if not info:
        return None
    return [VersionSpan(version=str(v), start=int(s), end=int(e)) for v, s, e in info]


def step_credit_fields(
    rollout: Rollout, credit: StepCredit | None
) -> dict[str, dict[str, Any]] | None:
    """Per call id: the Step's ``reward``, ``mc_return`` and per-token ``advantage`` under step
    credit; None without credit or without step rewards (Steps stay as before)."""
    if credit is None:
        return None
    rewards = step_rewards(rollout)
    values = step_values(rollout, credit)
    if rewards is None or values is None:
        return None
    returns = step_values(rollout, StepCredit("discounted", credit.gamma)) or {}
    lengths = {c.call_id: int(c.completion_ids.shape[0]) for c in rollout.calls}
    return {
        call_id: {
            "reward": rewards[call_id],
            "mc_return": returns[call_id],
            "advantage": [values[call_id]] * lengths[call_id],
        }
        for call_id in rewards
    }
