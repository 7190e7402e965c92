"""The ``trl`` trainer adapter object (entry point ``rollwire.trainers: trl``).

Light on purpose: importing this module imports neither torch nor TRL (rollwire's plugin loader
reads ``requires`` first). Conversion needs neither: TRL's ``rollout_func`` takes plain lists.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from rollwire.plugins.protocols import Batch, ExportedRow, TrainerOption

__all__ = ["TrlAdapter", "adapter"]

#: what ``rollwire train`` needs (printed when TRL or torch is missing)
INSTALL_HINT = (
    "rollwire train needs TRL and torch. CPU-only torch first, then the extra: "
    "pip install torch --index-url https://download.pytorch.org/whl/cpu && "
    'pip install "rollwire[trl]"; in a rollwire checkout, bash '
    "packages/adapter-trl/ci/setup-venv.sh builds .venv-trl (then run .venv-trl/bin/rollwire train)"
)


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
    install_hint = INSTALL_HINT
    #: ``rollwire train --trainer trl``'s own options
    train_options = (
        TrainerOption(
            "--importance-sampling",
            "importance_sampling",
            "token_truncate",
            "TRL's correction against the captured log-probs",
            str,
            ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "off"),
        ),
        TrainerOption(
            "--is-clip-max", "is_clip_max", 3.0, "where the correction truncates or masks", float
        ),
        TrainerOption(
            "--loss-type",
            "loss_type",
            "dapo",
            "TRL's GRPO loss aggregation",
            str,
            ("dapo", "grpo", "bnpo", "dr_grpo", "cispo", "sapo"),
        ),
        TrainerOption("--max-grad-norm", "max_grad_norm", 1.0, "gradient clipping", float),
        TrainerOption(
            "--lora-sync",
            "lora_sync",
            "adapter",
            "with --lora-rank, what each sync pushes: the adapter alone (servers load it by "
            "name: vLLM with runtime LoRA, the engine), or the model with it merged in",
            str,
            ("adapter", "merged"),
        ),
        TrainerOption(
            "--threads",
            "threads",
            1,
            "torch threads (the embedded model's ops are too small to gain from more)",
            int,
        ),
    )

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

    def train_rows(self, batch: Any) -> list[ExportedRow]:
        """The rows of the loop's batch exactly as the update feeds them to TRL's loss."""
        from rollwire_trl.samples import pad_rows

        return pad_rows(batch.rows, pad_id=0).rows()

    def policy_trainer(self, spec: Any) -> Any:
        """The trainer of ``rollwire train --trainer trl`` (imports torch and TRL)."""
        from rollwire_trl.policy_trainer import TrlTrainer

        return TrlTrainer(spec)

    def flatten(self, converted: Any) -> list[ExportedRow]:
        """The samples of a converted dict, in order."""
        from rollwire_trl.samples import flatten_output

        return flatten_output(converted)


#: The adapter instance the entry point names.
adapter = TrlAdapter()
