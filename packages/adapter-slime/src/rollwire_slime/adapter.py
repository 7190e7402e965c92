"""The ``rollwire.trainers: slime`` plugin object (:class:`rollwire.plugins.protocols.TrainerAdapter`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from rollwire.plugins.protocols import Batch, ExportedRow
from rollwire_slime.samples import iter_sample_leaves, to_sample_dicts, to_samples

__all__ = ["SlimeAdapter", "adapter"]


def _slime_importable() -> bool:
    try:
        import slime.utils.types  # noqa: F401
    except ImportError:
        return False
    return True


def _field(sample: Any, name: str) -> Any:
    return sample.get(name) if isinstance(sample, dict) else getattr(sample, name, None)


class SlimeAdapter:
    """Converts rollwire batches to slime samples (native when slime is importable)."""

    name = "slime"
    #: conversion needs no framework: without slime the documented dict form is produced.
    requires: Sequence[str] = ()
    #: the trainer's distribution: without it the adapter is "export only" (``rollwire plugins``)
    framework = "slime"

    def convert(self, batch: Batch, **options: Any) -> list[list[Any]]:
        """``Sample``s when slime is importable, else their ``to_dict()`` form; same nesting.

        Options: ``tokenizer``, ``mode`` ("merge" | "per_call"), ``failure_reward``, ``pad_token_id``,
        and ``native`` (True forces ``Sample`` objects, False forces dicts).
        """
        native = options.pop("native", None)
        if native is None:
            native = _slime_importable()
        if native:
            return to_samples(batch, **options)
        return to_sample_dicts(batch, **options)

    def export(self, batch: Batch, path: str | Path, **options: Any) -> Path:
        """JSONL, one sample dict per line, in batch order (group, rollout, row).

        Each line is ``Sample.from_dict``-ready; ``group_index`` rebuilds the ``[group][sample]``
        nesting. Always the dict form, so no slime is needed to write or read it.
        """
        options.pop("native", None)
        nested = to_sample_dicts(batch, **options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".partial")
        with tmp.open("wb") as f:
            for sample in iter_sample_leaves(nested):
                f.write(orjson.dumps(sample))
                f.write(b"\n")
        tmp.replace(path)
        return path

    def flatten(self, converted: Any) -> list[ExportedRow]:
        """The rows of a converted batch (``Sample``s or dicts), in order.

        Placeholders (a rollout without a usable call: two pad tokens, nothing captured) are left
        out, so the result has the rows :class:`rollwire.data.trajectory.TrajectoryBuilder` gives.
        """
        out: list[ExportedRow] = []
        for sample in iter_sample_leaves(converted):
            if ((_field(sample, "metadata") or {}).get("rollwire") or {}).get("placeholder"):
                continue
            tokens = np.asarray(_field(sample, "tokens") or [], dtype=np.int64)
            n = int(_field(sample, "response_length") or 0)
            split = tokens.shape[0] - n
            mask = _field(sample, "loss_mask")
            if _field(sample, "remove_sample"):
                mask = [0] * n  # slime zeroes the loss mask of a removed sample
            logprobs = _field(sample, "rollout_log_probs")
            meta = (_field(sample, "metadata") or {}).get("rollwire") or {}
            reward = _field(sample, "reward")
            experts = _field(sample, "rollout_routed_experts")
            if meta.get("routing_missing"):
                experts = None  # a stand-in, not captured routing
            out.append(
                ExportedRow(
                    rollout_id=str(meta.get("rollout_id", _field(sample, "rollout_id"))),
                    group_id=meta.get("group_id"),
                    prompt_ids=tokens[:split],
                    response_ids=tokens[split:],
                    loss_mask=np.asarray(mask if mask is not None else [1] * n, dtype=np.int64),
                    logprobs=np.asarray(
                        logprobs if logprobs is not None else [0.0] * n, dtype=np.float64
                    ),
                    reward=float(reward) if isinstance(reward, int | float) else None,
                    routed_experts=np.asarray(experts) if experts is not None else None,
                )
            )
        return out


#: the object the ``rollwire.trainers`` entry point names.
adapter = SlimeAdapter()
