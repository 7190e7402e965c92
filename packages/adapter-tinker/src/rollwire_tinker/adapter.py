"""The ``rollwire.trainers: tinker`` plugin object (:class:`rollwire.plugins.protocols.TrainerAdapter`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from rollwire.plugins.protocols import Batch, ExportedRow, TrainerOption
from rollwire_tinker.datums import TinkerDatum, datum_rows, to_datums

__all__ = ["TinkerAdapter", "adapter"]


class TinkerAdapter:
    """Converts rollwire batches to Tinker datums (``TinkerDatum``; ``.to_sdk()`` for the SDK's)."""

    name = "tinker"
    #: conversion needs no SDK: datums are plain arrays until ``to_sdk()``
    requires: Sequence[str] = ()
    #: the trainer's distribution: without it the adapter is "export only" (``rollwire plugins``)
    framework = "tinker"
    #: what ``rollwire train --trainer tinker`` needs (SkyRL too, for a server started here)
    train_requires: Sequence[str] = ("tinker>=0.18.2", "transformers>=4.45")
    export_suffix = ".tinker.jsonl"
    install_hint = (
        "rollwire train --trainer tinker needs the Tinker SDK (and SkyRL for a server started "
        'here): pip install "rollwire[tinker]" "tinker==0.18.2" "skyrl[tinker,jax]==0.3.0"; in '
        "a rollwire checkout, bash packages/adapter-tinker/ci/setup-venv.sh builds .venv-tinker"
    )
    #: ``rollwire train --trainer tinker``'s own options
    train_options = (
        TrainerOption(
            "--base-url", "base_url", None, "the Tinker service (default: SkyRL's, started here)"
        ),
        TrainerOption(
            "--base-model", "base_model", None, "the service's model to train (with --base-url)"
        ),
        TrainerOption(
            "--loss-fn",
            "loss_fn",
            "importance_sampling",
            "Tinker's RL loss (both weigh each token by exp(trainer - captured log-prob))",
            str,
            ("importance_sampling", "ppo"),
        ),
        TrainerOption(
            "--probe-tolerance",
            "probe_tolerance",
            0.05,
            "the sync's sampler-vs-trainer tolerance",
            float,
        ),
        TrainerOption(
            "--max-batch",
            "max_batch",
            32,
            "SkyRL's sample_max_num_sequences (one padded shape, compiled once)",
            int,
        ),
    )

    def convert(self, batch: Batch, **options: Any) -> list[TinkerDatum]:
        """One datum per row of each completed rollout (options: those of ``to_datums``)."""
        return to_datums(batch, **options).datums

    def export(self, batch: Batch, path: str | Path, **options: Any) -> Path:
        """JSONL: per line the datum as the SDK sends it and the row facts it came from."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".partial")
        with tmp.open("wb") as f:
            for line in datum_rows(self.convert(batch, **options)):
                f.write(orjson.dumps(line))
                f.write(b"\n")
        tmp.replace(path)
        return path

    def train_rows(self, batch: Any) -> list[ExportedRow]:
        """The rows of the loop's batch exactly as the update sends them (one datum each)."""
        from rollwire_tinker.datums import row_datum

        rows = self.flatten([row_datum(r.row, r.advantage) for r in batch.rows])
        for row, train_row in zip(rows, batch.rows):
            row.advantage = float(train_row.advantage)
        return rows

    def policy_trainer(self, spec: Any) -> Any:
        """The trainer of ``rollwire train --trainer tinker``."""
        from rollwire_tinker.policy_trainer import TinkerPolicyTrainer

        return TinkerPolicyTrainer(spec)

    def flatten(self, converted: Any) -> list[ExportedRow]:
        """The rows the datums train on, rebuilt from ``TinkerDatum``s or exported lines."""
        out: list[ExportedRow] = []
        for item in converted:
            if isinstance(item, TinkerDatum):
                tokens, logprobs = item.tokens, item.logprobs
                meta: dict[str, Any] = {
                    "rollout_id": item.rollout_id,
                    "group_id": item.group_id,
                    "prompt_len": item.prompt_len,
                    "loss_mask": item.loss_mask,
                    "reward": item.reward,
                }
            else:
                meta = item["rollwire"]
                datum = item["datum"]
                inputs = datum["loss_fn_inputs"]
                model_input = [t for c in datum["model_input"]["chunks"] for t in c["tokens"]]
                target = inputs["target_tokens"]["data"]
                tokens = np.asarray([*model_input, *target[-1:]], dtype=np.int64)
                logprobs = np.asarray(inputs["logprobs"]["data"], dtype=np.float64)
            split = int(meta["prompt_len"])
            n_resp = tokens.shape[0] - split
            resp_logprobs = np.zeros(n_resp, dtype=np.float64)
            # target position j holds the log-prob of token j + 1
            start = max(split - 1, 0)
            resp_logprobs[n_resp - (logprobs.shape[0] - start) :] = logprobs[start:]
            out.append(
                ExportedRow(
                    rollout_id=str(meta["rollout_id"]),
                    group_id=meta["group_id"],
                    prompt_ids=tokens[:split],
                    response_ids=tokens[split:],
                    loss_mask=np.asarray(meta["loss_mask"], dtype=np.int64),
                    logprobs=resp_logprobs,
                    reward=meta["reward"],
                )
            )
        return out


#: the object the ``rollwire.trainers`` entry point names.
adapter = TinkerAdapter()
