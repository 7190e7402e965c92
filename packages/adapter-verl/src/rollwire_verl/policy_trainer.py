"""verl as ``rollwire train``'s trainer (:class:`rollwire.trainer.loop.PolicyTrainer`).

Each update is verl 0.9.1's own actor (:class:`~rollwire_verl.actor.VerlActor`: the FSDP
engine, ``compute_log_prob``, verl's rollout correction, ``update_actor`` with verl's PPO loss)
on the rows the loop built — every row of every completed rollout, each with its rollout's
advantage on every token the policy sampled (:mod:`rollwire_verl.train_rows`) — as one
mini-batch: one optimizer step per loop step, micro-batches accumulating into it. It runs on the
CPU, in this process, in float32. The probe's reference is the actor's own ``compute_log_prob``.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from rollwire.trainer.loop import Export, RunSpec, Start
from rollwire.trainer.train_batch import TrainBatch, behaviour_stats
from rollwire.trainer.training_run import latest_checkpoint
from rollwire.trainer.weight_sync import Reference
from rollwire_verl.actor import ROLLOUT_IS_MODES, ActorSettings, VerlActor, micro_batch_size
from rollwire_verl.policy_folder import PolicyFolders
from rollwire_verl.train_rows import train_arrays
from rollwire_verl.warmup import StartingPolicy, warmed_up_policy

__all__ = ["LOSS_AGG_MODES", "ROLLOUT_IS_MODES", "VerlTrainer"]

#: verl's loss aggregations (``actor.loss_agg_mode``)
LOSS_AGG_MODES = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
#: float32 actor against float32 servers: they agree to ~1e-5
TOLERANCE = 1e-3


def _settings(spec: RunSpec) -> ActorSettings:
    """The actor of ``spec``; what verl's actor cannot do here is an error that says so."""
    if spec.beta:
        raise ValueError(
            f"--beta {spec.beta:g}: the verl trainer has no reference model for a KL penalty; "
            "run it with --beta 0 (or --trainer trl)"
        )
    if spec.lora_rank:
        raise ValueError(
            f"--lora-rank {spec.lora_rank}: the verl trainer trains the full weights; "
            "run it with --lora-rank 0 (or --trainer trl)"
        )
    if spec.bf16:
        raise ValueError(
            "--bf16: verl's bfloat16 actor scores up to 0.3 nats away from the servers' float32 "
            "log-probs on the CPU, past any probe tolerance; the verl trainer runs float32"
        )
    opts = spec.options
    loss_agg = str(opts.get("loss_agg_mode", "token-mean"))
    if loss_agg not in LOSS_AGG_MODES:
        raise ValueError(f"loss_agg_mode must be one of {LOSS_AGG_MODES}, got {loss_agg!r}")
    return ActorSettings(
        learning_rate=spec.learning_rate,
        adam_beta1=spec.adam_beta1,
        max_grad_norm=float(opts.get("max_grad_norm", 1.0)),
        clip_ratio=float(opts.get("clip_ratio", 0.2)),
        loss_agg_mode=loss_agg,
        rollout_is=str(opts.get("rollout_is", "token")),
        rollout_is_threshold=float(opts.get("rollout_is_threshold", 2.0)),
        seed=spec.seed,
    )


