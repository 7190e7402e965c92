"""rollwire adapter for slime: rollouts as slime Samples, generate/rollout hooks, reward post-process.

Light on import: slime is imported only by the functions that build its objects.
"""

from __future__ import annotations

from rollwire_slime.adapter import SlimeAdapter, adapter
from rollwire_slime.hooks import HookConfig, generate, generate_rollout, rollout_to_sample_dicts
from rollwire_slime.rewards import normalize_rewards
from rollwire_slime.samples import SAMPLE_FIELDS, sample_status, to_sample_dicts, to_samples

__all__ = [
    "SAMPLE_FIELDS",
    "HookConfig",
    "SlimeAdapter",
    "adapter",
    "generate",
    "generate_rollout",
    "normalize_rewards",
    "rollout_to_sample_dicts",
    "sample_status",
    "to_sample_dicts",
    "to_samples",
]
