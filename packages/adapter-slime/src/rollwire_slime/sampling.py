"""slime's SGLang sampling parameters as rollwire session sampling."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["slime_sampling"]

#: slime sampling parameter -> rollwire session sampling key (OpenAI spelling).
_SAMPLING_MAP = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "max_new_tokens": "max_tokens",
    "min_new_tokens": "min_tokens",
    "stop": "stop",
    "stop_token_ids": "stop_token_ids",
    "repetition_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "sampling_seed": "seed",
}


def slime_sampling(sampling_params: Mapping[str, Any] | None) -> dict[str, Any]:
    """slime's SGLang sampling params as rollwire session sampling (unknown keys are dropped)."""
    out: dict[str, Any] = {}
    for key, value in (sampling_params or {}).items():
        target = _SAMPLING_MAP.get(key)
        if target is None or value is None:
            continue
        if key == "top_k" and value in (-1, 0):  # slime's "off"
            continue
        if key in ("stop", "stop_token_ids") and not value:
            continue
        out[target] = value
    return out
