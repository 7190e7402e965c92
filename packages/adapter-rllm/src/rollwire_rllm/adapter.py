"""The ``rollwire.trainers: rllm`` plugin object (:class:`rollwire.plugins.protocols.TrainerAdapter`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from rollwire.plugins.protocols import Batch, ExportedRow, TrainerOption
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
    #: what ``rollwire train --trainer rllm`` needs: rLLM (from a checkout) and its Tinker imports
    train_requires: Sequence[str] = (
        "rllm",
        "tinker>=0.18.2",
        "tinker-cookbook",
        "omegaconf",
        "transformers>=4.45",
    )
    install_hint = (
        "rollwire train --trainer rllm runs rLLM's own Tinker trainer; rLLM is not on PyPI: git "
        "clone https://github.com/rllm-org/rllm && pip install --no-deps -e rllm && pip install "
        "--no-deps tinker-cookbook && pip install omegaconf chz blobfile codetiming, in an "
        "environment with the Tinker SDK the service speaks (SkyRL 0.3.0: tinker==0.18.2, "
        "although rLLM asks for >=0.22.2); see packages/adapter-rllm/README.md"
    )
    #: ``rollwire train --trainer rllm``'s own options
    train_options = (
        TrainerOption("--base-url", "base_url", None, "the Tinker service to train on"),
        TrainerOption("--base-model", "base_model", None, "the service's model to train"),
        TrainerOption(
            "--tokenizer", "tokenizer", None, "what tokens mode renders with (default: the model)"
        ),
        TrainerOption(
            "--estimator",
            "estimator",
            "grpo",
            "rLLM's advantage estimator (rllm.algorithm.adv_estimator)",
            str,
            ("grpo", "reinforce", "reinforce_plus_plus_baseline", "rloo"),
        ),
        TrainerOption(
            "--loss-fn",
            "loss_fn",
            None,
            "rLLM's Tinker loss (default: rLLM's for the estimator, ppo for grpo)",
            str,
            ("importance_sampling", "ppo", "cispo", "dro"),
        ),
        TrainerOption(
            "--probe-tolerance",
            "probe_tolerance",
            0.05,
            "the sync's sampler-vs-trainer tolerance",
            float,
        ),
    )

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

    def policy_trainer(self, spec: Any) -> Any:
        """The trainer of ``rollwire train --trainer rllm``: rLLM's own Tinker trainer."""
        from rollwire_rllm.policy_trainer import RllmPolicyTrainer

        return RllmPolicyTrainer(spec)

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
