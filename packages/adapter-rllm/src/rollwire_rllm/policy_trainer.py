"""rLLM's own Tinker trainer as ``rollwire train``'s trainer (:class:`rollwire.trainer.loop.PolicyTrainer`).

Each update hands the step's rollouts to rLLM's code exactly as its ``TinkerBackend`` would
have them: :func:`~rollwire_rllm.episodes.to_episodes` → ``transform_episodes_to_trajectory_groups``
(rLLM's grouping by task id and trajectory name, its compact filtering) →
``TinkerPolicyTrainer.forward_backward_from_trajectory_groups`` (rLLM's advantage estimator and
its ``trajectory_to_datums``, then ``forward_backward``) → ``optim_step_future`` (its Adam and LR
schedule). The export is rLLM's ``save_checkpoint_and_get_sampling_client(step, do_save=True)``,
whose sampler checkpoint the loop's sync swaps the gateway's ``tinker`` backend to and verifies.

rLLM is not on PyPI and is imported only here, when the trainer starts.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from rollwire.data.protocol import Rollout
from rollwire.trainer.loop import Export, RunSpec, Start
from rollwire.trainer.tinker_api import tinker_reference, tinker_warmup
from rollwire.trainer.train_batch import TrainBatch, behaviour_stats
from rollwire.trainer.weight_sync import Reference
from rollwire_rllm.episodes import to_episodes

__all__ = [
    "INSTALL_HINT",
    "RllmPolicyTrainer",
    "Warmup",
    "rllm_config",
    "sft_warmup",
    "tinker_forward_reference",
]

INSTALL_HINT = (
    "rLLM's Tinker trainer is not importable: git clone https://github.com/rllm-org/rllm && pip "
    "install --no-deps -e rllm && pip install --no-deps tinker-cookbook && pip install omegaconf "
    "chz blobfile codetiming (packages/adapter-rllm/README.md)"
)

#: a warm-up run on rLLM's training client before checkpoint 0: ``(training_client, tokenizer,
#: spec) -> one line for the log``
Warmup = Callable[[Any, Any, RunSpec], str]


def rllm_config(spec: RunSpec, base_model: str, lora_rank: int) -> Any:
    """rLLM's own configuration (its ``rllm/base.yaml`` and ``rllm/backend/tinker.yaml``) with the
    run's model, optimizer and algorithm choices on top."""
    import rllm.trainer.config as config_pkg
    from omegaconf import OmegaConf

    folder = Path(config_pkg.__file__).parent
    opts = spec.options
    cfg = OmegaConf.merge(
        OmegaConf.create({"rllm": OmegaConf.load(folder / "rllm" / "base.yaml")}),
        OmegaConf.load(folder / "rllm" / "backend" / "tinker.yaml"),
        OmegaConf.create(
            {
                "tinker_base_url": opts.get("base_url"),
                "model": {"name": base_model, "lora_rank": lora_rank},
                "training": {
                    "group_size": spec.group_size,
                    "learning_rate": spec.learning_rate,
                    "beta1": spec.adam_beta1,
                    "default_local_dir": str(spec.out / "rllm"),
                    "resume_mode": "disable",
                },
                "validation": {"group_size": spec.group_size},
                "rllm": {
                    "algorithm": {
                        "adv_estimator": str(opts.get("estimator", "grpo")),
                        "norm_adv_by_std_in_grpo": spec.scale_advantages,
                        "loss_fn": opts.get("loss_fn"),
                    },
                    "trainer": {"project_name": "rollwire", "experiment_name": spec.out.name},
                },
            }
        ),
    )
    return cfg


#: the sync's reference: the log-probs the training client's current weights give the completion
tinker_forward_reference = tinker_reference


def sft_warmup(
    training_client: Any, tokenizer: Any, conversations: Sequence[Any], spec: RunSpec
) -> list[float]:
    """``--sft``: ``spec.warmup_steps`` Adam steps of ``cross_entropy`` on the assistant turns of
    seeded batches of ``conversations``, on rLLM's LoRA training client before checkpoint 0
    (core's :func:`~rollwire.trainer.tinker_api.tinker_warmup`, as ``--trainer tinker`` warms
    up); each step's loss per labelled token."""
    if not conversations:
        raise ValueError("--sft: the warm-up has no conversations to learn from")
    return tinker_warmup(
        training_client, tokenizer, conversations, steps=spec.warmup_steps,
        batch_size=spec.warmup_batch_size, learning_rate=spec.warmup_learning_rate,
        seed=spec.seed,
    ).losses  # fmt: skip


