"""verl 0.9.1's own actor, in this process: ``ActorRolloutRefWorker(role="actor")`` driving the
FSDP engine (FSDP2), its ``compute_log_prob`` and ``update_actor`` called as verl's PPO trainer
calls them (``RayPPOTrainer._compute_old_log_prob`` / ``_update_actor``), without Ray.

The padded batch goes to verl's no-padding form with verl's ``left_right_2_no_padding``; the loss
is verl's ``ppo_loss`` (``workers/utils/losses.py``: the vanilla clipped objective weighted by the
rollout correction's ``rollout_is_weights``, which :meth:`VerlActor.update` computes with verl's
``compute_rollout_correction_and_add_to_batch`` from the captured ``rollout_log_probs``, as the
trainer's decoupled mode does). Weights and arithmetic are float32: verl's bfloat16 default moves
log-probs by up to 0.3 nats from the servers' float32 ones, past any probe tolerance.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rollwire_verl.cpu_platform import use_cpu

__all__ = ["ActorSettings", "VerlActor", "micro_batch_size"]

#: verl's rollout-correction weights by token, by sequence, or none
ROLLOUT_IS_MODES = ("token", "sequence", "off")
#: the padded batch's tensors verl's actor reads (routing, step credit and rewards stay behind:
#: the FSDP engine replays no routing, and the advantages are the loop's)
_BATCH_KEYS = (
    "input_ids",
    "attention_mask",
    "position_ids",
    "prompts",
    "responses",
    "response_mask",
    "rollout_log_probs",
    "advantages",
)


@dataclass(frozen=True)
class ActorSettings:
    """What the actor is built with: its optimizer, its PPO loss, its rollout correction."""

    learning_rate: float = 1e-3
    adam_beta1: float = 0.0
    max_grad_norm: float = 1.0
    clip_ratio: float = 0.2
    loss_agg_mode: str = "token-mean"
    #: verl's ``rollout_is``: importance weights against the captured log-probs ("off": none)
    rollout_is: str = "token"
    rollout_is_threshold: float = 2.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rollout_is not in ROLLOUT_IS_MODES:
            raise ValueError(
                f"rollout_is must be one of {ROLLOUT_IS_MODES}, got {self.rollout_is!r}"
            )


def micro_batch_size(rows: int, wanted: int) -> int:
    """The micro-batch verl splits ``rows`` into: ``wanted`` rows, or the largest size under it
    that divides ``rows`` (verl's engine asserts that it divides); 0 means all rows at once."""
    if wanted <= 0 or wanted >= rows:
        return rows
    return max(d for d in range(1, wanted + 1) if rows % d == 0)


def _chatty_loggers() -> list[logging.Logger]:
    """verl's checkpoint manager logs every file it writes at INFO; torch.fx warns once about
    tracing when transformers' model first runs under FSDP."""
    from verl.utils.checkpoint import fsdp_checkpoint_manager

    return [fsdp_checkpoint_manager.logger, logging.getLogger("torch.fx._symbolic_trace")]


@contextlib.contextmanager
def _quiet(verbose: bool, *, prints: bool = False) -> Iterator[None]:
    """verl's inner workings kept off the run's output (unless ``verbose``): the checkpoint
    files it logs, and with ``prints`` the memory and model-size lines it prints while building
    the worker (stdout is the process's: only swapped where verl prints)."""
    if verbose:
        yield
        return
    loggers = [(lg, lg.level) for lg in _chatty_loggers()]
    for lg, _ in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()) if prints else contextlib.nullcontext():
            yield
    finally:
        for lg, level in loggers:
            lg.setLevel(level)


def _actor_config(model_dir: Path, settings: ActorSettings) -> Any:
    """``actor_rollout_ref`` of verl's generated PPO config with the actor set up for this."""
    import verl
    from omegaconf import OmegaConf

    full = OmegaConf.load(
        Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    )
    fp32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    override = {
        "actor_rollout_ref": {
            "model": {
                "path": str(model_dir),
                "use_remove_padding": False,  # flash-attention's packed path; eager on the CPU
                "enable_gradient_checkpointing": False,
                "override_config": {"attn_implementation": "eager"},
            },
            "actor": {
                "strategy": "fsdp2",
                "use_torch_compile": False,
                "use_dynamic_bsz": False,
                "ppo_mini_batch_size": 1,  # each update sets its own (the whole batch)
                "ppo_micro_batch_size_per_gpu": 1,
                "clip_ratio": settings.clip_ratio,
                "clip_ratio_low": settings.clip_ratio,
                "clip_ratio_high": settings.clip_ratio,
                "loss_agg_mode": settings.loss_agg_mode,
                "entropy_coeff": 0.0,
                "use_kl_loss": False,
                "data_loader_seed": settings.seed,
                "optim": {
                    "lr": settings.learning_rate,
                    "betas": [settings.adam_beta1, 0.999],
                    "weight_decay": 0.0,
                    "clip_grad": settings.max_grad_norm,
                    "lr_scheduler_type": "constant",
                },
                "fsdp_config": {
                    "strategy": "fsdp2",
                    "use_torch_compile": False,
                    "model_dtype": "fp32",
                    "dtype": "float32",
                    "mixed_precision": fp32,
                    "seed": settings.seed,
                },
            },
            "rollout": {"log_prob_micro_batch_size_per_gpu": 1, "n": 1},
        }
    }
    merged = OmegaConf.merge(full, OmegaConf.create(override))
    OmegaConf.resolve(merged)
    return merged.actor_rollout_ref


