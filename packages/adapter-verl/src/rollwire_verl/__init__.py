"""rollwire adapter for verl: rollouts as padded ``DataProto`` batches, and a verl agent loop.

Importing this package is light (no torch, no verl); the conversion functions are loaded on first
use. ``RollwireAgentLoop`` lives in :mod:`rollwire_verl.agent_loop` (it subclasses verl's
``AgentLoopBase``, so importing it imports verl).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rollwire_verl.adapter import DEFAULT_PAD_TOKEN_ID, VerlAdapter, adapter

if TYPE_CHECKING:
    from rollwire_verl.dataproto import (
        flatten_dataproto,
        grpo_advantages,
        normalize_rewards,
        step_advantages,
        to_dataproto,
    )
    from rollwire_verl.layout import ConversionReport

__all__ = [
    "AGENT_LOOP_CONFIG_PATH",
    "DEFAULT_PAD_TOKEN_ID",
    "ConversionReport",
    "VerlAdapter",
    "adapter",
    "flatten_dataproto",
    "grpo_advantages",
    "normalize_rewards",
    "step_advantages",
    "to_dataproto",
]

_LAZY = {
    "flatten_dataproto",
    "grpo_advantages",
    "normalize_rewards",
    "step_advantages",
    "to_dataproto",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from rollwire_verl import dataproto

        return getattr(dataproto, name)
    if name == "ConversionReport":
        from rollwire_verl.layout import ConversionReport

        return ConversionReport
    if name == "AGENT_LOOP_CONFIG_PATH":
        from importlib.resources import files

        return str(files("rollwire_verl") / "agent_loop.yaml")
    raise AttributeError(f"module 'rollwire_verl' has no attribute {name!r}")
