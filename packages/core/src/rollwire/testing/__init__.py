"""Conformance suites and sample data for rollwire's plugin interfaces and stores.

Each implementation runs a suite by subclassing its base class and providing one fixture, e.g.::

    class TestVerlAdapter(TrainerAdapterConformance):
        @pytest.fixture
        def adapter(self): return rollwire_verl.adapter

Importing this package needs pytest.
"""

from rollwire.testing.agent import AgentAdapterConformance
from rollwire.testing.samples import (
    failed_rollout,
    forked_rollout,
    merged_rollout,
    moe_rollout,
    sample_batch,
    side_call_rollout,
    single_turn_rollout,
)
from rollwire.testing.trainer import TrainerAdapterConformance, TrainerLoopConformance

__all__ = [
    "AgentAdapterConformance",
    "TrainerAdapterConformance",
    "TrainerLoopConformance",
    "failed_rollout",
    "forked_rollout",
    "merged_rollout",
    "moe_rollout",
    "sample_batch",
    "side_call_rollout",
    "single_turn_rollout",
]
