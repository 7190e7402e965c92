"""The ``rollwire.trainers: rllm`` plugin object (:class:`rollwire.plugins.protocols.TrainerAdapter`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from rollwire.plugins.protocols import Batch, ExportedRow
from rollwire_rllm.episodes import episode_rows, to_episode_dicts, to_episodes

__all__ = ["RllmAdapter", "adapter"]


def _rllm_importable() -> bool:
    try:
        import rllm.agents.agent  # noqa: F401
    except ImportError:
        return False
    return True


class RllmAdapter:
    """Converts rollwire batches to rLLM Episodes (native when rLLM is importable)."""

    name = "rllm"
    #: conversion needs no framework: without rLLM the documented dict form is produced.
    requires: Sequence[str] = ()
    #: the trainer's distribution: without it the adapter is "export only" (``rollwire plugins``)
    framework = "rllm"

    def convert(self, batch: Batch, **options: Any) -> list[Any]:
        """``Episode``s when rLLM is importable, else their ``to_dict()`` form.

        Options: ``tokenizer``, ``trajectory_name``, ``failure_reward``, ``mode``, and ``native``
        (True forces Episode objects, False forces dicts).
        """
        native = options.pop("native", None)
        if native is None:
            native = _rllm_importable()
        if native:
            return to_episodes(batch, **options)
        return to_episode_dicts(batch, **options)

    def export(self, batch: Batch, path: str | Path, **options: Any) -> Path:
        """JSONL, one Episode dict per line (``Episode.from_dict``-ready), group by group."""
        options.pop("native", None)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".partial")
        with tmp.open("wb") as f:
            for episode in to_episode_dicts(batch, **options):
                f.write(orjson.dumps(episode, option=orjson.OPT_SERIALIZE_NUMPY))
                f.write(b"\n")
        tmp.replace(path)
        return path

    def flatten(self, converted: Any) -> list[ExportedRow]:
        """The rows rLLM trains on: each Episode's steps merged as rollwire's TrajectoryBuilder does."""
        out: list[ExportedRow] = []
        for episode in converted:
            for row in episode_rows(episode):
                out.append(
                    ExportedRow(
                        rollout_id=row.rollout_id,
                        group_id=row.group_id,
                        prompt_ids=row.prompt_ids.astype(np.int64),
                        response_ids=row.response_ids.astype(np.int64),
                        loss_mask=row.loss_mask.astype(np.int64),
                        logprobs=row.logprobs.astype(np.float64),
                        reward=row.reward,
                    )
                )
        return out


#: the object the ``rollwire.trainers`` entry point names.
adapter = RllmAdapter()