class VerlTrainer:
    """verl's actor as the loop's update (module docstring); one instance per run."""

    capture = "passthrough"

    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        self.settings = _settings(spec)
        self.tolerance = TOLERANCE
        torch.set_num_threads(max(1, int(spec.options.get("threads", 1))))
        self.actor: VerlActor | None = None
        self.policy: StartingPolicy | None = None
        self.folders: PolicyFolders | None = None
        self.pad_token_id = 0
        self._exports: list[Path] = []

    # ------------------------------------------------------------------ start
    def start(self, spec: RunSpec) -> Start:
        """The starting policy (a resumed checkpoint, ``--model``, or the engine model after
        verl's own supervised warm-up), loaded into verl's actor."""
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging

        if not spec.verbose:
            hf_logging.disable_progress_bar()
        fresh = self._fresh_policy(spec)
        step, checkpoint = 0, None
        if spec.resume:
            found = latest_checkpoint(spec.out / "checkpoints")
            if found is None:
                raise ValueError(f"--resume: no checkpoint under {spec.out / 'checkpoints'}")
            checkpoint, step = found
        self.policy = fresh
        self.folders = PolicyFolders(fresh.folder, fresh.tokenizer_folder)
        self.actor = VerlActor(fresh.folder, self.settings, verbose=spec.verbose)
        weights = fresh.folder
        if checkpoint is not None:  # the servers load the checkpoint's weights as a full model
            self.actor.load_checkpoint(checkpoint / "actor")
            weights = self.folders.write(
                self.actor.state_dict(), spec.out / "policy" / f"resume-{step}"
            )
        tokenizer = AutoTokenizer.from_pretrained(fresh.tokenizer_folder)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.pad_token_id = int(pad)
        return Start(
            weights=str(Path(weights).resolve()),
            version=str(step),
            step=step,
            tokenizer=tokenizer,
            warmup_steps=fresh.warmup_steps,
            warmup_loss=fresh.warmup_loss,
            warmup_seconds=fresh.warmup_seconds,
        )

    def _fresh_policy(self, spec: RunSpec) -> StartingPolicy:
        from rollwire.trainer.training_run import warmup_conversations

        conversations = warmup_conversations(spec)
        if conversations is None and spec.model is not None:
            return StartingPolicy(Path(spec.model))
        return warmed_up_policy(  # no conversations: the engine's model as it is
            spec.out,
            conversations or [],
            seed=spec.seed,
            steps=spec.warmup_steps if conversations else 0,
            learning_rate=spec.warmup_learning_rate,
            batch_size=spec.warmup_batch_size,
            verbose=spec.verbose,
            base=spec.model,
        )

    # ------------------------------------------------------------------ update
    def update(self, batch: TrainBatch) -> dict[str, float]:
        """One optimizer step of verl's actor on every row of ``batch`` (module docstring)."""
        actor = self._actor()
        arrays = train_arrays(batch.rows, pad_token_id=self.pad_token_id)
        t = arrays.batch.tensors
        micro = self.spec.micro_batch_size
        # the trainer's log-probs before the update: verl's old_log_probs (its proximal anchor)
        old = actor.log_probs(t, self.spec.temperature, micro)
        mask = t["response_mask"].astype(bool)
        sampled = t["rollout_log_probs"]
        stats = behaviour_stats(
            [old[i][mask[i]] for i in range(len(arrays))],
            [sampled[i][mask[i]] for i in range(len(arrays))],
        )
        stats.update(actor.update(t, old, self.spec.temperature, micro))
        stats["rows"] = float(len(arrays))
        stats["micro_batches"] = float(len(arrays) // micro_batch_size(len(arrays), micro))
        return stats

    # ------------------------------------------------------------------ weights
    def export(self, step: int) -> Export:
        """The actor's weights as a Hugging Face folder under ``--out/policy``; the newest two
        are kept."""
        t0 = time.perf_counter()
        folder = self._write(self.spec.out / "policy" / f"step-{step}")
        self._exports.append(folder)
        for old in self._exports[:-2]:
            shutil.rmtree(old, ignore_errors=True)
        self._exports = self._exports[-2:]
        return Export(str(folder.resolve()), str(step), time.perf_counter() - t0)

    def reference(self) -> Reference:
        """Scores with verl's actor as it is now (``compute_log_prob``: eval mode, no gradient,
        the run's temperature); the module's training mode is restored after."""
        spec = self.spec

        def score(prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
            return self._actor().score(prompt_ids, completion_ids, spec.temperature)

        return score

    def save(self, step: int) -> None:
        """``--out/checkpoints/step-N``: verl's own FSDP checkpoint of the actor (weights,
        optimizer, RNG) and what started the run; the newest two are kept."""
        assert self.policy is not None
        root = self.spec.out / "checkpoints"
        folder = root / f"step-{step}"
        tmp = root / f".step-{step}.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        self._actor().save_checkpoint(tmp / "actor")
        state = {"step": step, "start": str(self.policy.folder), "trainer": "verl"}
        (tmp / "state.json").write_text(json.dumps(state))
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
        done = sorted((p for p in root.glob("step-*") if p.is_dir()), key=lambda p: int(p.name[5:]))
        for old in done[:-2]:
            shutil.rmtree(old, ignore_errors=True)

    def finish(self) -> Path:
        """``--out/final``: the trained policy as a model folder."""
        return self._write(self.spec.out / "final")

    def close(self) -> None:
        """Drop verl's actor."""
        if self.actor is not None:
            self.actor.close()
            self.actor = None

    def _actor(self) -> VerlActor:
        if self.actor is None:
            raise RuntimeError("the verl trainer has no actor: call start() first")
        return self.actor

    def _write(self, folder: Path) -> Path:
        assert self.folders is not None
        return self.folders.write(self._actor().state_dict(), folder)
