"""The trainer's side of a weight sync's verification: score the probe's tokens with the model
the trainer just saved, so :class:`~rollwire.trainer.weight_sync.WeightSync` can compare.

``engine_reference`` reads a folder with the embedded engine's NumPy model (no torch);
``transformers_reference`` uses transformers (imported only when called).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rollwire.trainer.weight_sync import Reference

__all__ = ["engine_reference", "transformers_reference"]


def engine_reference(folder: str | Path) -> Reference:
    """Score with the embedded engine's model loaded from ``folder`` (its own format, or a Hugging
    Face Mixtral or dense Llama-family folder), as the engine computes log-probs (float32 logits,
    log-softmax)."""
    from rollwire.engine.model import TinyModel
    from rollwire.engine.sampling import log_softmax

    model = TinyModel.load(Path(folder))

    def score(prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
        ids = [*map(int, prompt_ids), *map(int, completion_ids)]
        cache = model.new_cache(len(ids) + 8)
        logits, _ = model.forward(ids[:-1], cache, logits_from=len(prompt_ids) - 1)
        lp = log_softmax(logits)
        return [float(lp[i, t]) for i, t in enumerate(completion_ids)]

    return score


def transformers_reference(model: Any, *, dtype: str = "float32") -> Reference:
    """Score with a transformers causal LM (an ``nn.Module`` or a folder to load), in ``dtype``."""
    import torch

    if isinstance(model, (str, Path)):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(model), dtype=getattr(torch, dtype))
    model.eval()

    def score(prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
        ids = torch.tensor([[*map(int, prompt_ids), *map(int, completion_ids)]])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float()
        lp = torch.log_softmax(logits, dim=-1)
        picked = lp[torch.arange(len(completion_ids)), torch.tensor(list(completion_ids))]
        return [float(x) for x in np.asarray(picked.tolist(), dtype=np.float64)]

    return score
