"""Sampling policy: whose parameters win, the session's (trainer) or the agent's, per key.

``session`` (default): the session's value replaces the agent's; ``agent``: the agent's value wins
when it sent one; ``min``: the smaller of the two (handy for ``max_tokens``). Guided decoding,
``logit_bias`` and ``n > 1`` change the sampling distribution: such calls are flagged off-policy.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "GRAMMAR_FLAGS",
    "SAMPLING_KEYS",
    "UNCAPTURED_CHOICE_FLAGS",
    "apply_sampling",
    "check_sampling",
    "off_policy_flags",
    "tool_choice_flags",
    "trainable_with",
]

SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_tokens",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
    "stop",
    "stop_token_ids",
    "n",
    "logit_bias",
    "min_tokens",
)
POLICIES = ("session", "agent", "min")


_INT_KEYS = ("max_tokens", "max_completion_tokens", "n", "min_tokens", "top_k", "seed")
_POSITIVE_KEYS = ("max_tokens", "max_completion_tokens", "n")
_NUMBER_KEYS = (
    "temperature",
    "top_p",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)


def check_sampling(params: dict[str, Any], where: str = "request") -> None:
    """Raise ``ValueError`` naming the key and value when a sampling parameter has the wrong type.

    Integers must be integers (``"50"`` is refused, not compared with numbers later), numbers must
    be finite, ``max_tokens`` and ``n`` positive, ``logit_bias`` an object.
    """
    for key in _INT_KEYS:
        v = params.get(key)
        if v is None:
            continue
        if type(v) is not int:
            raise ValueError(f"{where}: {key} must be an integer, got {v!r}")
        if v < 1 and key in _POSITIVE_KEYS:
            raise ValueError(f"{where}: {key} must be a positive integer, got {v!r}")
    for key in _NUMBER_KEYS:
        v = params.get(key)
        if v is None:
            continue
        if type(v) not in (int, float) or not math.isfinite(v):
            raise ValueError(f"{where}: {key} must be a finite number, got {v!r}")
    lb = params.get("logit_bias")
    if lb is not None and not isinstance(lb, dict):
        raise ValueError(f"{where}: logit_bias must be an object, got {lb!r}")


def _merge(key: str, session_val: Any, agent_val: Any, policy: str) -> Any:
    if agent_val is None:
        return session_val
    if policy == "agent":
        return agent_val
    if policy == "min":
        try:
            return min(session_val, agent_val)
        except TypeError:
            return session_val
    return session_val


def apply_sampling(
    body: dict[str, Any],
    session_sampling: dict[str, Any],
    policy: dict[str, str],
    allow_keys: tuple[str, ...] = SAMPLING_KEYS,
) -> tuple[dict[str, Any], list[str]]:
    """Apply the session's sampling to ``body`` in place; return ``(effective, flags)``."""
    # max_completion_tokens is the newer OpenAI spelling of max_tokens: treat them as one key.
    if "max_completion_tokens" in body:
        mct = body.pop("max_completion_tokens")
        if body.get("max_tokens") is None:
            body["max_tokens"] = mct
    for key, value in session_sampling.items():
        if key == "max_completion_tokens":
            key = "max_tokens"
        body[key] = _merge(key, value, body.get(key), policy.get(key, "session"))
    effective = {k: body[k] for k in allow_keys if body.get(k) is not None}
    return effective, off_policy_flags(body)


#: Flags of calls served under a grammar. Their log-probs are not the policy's: vLLM reports the
#: raw log-probs of the forced tokens (a ``<tool_call>`` spelled as byte tokens ~11-15 nats from
#: what the policy gives them), so even ``allow_off_policy`` does not make them trainable.
GRAMMAR_FLAGS = frozenset({"guided_decoding", "guided_tool_choice"})


#: Flags of calls whose training sample is unknown: with ``n > 1`` the agent sees every choice,
#: only the first is captured, and which one the agent went on with is unknown.
UNCAPTURED_CHOICE_FLAGS = frozenset({"n>1"})


def trainable_with(flags: list[str], allow_off_policy: bool) -> bool:
    """Whether a call with these off-policy ``flags`` may be trained: no flags, or the session
    allows off-policy calls and none was served under a grammar or with ``n > 1``."""
    if not flags:
        return True
    never = GRAMMAR_FLAGS | UNCAPTURED_CHOICE_FLAGS
    return allow_off_policy and not never.intersection(flags)


def off_policy_flags(body: dict[str, Any]) -> list[str]:
    """Why a request samples from something other than the policy's distribution."""
    flags: list[str] = []
    if body.get("logit_bias"):
        flags.append("logit_bias")
    rf = body.get("response_format")
    guided = isinstance(rf, dict) and rf.get("type") in ("json_schema", "json_object")
    guided = guided or any(k.startswith("guided_") and body[k] is not None for k in body)
    guided = guided or body.get("structured_outputs") is not None
    if guided:
        flags.append("guided_decoding")
    n = body.get("n")
    if isinstance(n, int) and n > 1:
        flags.append("n>1")
    return flags


def tool_choice_flags(body: dict[str, Any]) -> list[str]:
    """``tool_choice`` ``"required"`` or a named function: vLLM serves it as structured outputs.

    That constrains sampling like guided decoding, so (passthrough) calls are flagged off-policy.
    """
    tc = body.get("tool_choice")
    if tc == "required" or (isinstance(tc, dict) and tc.get("type") in ("function", "tool")):
        return ["guided_tool_choice"]
    return []
