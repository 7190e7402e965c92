"""rollwire adapter for rLLM: rollouts as rLLM Episodes, and an AgentFlow that runs through rollwire.

Light on import: rLLM is imported only by the functions that build its objects.
"""

from __future__ import annotations

from rollwire_rllm.adapter import RllmAdapter, adapter
from rollwire_rllm.episodes import (
    decode_routing_matrix,
    episode_rows,
    termination_reason,
    to_episode_dicts,
    to_episodes,
)
from rollwire_rllm.flow import RollwireAgentFlow, rllm_task
from rollwire_rllm.routing import decode_verl_routing, routing_matrices

__all__ = [
    "RllmAdapter",
    "RollwireAgentFlow",
    "adapter",
    "decode_routing_matrix",
    "decode_verl_routing",
    "episode_rows",
    "rllm_task",
    "routing_matrices",
    "termination_reason",
    "to_episode_dicts",
    "to_episodes",
]