class VerlActor:
    """verl's actor worker on the model folder ``model_dir`` (a Hugging Face folder), on the CPU."""

    def __init__(self, model_dir: Path, settings: ActorSettings, *, verbose: bool = False) -> None:
        use_cpu()
        with warnings.catch_warnings():
            # verl lists every engine whose framework is missing (megatron, veomni, ...)
            warnings.filterwarnings("ignore", "(?s).*engine is not available", UserWarning)
            import verl.workers.engine  # noqa: F401  (where the list is made)
            from verl.workers.engine_workers import ActorRolloutRefWorker

        self.settings = settings
        self.verbose = verbose
        config = _actor_config(model_dir, settings)
        with _quiet(verbose, prints=True):
            worker = ActorRolloutRefWorker(config=config, role="actor")
            worker.init_model()
        self.worker: Any = worker
        self.engine: Any = worker.actor.engine

    # ------------------------------------------------------------------ scoring
    def log_probs(
        self, tensors: dict[str, np.ndarray], temperature: float, micro: int = 0
    ) -> np.ndarray:
        """``compute_log_prob`` of the padded batch ``tensors``: each response token's log-prob
        at ``temperature`` under the current weights, ``[B, R]`` (eval mode, no gradient)."""
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import no_padding_2_padding

        rows = int(tensors["input_ids"].shape[0])
        td = self._tensordict(tensors, temperature)
        tu.assign_non_tensor(
            td,
            calculate_entropy=False,
            compute_loss=False,
            micro_batch_size_per_gpu=micro_batch_size(rows, micro),
        )
        module = self.engine.module
        was_training = module.training
        try:
            with _quiet(self.verbose):
                out = self.worker.compute_log_prob(td)
        finally:
            module.train(was_training)
        lp = no_padding_2_padding(tu.get(out, "log_probs"), td)
        return np.asarray(lp.float().numpy(), dtype=np.float32)

    def score(
        self, prompt_ids: Sequence[int], completion_ids: Sequence[int], temperature: float
    ) -> list[float]:
        """The log-prob of each of ``completion_ids`` after ``prompt_ids`` (one row)."""
        p, r = len(prompt_ids), len(completion_ids)
        ids = np.asarray([[*map(int, prompt_ids), *map(int, completion_ids)]], np.int64)
        tensors = {
            "input_ids": ids,
            "attention_mask": np.ones_like(ids),
            "position_ids": np.arange(p + r, dtype=np.int64)[None, :],
            "prompts": ids[:, :p].copy(),
            "responses": ids[:, p:].copy(),
            "response_mask": np.ones((1, r), np.int64),
        }
        return [float(x) for x in self.log_probs(tensors, temperature)[0]]

    # ------------------------------------------------------------------ training
    def update(
        self,
        tensors: dict[str, np.ndarray],
        old_log_probs: np.ndarray,
        temperature: float,
        micro: int = 0,
    ) -> dict[str, float]:
        """One optimizer step of verl's PPO loss on the whole padded batch (one mini-batch, one
        epoch, micro-batches of ``micro`` rows whose gradients accumulate), after verl's rollout
        correction against ``rollout_log_probs``; the step's statistics."""
        from verl.utils import tensordict_utils as tu

        rows = int(tensors["input_ids"].shape[0])
        data = self._dataproto(tensors, temperature)
        data.batch["old_log_probs"] = torch.from_numpy(np.ascontiguousarray(old_log_probs))
        stats: dict[str, float] = {}
        if self.settings.rollout_is != "off":
            data, weights = self._rollout_correction(data)
            stats.update(weights)
        td = self._tensordict_of(data)
        tu.assign_non_tensor(
            td,
            calculate_entropy=True,
            distillation_use_topk=False,
            distillation_only=False,
            global_batch_size=rows,
            mini_batch_size=rows,
            epochs=1,
            seed=self.settings.seed,
            dataloader_kwargs={"shuffle": False},
            compute_loss=True,
            micro_batch_size_per_gpu=micro_batch_size(rows, micro),
        )
        with _quiet(self.verbose):
            out = self.worker.update_actor(td)
        metrics = tu.get(out, "metrics")
        stats.update(_update_stats(metrics))
        return stats

    def supervised_step(self, examples: Sequence[tuple[list[int], list[int]]]) -> float:
        """One optimizer step of verl's ``sft_loss`` (the mean next-token loss over the tokens
        whose label is set) on ``examples`` of ``(input_ids, labels)``; the loss."""
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.losses import sft_loss

        worker = self.worker.actor
        if worker.loss_fn is None or getattr(worker.loss_fn, "func", None) is not sft_loss:
            worker.set_loss_fn(partial(sft_loss, config=None))
        ids = [torch.tensor(x, dtype=torch.int64) for x, _ in examples]
        labels = [torch.tensor([int(y >= 0) for y in ys], dtype=torch.int64) for _, ys in examples]
        positions = [torch.arange(len(x), dtype=torch.int64) for x, _ in examples]
        td = tu.get_tensordict(
            {
                "input_ids": torch.nested.as_nested_tensor(ids, layout=torch.jagged),
                "position_ids": torch.nested.as_nested_tensor(positions, layout=torch.jagged),
                "loss_mask": torch.nested.as_nested_tensor(labels, layout=torch.jagged),
            },
            non_tensor_dict={
                "temperature": 1.0,
                "global_token_num": [len(x) for x, _ in examples],
                "micro_batch_size_per_gpu": len(examples),
                "use_remove_padding": False,
                "use_dynamic_bsz": False,
            },
        )
        with _quiet(self.verbose):
            out = worker.train_batch(td)
        return float(tu.get(out, "metrics")["loss"])

    # ------------------------------------------------------------------ weights
    def state_dict(self) -> dict[str, torch.Tensor]:
        """A copy of the full (unsharded) weights, under the Hugging Face model's own parameter
        names (a one-rank shard is the live tensor itself: copied, so the update leaves it be)."""
        out: dict[str, torch.Tensor] = {}
        for name, value in self.engine.module.state_dict().items():
            full = value.full_tensor() if hasattr(value, "full_tensor") else value
            out[name] = full.detach().to("cpu", copy=True)
        return out

    def save_checkpoint(self, folder: Path) -> None:
        """verl's own FSDP checkpoint (weights, optimizer, RNG) into ``folder``."""
        with _quiet(self.verbose, prints=True):
            self.worker.save_checkpoint(str(folder))

    def load_checkpoint(self, folder: Path) -> None:
        """Continue from a :meth:`save_checkpoint` folder."""
        with _quiet(self.verbose, prints=True):
            self.worker.load_checkpoint(str(folder), del_local_after_load=False)

    def close(self) -> None:
        """Drop the worker (the process group stays: verl's next actor in this process uses it)."""
        self.worker = None
        self.engine = None

    # ------------------------------------------------------------------ verl's batch
    def _dataproto(self, tensors: dict[str, np.ndarray], temperature: float) -> Any:
        from verl import DataProto

        batch = {
            k: torch.from_numpy(np.ascontiguousarray(v))
            for k, v in tensors.items()
            if k in _BATCH_KEYS
        }
        return DataProto.from_dict(tensors=batch, meta_info={"temperature": float(temperature)})

    def _tensordict_of(self, data: Any) -> Any:
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import left_right_2_no_padding

        lengths = data.batch["attention_mask"].sum(dim=1).tolist()
        td = left_right_2_no_padding(data.to_tensordict())
        tu.assign_non_tensor(td, global_token_num=[int(n) for n in lengths])
        return td

    def _tensordict(self, tensors: dict[str, np.ndarray], temperature: float) -> Any:
        return self._tensordict_of(self._dataproto(tensors, temperature))

    def _rollout_correction(self, data: Any) -> tuple[Any, dict[str, float]]:
        """verl's decoupled rollout correction: ``rollout_is_weights`` from ``old_log_probs``
        (the trainer's) and ``rollout_log_probs`` (the captured ones)."""
        from verl.trainer.config.algorithm import RolloutCorrectionConfig
        from verl.trainer.ppo.rollout_corr_helper import (
            compute_rollout_correction_and_add_to_batch,
        )

        config = RolloutCorrectionConfig(
            rollout_is=self.settings.rollout_is,
            rollout_is_threshold=self.settings.rollout_is_threshold,
        )
        data, _ = compute_rollout_correction_and_add_to_batch(data, config)
        mask = data.batch["response_mask"].bool()
        weights = data.batch["rollout_is_weights"][mask]
        if not weights.numel():
            return data, {}
        return data, {"is_weight_min": float(weights.min()), "is_weight_max": float(weights.max())}


#: verl's update metrics the step keeps, under rollwire's names
_VERL_METRICS = {
    "actor/pg_loss": "pg_loss",
    "actor/pg_clipfrac": "clip_ratio",
    "actor/ppo_kl": "ppo_kl",
    "actor/entropy_loss": "entropy",
}


def _mean(value: Any) -> float | None:
    values = value if isinstance(value, list) else [value]
    numbers = [float(v.value if hasattr(v, "value") else v) for v in values]
    numbers = [v for v in numbers if np.isfinite(v)]
    return sum(numbers) / len(numbers) if numbers else None


def _update_stats(metrics: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, name in (("loss", "loss"), ("grad_norm", "grad_norm"), *_VERL_METRICS.items()):
        if key in metrics:
            value = _mean(metrics[key])
            if value is not None:
                out[name] = value
    return out
