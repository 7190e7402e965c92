"""The ``trl`` trainer adapter object (entry point ``rollwire.trainers: trl``).

Light on purpose: importing this module imports neither torch nor TRL (rollwire's plugin loader
reads ``requires`` first). Conversion needs neither: TRL's ``rollout_func`` takes plain lists.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from rollwire.plugins.protocols import Batch, ExportedRow

__all__ = ["TrlAdapter", "adapter"]


class TrlAdapter:
    """rollwire rollouts → the dict TRL's ``rollout_func`` returns (see :mod:`rollwire_trl.samples`)."""

    name = "trl"
    #: conversion needs no framework: without TRL the adapter exports (``rollwire plugins``:
    #: "export only"); :meth:`train` needs :attr:`train_requires`
    requires: tuple[str, ...] = ()
    framework = "trl"
    train_requires: tuple[str, ...] = ("trl>=1.16,<1.17", "torch>=2.4", "transformers>=4.56")
    #: one JSON object per sample: the rollout_func keys of that sample
    export_suffix = ".rollout_func.jsonl"

    def convert(self, batch: Batch, **options: Any) -> dict[str, list[Any]]:
        """``to_rollout_output(batch, **options)``: every row by default (``multi_row="all"``)."""
        from rollwire_trl.samples import to_rollout_output

        options.pop("pad_token_id", None)  # TRL pads itself; accepted so callers can pass it
        return to_rollout_output(batch, **options)  # type: ignore[no-any-return]

    def export(self, batch: Batch, path: str | Path, **options: Any) -> Path:
        """Convert and write one JSON line per sample (the keys of ``convert``'s dict)."""
        output = self.convert(batch, **options)
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        keys = list(output)
        with out.open("wb") as f:
            for i in range(len(output["prompt_ids"])):
                f.write(orjson.dumps({k: output[k][i] for k in keys}) + b"\n")
        return out

    def train(self, **options: Any) -> Any:
        """Run ``rollwire train``'s loop (:func:`rollwire_trl.loop.train`) with ``options``, the
        fields of :class:`~rollwire_trl.loop.TrainSpec`; imports torch and TRL."""
        from rollwire_trl.loop import TrainSpec
        from rollwire_trl.loop import train as run

        return run(TrainSpec(**options))

    def flatten(self, converted: Any) -> list[ExportedRow]:
        """The samples of a converted dict, in order."""
        from rollwire_trl.samples import flatten_output

        return flatten_output(converted)


#: The adapter instance the entry point names.
adapter = TrlAdapter()
