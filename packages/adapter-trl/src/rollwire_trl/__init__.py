"""rollwire adapter for TRL: GRPO on rollouts the gateway captured, weights synced after each step.

Importing this package is light (no torch, no TRL): :data:`adapter` converts rollouts to the dict
TRL's ``rollout_func`` returns. :class:`RolloutFunction` runs each prompt's group through rollwire
inside ``GRPOTrainer``; :class:`RollwireGRPOTrainer` and :class:`WeightSyncCallback` import TRL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rollwire_trl.adapter import TrlAdapter, adapter
from rollwire_trl.samples import ConversionReport, flatten_output, to_rollout_output

if TYPE_CHECKING:
    from rollwire_trl.rollout import RolloutFunction, rollwire_reward
    from rollwire_trl.sync import SyncHook, WeightSyncCallback, http_weight_sync
    from rollwire_trl.trainer import RollwireGRPOTrainer

__all__ = [
    "ConversionReport",
    "RolloutFunction",
    "RollwireGRPOTrainer",
    "SyncHook",
    "TrlAdapter",
    "WeightSyncCallback",
    "adapter",
    "flatten_output",
    "http_weight_sync",
    "rollwire_reward",
    "to_rollout_output",
]

_LAZY = {
    "RolloutFunction": "rollwire_trl.rollout",
    "rollwire_reward": "rollwire_trl.rollout",
    "SyncHook": "rollwire_trl.sync",
    "WeightSyncCallback": "rollwire_trl.sync",
    "http_weight_sync": "rollwire_trl.sync",
    "RollwireGRPOTrainer": "rollwire_trl.trainer",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rollwire_trl' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