def _tail_mean(losses: Sequence[float]) -> float | None:
    tail = list(losses[-10:])
    return sum(tail) / len(tail) if tail else None


def _group_by_rollout_group(rollouts: Sequence[Rollout]) -> list[Rollout]:
    """The rollouts in group order, so that each Episode's ``rollout_idx`` is its place in its group."""
    order: dict[str, list[Rollout]] = {}
    for r in rollouts:
        order.setdefault(r.group_id or r.rollout_id, []).append(r)
    return [r for members in order.values() for r in members]


class RllmPolicyTrainer:
    """LoRA training with rLLM's ``TinkerPolicyTrainer`` on a Tinker service (``--base-url``)."""

    capture = "tokens"

    def __init__(self, spec: RunSpec, *, warmup: Warmup | None = None) -> None:
        opts = spec.options
        if opts.get("base_url") is None or opts.get("base_model") is None:
            raise ValueError(
                "--trainer rllm trains on a running Tinker service: pass --base-url URL and "
                "--base-model NAME (hosted Tinker, or SkyRL's server: benchmarks/rllm_steps.py "
                "starts one on this machine)"
            )
        if spec.resume:
            raise ValueError("--resume is not supported with --trainer rllm: start a new --out")
        if spec.backend is not None:
            raise ValueError(
                "--backend: with --trainer rllm the Tinker service's sampler serves the policy"
            )
        if spec.beta:
            raise ValueError("--beta: rLLM's Tinker losses have no KL penalty; leave it at 0")
        if spec.lora_rank == 0:
            raise ValueError("--trainer rllm trains LoRA adapters: --lora-rank must be at least 1")
        self.spec = spec
        self.lora_rank = 8 if spec.lora_rank is None else spec.lora_rank
        #: sampler and trainer are two code paths: they agree to a few hundredths of a nat
        self.tolerance = float(opts.get("probe_tolerance", 0.05))
        self._warmup = warmup
        self.policy: Any = None  # rLLM's TinkerPolicyTrainer
        self._last: Export | None = None
        self._steps_done = 0
        #: checkpoint 0's sampler path (set by :meth:`start`)
        self.start_weights = ""

    @property
    def training_client(self) -> Any:
        """rLLM's Tinker training client (set by :meth:`start`)."""
        assert self.policy is not None, "start() first"
        return self.policy.training_client

    def start(self, spec: RunSpec) -> Start:
        """rLLM's ``initialize_async`` (a LoRA training client), the warm-up, checkpoint 0."""
        try:
            import tinker
            from rllm.trainer.tinker.tinker_policy_trainer import TinkerPolicyTrainer
        except ImportError as exc:
            raise ImportError(f"{exc}: {INSTALL_HINT}") from exc
        opts = spec.options
        base_model = str(opts["base_model"])
        config = rllm_config(spec, base_model, self.lora_rank)
        service = tinker.ServiceClient(
            base_url=str(opts["base_url"]), api_key=str(opts.get("api_key") or "tml-rollwire")
        )
        self.policy = TinkerPolicyTrainer(config, service)
        asyncio.run(self.policy.initialize_async())
        from rollwire.gateway.tokens.render import ChatRenderer

        tokenizer_dir = str(opts.get("tokenizer") or base_model)
        tokenizer = ChatRenderer.from_dir(tokenizer_dir).tokenizer
        start = Start(weights="", version="rllm-000000", tokenizer=tokenizer)
        if self._warmup is not None:
            t0 = time.perf_counter()
            spec.log(self._warmup(self.training_client, tokenizer, spec))
            start.warmup_seconds = time.perf_counter() - t0
        elif spec.sft is not None and spec.warmup_steps:
            from rollwire.trainer.training_run import warmup_conversations

            conversations = warmup_conversations(spec) or []
            t0 = time.perf_counter()
            losses = sft_warmup(self.training_client, tokenizer, conversations, spec)
            start.warmup_seconds = time.perf_counter() - t0
            start.warmup_steps, start.warmup_loss = len(losses), _tail_mean(losses)
            spec.log(
                f"warm-up: {len(losses)} cross_entropy steps in {start.warmup_seconds:.0f} s, "
                f"loss {losses[0]:.3f} -> {losses[-1]:.3f}"
            )
        # rLLM's initialize_async saved sampler "000000" before the warm-up: a checkpoint of the
        # same name would be the stale one (SkyRL loads a sampler checkpoint into the training
        # adapter's slot), so the start gets a name of its own
        saved = self.training_client.save_weights_for_sampler(name="rllm-start").result()
        start.weights = self.start_weights = str(saved.path)
        start.backend = {
            "url": str(opts["base_url"]).rstrip("/"),
            "kind": "tinker",
            "name": "tinker",
            "model": start.weights,
            "tokenizer": tokenizer_dir,
        }
        return start

    def _save(self, step: int) -> str:
        """rLLM's checkpoint (state + sampler weights + ``checkpoint.json``); the sampler's path."""
        asyncio.run(self.policy.save_checkpoint_and_get_sampling_client(step, do_save=True))
        folder = Path(self.policy.config.training.default_local_dir) / f"global_step_{step}"
        return str(json.loads((folder / "checkpoint.json").read_text())["sampler_path"])

    def update(self, batch: TrainBatch) -> dict[str, float]:
        """rLLM's episodes → trajectory groups → advantages + datums → ``forward_backward`` →
        ``optim_step``, on the step's rollouts (rLLM computes its own advantages: the rows'
        are not used)."""
        from rllm.trainer.algorithms import transform_episodes_to_trajectory_groups

        policy = self.policy
        episodes = to_episodes(_group_by_rollout_group(batch.rollouts))
        groups, transform_metrics = transform_episodes_to_trajectory_groups(
            episodes, policy.transform_config, policy.cf_config
        )
        if not groups:
            raise ValueError("rLLM kept no trajectory group of the batch (all rollouts failed?)")
        datums, trainer_logprobs, metrics = asyncio.run(
            policy.forward_backward_from_trajectory_groups(groups)
        )
        spec = self.spec
        self._steps_done += 1
        future, lr = asyncio.run(
            policy.optim_step_future(
                step=self._steps_done,
                total_steps=spec.steps,
                learning_rate=spec.learning_rate,
                beta1=spec.adam_beta1,
                beta2=float(policy.config.training.beta2),
                eps=float(policy.config.training.eps),
            )
        )
        asyncio.run(future.result_async())
        datum_list = (
            [d for ds in datums.values() for d in ds] if isinstance(datums, dict) else datums
        )
        stats = {k: float(v) for k, v in {**transform_metrics, **metrics}.items() if _number(v)}
        stats.update(_loss_stats(datum_list, trainer_logprobs))
        stats["datums"] = float(len(datum_list))
        stats["learning_rate"] = float(lr)
        t0 = time.perf_counter()
        path = self._save(self._steps_done)
        self._last = Export(path, f"rllm-{self._steps_done:06d}", time.perf_counter() - t0)
        return stats

    def export(self, step: int) -> Export:
        """The sampler checkpoint rLLM saved after the update (its ``tinker://`` path)."""
        assert self._last is not None
        return self._last

    def reference(self) -> Reference:
        """rLLM's training client scores the probe (its own forward pass)."""
        return tinker_forward_reference(self.training_client)

    def save(self, step: int) -> None:
        """Every update already saved rLLM's checkpoint (state and sampler)."""

    def finish(self) -> Path:
        """``--out/final.json``: where the trained policy lives on the service."""
        final = {
            "base_url": self.spec.options.get("base_url"),
            "base_model": self.spec.options.get("base_model"),
            "lora_rank": self.lora_rank,
            "policy_version": self._last.version if self._last else "rllm-000000",
            "model_path": self._last.weights if self._last else None,
            "rllm_checkpoints": str(self.spec.out / "rllm"),
            "written_at": time.time(),
        }
        path = self.spec.out / "final.json"
        path.write_bytes(orjson.dumps(final, option=orjson.OPT_INDENT_2))
        return path

    def close(self) -> None:
        """Nothing held beyond the service's clients (the service is not ours to stop)."""


def _loss_stats(datums: Sequence[Any], trainer_logprobs: Sequence[Any]) -> dict[str, float]:
    """The behaviour statistics over the masked tokens, and the loss the gradient was taken at:
    ``-mean(ratio * advantage)`` per datum, summed over datums (SkyRL's normalisation; the PPO
    clip does not bind before the update). Tinker returns only log-probs, so it is computed here."""
    trainer, sampled, loss = [], [], 0.0
    for datum, lp in zip(datums, trainer_logprobs):
        inputs = datum.loss_fn_inputs
        mask = np.asarray(inputs["mask"].data, np.float64) > 0.5
        old = np.asarray(inputs["logprobs"].data, np.float64)
        adv = np.asarray(inputs["advantages"].data, np.float64)
        new = np.asarray(lp.tolist() if hasattr(lp, "tolist") else lp, np.float64)
        trainer.append(new[mask])
        sampled.append(old[mask])
        ratio = np.exp(new - old) * mask
        loss += float(-(ratio * adv).sum() / max(len(mask), 1))
    return {**behaviour_stats(trainer, sampled), "loss": loss}


def _number(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
