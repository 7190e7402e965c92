"""A Tinker service as ``rollwire train``'s trainer (:class:`rollwire.trainer.loop.PolicyTrainer`).

The service's sampler is the inference server: the gateway's ``tinker`` backend samples with the
current sampler checkpoint (tokens capture: the gateway renders the chat template, the sampler
returns ids and log-probs). Each update turns the loop's rows into datums (every row, its
rollout's advantage on each sampled token) for ``forward_backward`` (``importance_sampling`` on
the captured log-probs, or ``ppo``) and ``optim_step``; the export is
``save_weights_for_sampler``, whose ``tinker://`` path the loop's sync swaps the gateway to. The
built-in task starts with a supervised warm-up through the same service.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import orjson

from rollwire.trainer.loop import Export, RunSpec, Start
from rollwire.trainer.train_batch import TrainBatch
from rollwire.trainer.weight_sync import Reference
from rollwire_tinker.datums import row_datum
from rollwire_tinker.service import Service, tinker_service
from rollwire_tinker.trainer import StepResult, TinkerConfig, TinkerTrainer, tinker_reference
from rollwire_tinker.warmup import tinker_warmup

__all__ = ["TinkerPolicyTrainer"]


class TinkerPolicyTrainer:
    """LoRA training on a Tinker service (hosted, SageMaker, or SkyRL's started here)."""

    capture = "tokens"

    def __init__(self, spec: RunSpec) -> None:
        opts = spec.options
        if spec.resume:
            raise ValueError(
                "--resume is not supported with --trainer tinker: start a new --out (the service "
                "keeps the sampler checkpoints of the old run)"
            )
        if spec.backend is not None:
            raise ValueError(
                "--backend is an inference server of its own; with --trainer tinker the Tinker "
                "service's sampler serves the policy (--base-url)"
            )
        if spec.beta:
            raise ValueError(
                "--beta: Tinker's importance_sampling and ppo losses have no KL penalty to the "
                "starting policy; leave it at 0 with --trainer tinker"
            )
        if spec.lora_rank == 0:
            raise ValueError(
                "--trainer tinker trains LoRA adapters: --lora-rank must be at least 1"
            )
        if spec.bf16:
            raise ValueError("--bf16: the Tinker service chooses its own dtypes")
        self.spec = spec
        self.lora_rank = 8 if spec.lora_rank is None else spec.lora_rank
        self.loss_fn = str(opts.get("loss_fn", "importance_sampling"))
        if self.loss_fn not in ("importance_sampling", "ppo"):
            raise ValueError(f"loss_fn must be importance_sampling or ppo, got {self.loss_fn!r}")
        #: sampler and trainer are two code paths: they agree to a few hundredths of a nat
        self.tolerance = float(opts.get("probe_tolerance", 0.05))
        self._stack = contextlib.ExitStack()
        self.service: Service | None = None
        self.trainer: TinkerTrainer | None = None
        self._last: StepResult | None = None

    def start(self, spec: RunSpec) -> Start:
        """Start (or reach) the service, warm the built-in task's policy up, save checkpoint 0."""
        opts = spec.options
        service = self._stack.enter_context(
            tinker_service(
                spec.out,
                base_url=opts.get("base_url"),
                base_model=opts.get("base_model"),
                model=spec.model,
                seed=spec.seed,
                lora_rank=self.lora_rank,
                max_batch=int(opts.get("max_batch", 32)),
            )
        )
        self.service = service
        self.trainer = TinkerTrainer(
            TinkerConfig(
                base_model=service.base_model,
                base_url=service.base_url,
                api_key=opts.get("api_key") or ("tml-rollwire" if service.local else None),
                lora_rank=self.lora_rank,
                seed=spec.seed,
                loss_fn=self.loss_fn,  # type: ignore[arg-type]
                learning_rate=spec.learning_rate,
                beta1=spec.adam_beta1,
                beta2=0.999,
                named_checkpoints=True,
            )
        )
        from rollwire.gateway.tokens.render import ChatRenderer

        tokenizer = ChatRenderer.from_dir(service.tokenizer).tokenizer
        start = Start(weights="", version=self.trainer.version_name(0), tokenizer=tokenizer)
        embedded = spec.model is None and opts.get("base_url") is None
        from rollwire.trainer.training_run import warmup_conversations

        # --sft warms any model up; the built-in task's teacher only the embedded one
        wanted = spec.sft is not None or (spec.agent is None and embedded)
        conversations = warmup_conversations(spec) if spec.warmup_steps and wanted else None
        if conversations is not None:
            warm = tinker_warmup(
                self.trainer.training_client,
                tokenizer,
                conversations,
                steps=spec.warmup_steps,
                learning_rate=spec.warmup_learning_rate,
                batch_size=spec.warmup_batch_size,
                seed=spec.seed,
            )
            start.warmup_steps, start.warmup_loss = warm.steps, warm.loss
            start.warmup_seconds = warm.seconds
            spec.log(
                f"warm-up: {warm.steps} cross_entropy steps in {warm.seconds:.0f} s, "
                f"loss {warm.losses[0]:.3f} -> {warm.loss:.3f}"
            )
        start.weights = self.trainer.save_sampler(start.version)
        start.backend = {
            "url": service.base_url,
            "kind": "tinker",
            "name": "tinker",
            "model": start.weights,
            "tokenizer": service.tokenizer,
        }
        return start

    def update(self, batch: TrainBatch) -> dict[str, float]:
        """``forward_backward`` on every row's datum, ``optim_step``, a new sampler checkpoint."""
        assert self.trainer is not None
        datums = [row_datum(r.row, r.advantage) for r in batch.rows]
        result = self.trainer.step(datums)
        self._last = result
        stats = dict(result.metrics)
        stats["datums"] = float(result.num_datums)
        return stats

    def export(self, step: int) -> Export:
        """The sampler checkpoint the update saved (its ``tinker://`` path)."""
        result = self._last
        assert result is not None and result.model_path is not None
        return Export(result.model_path, result.policy_version, result.seconds["save_sampler"])

    def reference(self) -> Reference:
        """The trainer's own forward pass (``cross_entropy``) scores the probe."""
        assert self.trainer is not None
        return tinker_reference(self.trainer.training_client)  # type: ignore[no-any-return]

    def save(self, step: int) -> None:
        """Every step already saved a sampler checkpoint on the service; nothing more to keep."""

    def finish(self) -> Path:
        """``--out/final.json``: where the trained policy lives on the service."""
        assert self.service is not None and self.trainer is not None
        final = {
            "base_url": self.service.base_url,
            "base_model": self.service.base_model,
            "lora_rank": self.lora_rank,
            "loss_fn": self.loss_fn,
            "policy_version": self.trainer.policy_version,
            "model_path": self.trainer.model_path,
            "local_server": self.service.local,
            "written_at": time.time(),
        }
        path = self.spec.out / "final.json"
        path.write_bytes(orjson.dumps(final, option=orjson.OPT_INDENT_2))
        return path

    def close(self) -> None:
        """Stop SkyRL's server when this run started it."""
        self._stack.close()
