"""A training step through the Tinker API: ``forward_backward`` → ``optim_step`` → a new sampler.

The same code talks to hosted Tinker (``TINKER_API_KEY``, its default base URL), a SageMaker
training session or SkyRL's self-hosted server (``base_url``): only the configuration differs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from rollwire.trainer.tinker_api import tinker_reference
from rollwire.trainer.train_batch import behaviour_stats
from rollwire_tinker.datums import TinkerDatum

__all__ = [
    "StepResult",
    "TinkerConfig",
    "TinkerTrainer",
    "loss_stats",
    "ratio_stats",
    "tinker_reference",
]

LossFn = Literal["importance_sampling", "ppo"]


@dataclass
class TinkerConfig:
    """Where the Tinker service is, which model to train, and how."""

    base_model: str
    #: None: the SDK's default (hosted Tinker) or ``$TINKER_BASE_URL``
    base_url: str | None = None
    #: None: ``$TINKER_API_KEY``; SkyRL's server accepts any key that starts with ``tml-``
    api_key: str | None = None
    lora_rank: int = 8
    #: the LoRA adapter's initialisation seed (None: the service picks one at random)
    seed: int | None = None
    loss_fn: LossFn = "importance_sampling"
    #: PPO's ratio clip, as ``loss_fn_config`` (only sent with ``loss_fn="ppo"``)
    clip_low: float = 0.8
    clip_high: float = 1.2
    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    #: the policy version of step n is ``f"{version_prefix}-{n:06d}"``
    version_prefix: str = "tinker"
    #: False: ``save_weights_and_get_sampling_client()`` (an ephemeral sampler, for this process);
    #: True: ``save_weights_for_sampler(version)`` and a sampler of that checkpoint, whose
    #: ``tinker://`` path a gateway's ``tinker`` backend can swap to (``StepResult.model_path``)
    named_checkpoints: bool = False

    def __post_init__(self) -> None:
        if self.loss_fn not in ("importance_sampling", "ppo"):
            raise ValueError(f"loss_fn must be importance_sampling or ppo, got {self.loss_fn!r}")


@dataclass
class StepResult:
    """What one step did: the new sampler's version, the loss statistics and where time went."""

    step: int
    policy_version: str
    sampling_client: Any
    #: the sampler checkpoint's ``tinker://`` path (with ``named_checkpoints``), else None
    model_path: str | None
    num_datums: int
    trained_tokens: int
    metrics: dict[str, float] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


def _sdk() -> Any:
    try:
        import tinker
    except ImportError:
        raise ImportError(
            'the Tinker trainer needs the Tinker SDK: pip install "rollwire-tinker[tinker]" '
            "(tinker==0.18.2 for SkyRL's server 0.3.0)"
        ) from None
    return tinker


def loss_stats(datums: Sequence[TinkerDatum], outputs: Sequence[Any]) -> dict[str, float]:
    """The mean per-token loss over the trained tokens, when the service returns
    ``elementwise_loss`` (SkyRL does; hosted Tinker reports ``loss:sum`` in its metrics)."""
    total, count = 0.0, 0
    for datum, out in zip(datums, outputs):
        if "elementwise_loss" not in out:
            return {}
        trained = datum.trained()
        total += float(np.asarray(out["elementwise_loss"].to_numpy())[trained].sum())
        count += int(trained.sum())
    return {"loss": total / count} if count else {}


def ratio_stats(
    datums: Sequence[TinkerDatum],
    trainer_logprobs: Sequence[np.ndarray],
    loss_fn: LossFn,
    clip: tuple[float, float],
) -> dict[str, float]:
    """The trainer's log-probs against the behaviour policy's over the trained tokens
    (:func:`~rollwire.trainer.train_batch.behaviour_stats`, one meaning for every trainer), and
    with ``ppo`` the fraction of tokens whose ratio the clip cut."""
    trainer = [np.asarray(lp, np.float64)[d.trained()] for d, lp in zip(datums, trainer_logprobs)]
    sampled = [d.logprobs[d.trained()] for d in datums]
    out = behaviour_stats(trainer, sampled)
    if out and loss_fn == "ppo":
        ratio = np.exp(np.concatenate([t - s for t, s in zip(trainer, sampled)]))
        out["clip_ratio"] = float(((ratio < clip[0]) | (ratio > clip[1])).mean())
    return out


