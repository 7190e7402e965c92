"""A supervised warm-up through the Tinker API: ``cross_entropy`` on the assistant turns of a
task's teacher conversations, before RL (the same conversations and labels as TRL's torch loop).

It runs on the training client's own LoRA adapter, so it works against any Tinker service —
hosted models cannot be replaced by a locally warmed-up folder. The code is core's
(:mod:`rollwire.trainer.tinker_api`), which every trainer on the Tinker API shares.
"""

from __future__ import annotations

from rollwire.trainer.tinker_api import WarmupResult, sft_datum, tinker_warmup

__all__ = ["WarmupResult", "sft_datum", "tinker_warmup"]
