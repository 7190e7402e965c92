"""rollwire trainer for the Tinker API: rollouts as Tinker datums and a training step that ends in
a new sampler (hosted Tinker, a SageMaker training session, or SkyRL's self-hosted server).

Light on import: the Tinker SDK is imported only when a datum is sent or a client is made.
"""

from __future__ import annotations

from rollwire_tinker.adapter import TinkerAdapter, adapter
from rollwire_tinker.datums import DatumBuild, TinkerDatum, group_advantages, row_datum, to_datums
from rollwire_tinker.trainer import (
    StepResult,
    TinkerConfig,
    TinkerTrainer,
    ratio_stats,
    tinker_reference,
)

__all__ = [
    "DatumBuild",
    "StepResult",
    "TinkerAdapter",
    "TinkerConfig",
    "TinkerDatum",
    "TinkerTrainer",
    "adapter",
    "group_advantages",
    "ratio_stats",
    "row_datum",
    "tinker_reference",
    "to_datums",
]