class TinkerTrainer:
    """One LoRA training run on a Tinker service; :meth:`step` trains on datums and swaps the sampler."""

    def __init__(self, config: TinkerConfig, *, service_client: Any = None) -> None:
        self.config = config
        self._service = service_client
        self._training: Any = None
        self.steps = 0
        self.sampling_client: Any = None
        self.policy_version: str | None = None
        #: the ``tinker://`` path of the newest sampler checkpoint (``named_checkpoints``)
        self.model_path: str | None = None

    @property
    def service_client(self) -> Any:
        """The SDK's ``ServiceClient`` (created on first use)."""
        if self._service is None:
            tinker = _sdk()
            kwargs: dict[str, Any] = {}
            base_url = self.config.base_url or os.environ.get("TINKER_BASE_URL")
            if base_url:
                kwargs["base_url"] = base_url
            if self.config.api_key:
                kwargs["api_key"] = self.config.api_key
            self._service = tinker.ServiceClient(**kwargs)
        return self._service

    @property
    def training_client(self) -> Any:
        """The LoRA ``TrainingClient`` of ``config.base_model`` (created on first use)."""
        if self._training is None:
            self._training = self.service_client.create_lora_training_client(
                base_model=self.config.base_model, rank=self.config.lora_rank, seed=self.config.seed
            )
        return self._training

    def version_name(self, step: int) -> str:
        """The policy version (and sampler checkpoint name) of the weights after ``step`` steps."""
        return f"{self.config.version_prefix}-{step:06d}"

    def save_sampler(self, name: str) -> str:
        """Save the current weights as sampler checkpoint ``name``; returns its ``tinker://`` path."""
        path = str(self.training_client.save_weights_for_sampler(name).result().path)
        self.model_path, self.policy_version = path, name
        return path

    def step(self, datums: Sequence[TinkerDatum]) -> StepResult:
        """``forward_backward`` on ``datums``, ``optim_step``, then a new sampling client."""
        if not datums:
            raise ValueError("no datums to train on: the batch had no completed rollout")
        tinker = _sdk()
        cfg = self.config
        client = self.training_client
        loss_config = (
            {"clip_low_threshold": cfg.clip_low, "clip_high_threshold": cfg.clip_high}
            if cfg.loss_fn == "ppo"
            else None
        )
        t0 = time.perf_counter()
        fb = client.forward_backward(
            [d.to_sdk() for d in datums], cfg.loss_fn, loss_fn_config=loss_config
        ).result()
        t1 = time.perf_counter()
        client.optim_step(
            tinker.types.AdamParams(
                learning_rate=cfg.learning_rate, beta1=cfg.beta1, beta2=cfg.beta2, eps=cfg.eps
            )
        ).result()
        t2 = time.perf_counter()
        version = self.version_name(self.steps + 1)
        model_path = None
        if cfg.named_checkpoints:
            model_path = self.save_sampler(version)
            sampler = client.create_sampling_client(model_path)
        else:
            sampler = client.save_weights_and_get_sampling_client()
        t3 = time.perf_counter()
        self.steps += 1
        self.sampling_client, self.policy_version = sampler, version
        trainer_logprobs = [out["logprobs"].to_numpy() for out in fb.loss_fn_outputs]
        metrics = {k: float(v) for k, v in (fb.metrics or {}).items()}
        metrics.update(loss_stats(datums, fb.loss_fn_outputs))
        metrics.update(
            ratio_stats(datums, trainer_logprobs, cfg.loss_fn, (cfg.clip_low, cfg.clip_high))
        )
        return StepResult(
            step=self.steps,
            policy_version=version,
            sampling_client=sampler,
            model_path=model_path,
            num_datums=len(datums),
            trained_tokens=int(sum(int(d.trained().sum()) for d in datums)),
            metrics=metrics,
            seconds={"forward_backward": t1 - t0, "optim_step": t2 - t1, "save_sampler": t3 - t2},
        )
