"""TRL as ``rollwire train``'s trainer (:class:`rollwire.trainer.loop.PolicyTrainer`).

Each update is TRL's GRPO loss (``GRPOTrainer._compute_loss``: its ``loss_type``, clipping, KL
penalty and its importance-sampling correction against the captured log-probs) on the rows the
loop built — every row of every completed rollout, each with its rollout's advantage — in
micro-batches whose gradients accumulate into one AdamW step. The model lives on the GPU when
there is one; the probe's reference scores on the model's own device, in eval mode.

With ``--lora-rank`` each export is the adapter alone (PEFT's folder: ``adapter_config.json`` +
``adapter_model.safetensors``), which the servers load by name on the base they serve; LoRA then
adapts the modules every server applies adapters to (:data:`SERVED_LORA_TARGETS`).
``--lora-sync merged`` exports the base with the deltas merged in instead (LoRA on every linear
layer), for servers that take no adapter.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rollwire.trainer.loop import Export, RunSpec, Start
from rollwire.trainer.train_batch import TrainBatch, TrainRow, behaviour_stats
from rollwire.trainer.training_run import latest_checkpoint
from rollwire.trainer.weight_sync import Reference
from rollwire_trl.policy import StartingPolicy, warmed_up_policy
from rollwire_trl.roles import (
    activate_role,
    load_role_adapters,
    role_adapters,
    save_role_adapter,
)
from rollwire_trl.samples import pad_rows
from rollwire_trl.sync import save_policy

__all__ = [
    "IMPORTANCE_MODES",
    "LORA_SYNCS",
    "SERVED_LORA_TARGETS",
    "TrlTrainer",
    "grpo_config",
    "importance_ratio",
    "lora_config",
    "tolerance_for",
]

#: TRL's importance-sampling modes, and "off"
IMPORTANCE_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "off")
#: what a LoRA run pushes to the servers: the adapter alone, or the model with it merged in
LORA_SYNCS = ("adapter", "merged")
#: the modules an adapter sync trains (PEFT's names on Llama and Mixtral): those vLLM and the
#: embedded engine apply a loaded adapter to (Mixtral's fused experts are not among them)
SERVED_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: TRL log keys the update keeps, under rollwire's names
_TRL_METRICS = {
    "clip_ratio/region_mean": "clip_ratio",
    "clip_ratio/low_mean": "clip_ratio_low",
    "clip_ratio/high_mean": "clip_ratio_high",
    "entropy": "entropy",
}


def tolerance_for(bf16: bool) -> float:
    """The probe's tolerance: float32 training against a float32 server agree to ~1e-5; bfloat16
    weights scored in bfloat16 against the server's float32 arithmetic differed by up to 0.106
    nats on the CPU test's probe (8 bits of mantissa), so a bf16 run accepts 0.25."""
    return 0.25 if bf16 else 1e-3


class TrlTrainer:
    """GRPO through TRL's loss (module docstring); one instance per run."""

    capture = "passthrough"

    def __init__(self, spec: RunSpec) -> None:
        opts = spec.options
        mode = str(opts.get("importance_sampling", "token_truncate"))
        if mode not in IMPORTANCE_MODES:
            raise ValueError(f"importance_sampling must be one of {IMPORTANCE_MODES}, got {mode!r}")
        rank = 0 if spec.lora_rank is None else spec.lora_rank
        if rank < 0:
            raise ValueError(f"lora_rank must be 0 (full weights) or a positive rank, got {rank}")
        lora_sync = str(opts.get("lora_sync", "adapter"))
        if lora_sync not in LORA_SYNCS:
            raise ValueError(f"lora_sync must be one of {LORA_SYNCS}, got {lora_sync!r}")
        #: exports are LoRA adapters (a --lora-rank run with --lora-sync adapter)
        self.exports_adapter = bool(rank) and lora_sync == "adapter"
        #: one adapter (and optimizer) per role (``--roles``); ``role``: the one acted on
        self.roles: list[str] = list(spec.roles or [])
        self.role: str | None = None
        if self.roles and not self.exports_adapter:
            raise ValueError("--roles trains one LoRA adapter per role: give --lora-rank R")
        self.optimizers: dict[str, Any] = {}
        self.spec = spec
        self.lora_rank = rank
        self.importance_sampling = mode
        self.is_clip_max = float(opts.get("is_clip_max", 3.0))
        self.loss_type = str(opts.get("loss_type", "dapo"))
        self.max_grad_norm = float(opts.get("max_grad_norm", 1.0))
        self.tolerance = tolerance_for(spec.bf16)
        torch.set_num_threads(int(opts.get("threads", 1)))
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model: Any = None
        self.grpo: Any = None
        self.optimizer: Any = None
        self.policy: StartingPolicy | None = None
        self._exports: list[Path] = []

    # ------------------------------------------------------------------ start
    def start(self, spec: RunSpec) -> Start:
        """The starting policy (a resumed checkpoint, ``--model``, or the warmed-up engine
        model), loaded into TRL; the servers are given what it holds."""
        if not spec.verbose:
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
        fresh = self._fresh_policy(spec)
        step, checkpoint = 0, None
        if spec.resume:
            found = latest_checkpoint(spec.out / "checkpoints")
            if found is None:
                raise ValueError(f"--resume: no checkpoint under {spec.out / 'checkpoints'}")
            checkpoint, step = found
        self.policy = fresh
        self._load(fresh.folder, checkpoint)
        weights, adapter, adapters = fresh.folder, None, None
        resumed = spec.out / "policy" / f"resume-{step}"
        if checkpoint is not None and self.roles:  # the base, then each role's adapter
            adapters = {
                role: str(save_role_adapter(self.model, role, resumed / role).resolve())
                for role in self.roles
            }
        elif checkpoint is not None and self.exports_adapter:  # the base, then the adapter
            adapter = str(self._save_adapter(resumed).resolve())
        elif checkpoint is not None:  # the servers load the checkpoint's weights as a full model
            weights = save_policy(self.model, resumed, fresh.tokenizer_folder)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(fresh.tokenizer_folder)
        return Start(
            weights=str(Path(weights).resolve()),
            version=str(step),
            step=step,
            tokenizer=tokenizer,
            adapter=adapter,
            adapters=adapters,
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
            micro_batch_size=spec.micro_batch_size,
            batch_size=spec.warmup_batch_size,
            base=spec.model,
        )

    def _load(self, folder: Path, checkpoint: Path | None) -> None:
        from datasets import Dataset
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from trl import GRPOTrainer

        spec = self.spec
        dtype = torch.bfloat16 if spec.bf16 else torch.float32
        source = folder
        if checkpoint is not None and not self.lora_rank:
            source = checkpoint / "model"  # full weights (sharded or not)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
        if self.lora_rank:
            if checkpoint is not None and self.roles:
                model = load_role_adapters(model, self.roles, checkpoint / "adapter")
            elif checkpoint is not None:
                from peft import PeftModel

                model = PeftModel.from_pretrained(model, checkpoint / "adapter", is_trainable=True)
            elif self.roles:
                config = lora_config(self.lora_rank, SERVED_LORA_TARGETS)
                model = role_adapters(model, self.roles, config)
            else:
                from peft import get_peft_model

                targets = SERVED_LORA_TARGETS if self.exports_adapter else "all-linear"
                model = get_peft_model(model, lora_config(self.lora_rank, targets))
        tokenizer = AutoTokenizer.from_pretrained(
            self.policy.tokenizer_folder if self.policy else folder
        )
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.tokenizer = tokenizer
        args = grpo_config(spec, self.importance_sampling, self.is_clip_max, self.loss_type)
        self.grpo = GRPOTrainer(
            model=model,
            args=args,
            processing_class=tokenizer,
            reward_funcs=[_unused_reward],
            train_dataset=Dataset.from_list([{"prompt": "rollwire"}]),
        )
        # TRL's vLLM branch of the loss: its importance-sampling weight on the captured log-probs
        self.grpo.use_vllm = self.importance_sampling != "off"
        self.model = self.grpo.model
        self.model.to(self.device)
        for role in self.roles:  # each role's adapter alone in its optimizer
            activate_role(self.model, role)
            self.grpo.optimizer = None
            self.optimizers[role] = self.grpo.create_optimizer()
        self.optimizer = self.grpo.create_optimizer()
        if checkpoint is not None and (checkpoint / "optimizer.pt").is_file():
            state = torch.load(checkpoint / "optimizer.pt", map_location=self.device)
            if self.roles:  # one optimizer state per role
                missing = sorted(set(self.roles) - set(state))
                if missing:
                    raise ValueError(
                        f"--resume: {checkpoint / 'optimizer.pt'} holds no optimizer state "
                        f"for roles {missing} (it has {sorted(state)}): resume with the roles "
                        "the run was started with"
                    )
                for role in self.roles:
                    self.optimizers[role].load_state_dict(state[role])
            else:
                self.optimizer.load_state_dict(state)
        self.model.train()

    def use_role(self, role: str) -> None:
        """``update``, ``export`` and ``reference`` act on ``role``'s adapter from now on."""
        if role not in self.optimizers:
            raise ValueError(f"no adapter for role {role!r}: the run's roles are {self.roles}")
        activate_role(self.model, role)
        self.role, self.optimizer = role, self.optimizers[role]

    # ------------------------------------------------------------------ update
    def update(self, batch: TrainBatch) -> dict[str, float]:
        """One AdamW step on every row of ``batch`` (module docstring)."""
        rows = batch.rows
        size = self.spec.micro_batch_size or len(rows)
        chunks = [rows[i : i + size] for i in range(0, len(rows), size)]
        total_tokens = float(sum(int(r.loss_mask.sum()) for r in rows))
        grpo, model = self.grpo, self.model
        grpo.current_gradient_accumulation_steps = len(chunks)
        grpo.args.steps_per_generation = len(chunks)
        model.train()
        loss_sum = 0.0
        trainer_lp: list[np.ndarray] = []
        sampled_lp: list[np.ndarray] = []
        grpo._metrics["train"].clear()
        weights: list[float] = []
        for chunk in chunks:
            inputs = self._inputs(chunk, total_tokens)
            mask = (inputs["completion_mask"] * inputs["tool_mask"]).bool()
            old = inputs["old_per_token_logps"]
            if "importance_sampling_ratio" in inputs:
                w = inputs["importance_sampling_ratio"].expand_as(mask)[mask]
                weights += [float(w.min()), float(w.max())] if w.numel() else []
            for i in range(len(chunk)):
                trainer_lp.append(old[i][mask[i]].float().cpu().numpy())
                sampled_lp.append(
                    inputs["sampling_per_token_logps"][i][mask[i]].float().cpu().numpy()
                )
            loss = grpo._compute_loss(model, inputs)
            loss.backward()
            loss_sum += float(loss.detach())
        params = [p for p in model.parameters() if p.requires_grad]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        stats: dict[str, float] = {"loss": loss_sum, "grad_norm": float(grad_norm)}
        stats.update(behaviour_stats(trainer_lp, sampled_lp))
        for key, name in _TRL_METRICS.items():
            values = [float(v) for v in grpo._metrics["train"].get(key, []) if not math.isnan(v)]
            if values:
                stats[name] = sum(values) / len(values)
        grpo._metrics["train"].clear()
        stats["micro_batches"] = float(len(chunks))
        if weights:  # the correction's weights as applied (after truncating or masking)
            stats["is_weight_min"], stats["is_weight_max"] = min(weights), max(weights)
        return stats

    def _inputs(self, rows: Sequence[TrainRow], total_tokens: float) -> dict[str, Any]:
        """TRL's loss inputs for ``rows`` (:func:`~rollwire_trl.samples.pad_rows`), the
        trainer's log-probs before the update, the importance weights, the reference's."""
        padded = pad_rows(rows, int(self.tokenizer.pad_token_id))
        c_len = padded.completion_ids.shape[1]
        dev = self.device
        t = {
            "prompt_ids": torch.from_numpy(padded.prompt_ids).to(dev),
            "prompt_mask": torch.from_numpy(padded.prompt_mask).to(dev),
            "completion_ids": torch.from_numpy(padded.completion_ids).to(dev),
            "completion_mask": torch.from_numpy(padded.completion_mask).to(dev),
            "tool_mask": torch.from_numpy(padded.tool_mask).to(dev),
            "sampling_per_token_logps": torch.from_numpy(padded.sampling_logps).to(dev),
            "advantages": torch.from_numpy(padded.advantages).to(dev),
            "num_items_in_batch": torch.tensor(total_tokens, device=dev),
        }
        ids = torch.cat([t["prompt_ids"], t["completion_ids"]], dim=1)
        attn = torch.cat([t["prompt_mask"], t["completion_mask"]], dim=1)
        grpo = self.grpo
        with torch.no_grad():
            old, _, _ = grpo._get_per_token_logps_and_entropies(self.model, ids, attn, c_len)
            t["old_per_token_logps"] = old.float()
            if grpo.beta != 0.0:
                t["ref_per_token_logps"] = self._ref_logps(ids, attn, c_len)
        if self.importance_sampling != "off":
            t["importance_sampling_ratio"] = importance_ratio(
                t["old_per_token_logps"],
                t["sampling_per_token_logps"],
                t["completion_mask"] * t["tool_mask"],
                self.importance_sampling,
                self.is_clip_max,
            )
        return t

    def _ref_logps(self, ids: torch.Tensor, attn: torch.Tensor, keep: int) -> torch.Tensor:
        grpo = self.grpo
        if grpo.ref_model is not None:
            out, _, _ = grpo._get_per_token_logps_and_entropies(grpo.ref_model, ids, attn, keep)
            return out.float()
        with self.model.disable_adapter():  # LoRA: the base model is the reference
            out, _, _ = grpo._get_per_token_logps_and_entropies(self.model, ids, attn, keep)
        return out.float()

    # ------------------------------------------------------------------ weights
    def export(self, step: int) -> Export:
        """The policy under ``--out/policy/step-N``: the LoRA adapter alone (PEFT's folder), or
        a Hugging Face model folder (full weights, or LoRA merged in). The newest two are kept,
        the adapters a server may still hold loaded too (vLLM may read one again)."""
        assert self.policy is not None
        t0 = time.perf_counter()
        target = self.spec.out / "policy" / f"step-{step}"
        if self.role is not None:
            folder = save_role_adapter(self.model, self.role, target / self.role)
        elif self.exports_adapter:
            folder = self._save_adapter(target)
        else:
            folder = save_policy(self.model, target, self.policy.tokenizer_folder)
        self._exports.append(folder)
        keep = (2 + (self.spec.max_staleness if self.exports_adapter else 0)) * (
            len(self.roles) or 1
        )
        for old in self._exports[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
        self._exports = self._exports[-keep:]
        seconds = time.perf_counter() - t0
        if self.exports_adapter:
            return Export(str(folder.resolve()), str(step), seconds, "adapter", self.role)
        return Export(str(folder.resolve()), str(step), seconds)

    def _save_adapter(self, folder: Path) -> Path:
        """The trained LoRA adapter as PEFT writes it (safetensors, float32 as trained)."""
        shutil.rmtree(folder, ignore_errors=True)
        getattr(self.model, "module", self.model).save_pretrained(folder, safe_serialization=True)
        return folder

    def reference(self) -> Reference:
        """Scores with the live model, on its device, in eval mode (then back to training)."""

        def score(prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
            model = self.model
            was_training = model.training
            model.eval()
            try:
                device = next(model.parameters()).device
                ids = torch.tensor(
                    [[*map(int, prompt_ids), *map(int, completion_ids)]], device=device
                )
                with torch.no_grad():
                    logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
                lp = torch.log_softmax(logits / self.spec.temperature, dim=-1)
                picked = lp[torch.arange(len(completion_ids)), list(map(int, completion_ids))]
                return [float(x) for x in picked.cpu().tolist()]
            finally:
                model.train(was_training)

        return score

    def save(self, step: int) -> None:
        """``--out/checkpoints/step-N``: the weights (the adapter alone for LoRA; a full model
        may be sharded), the optimizer, what started the run; the newest two are kept."""
        assert self.policy is not None
        root = self.spec.out / "checkpoints"
        folder = root / f"step-{step}"
        tmp = root / f".step-{step}.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        unwrapped = getattr(self.model, "module", self.model)
        if self.lora_rank:
            unwrapped.save_pretrained(tmp / "adapter")
        else:
            unwrapped.save_pretrained(tmp / "model", safe_serialization=True, max_shard_size="2GB")
        if self.roles:
            optimizers = {r: o.state_dict() for r, o in self.optimizers.items()}
            torch.save(optimizers, tmp / "optimizer.pt")
        else:
            torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
        state = {"step": step, "lora_rank": self.lora_rank, "start": str(self.policy.folder)}
        (tmp / "state.json").write_text(json.dumps(state))
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
        done = sorted((p for p in root.glob("step-*") if p.is_dir()), key=lambda p: int(p.name[5:]))
        for old in done[:-2]:
            shutil.rmtree(old, ignore_errors=True)

    def finish(self) -> Path:
        """``--out/final``: the trained policy as a model folder (LoRA merged in); with
        ``--roles``, each role's adapter under ``final/<role>``."""
        assert self.policy is not None
        if self.roles:
            getattr(self.model, "module", self.model).save_pretrained(self.spec.out / "final")
            return self.spec.out / "final"
        return save_policy(self.model, self.spec.out / "final", self.policy.tokenizer_folder)

    def close(self) -> None:
        """Nothing to release: the model goes with the process."""


def _unused_reward(completions: Sequence[Any], **_: Any) -> list[float]:
    """GRPOTrainer wants a reward function; rollwire's rewards come with the rollouts."""
    return [0.0] * len(completions)


def importance_ratio(
    trainer: torch.Tensor, sampled: torch.Tensor, mask: torch.Tensor, mode: str, clip_max: float
) -> torch.Tensor:
    """TRL's correction of its vLLM path: ``exp(trainer - sampled)`` per token (or summed per
    sequence), truncated at ``clip_max`` (``*_truncate``) or zeroed above it (``*_mask``)."""
    diff = torch.nan_to_num((trainer - sampled) * mask, nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return torch.clamp(ratio, max=clip_max)
    return ratio.masked_fill(ratio > clip_max, 0.0)


def grpo_config(spec: RunSpec, importance: str, clip_max: float, loss_type: str) -> Any:
    """The ``GRPOConfig`` whose loss settings the update uses (TRL's generation is not used)."""
    from trl import GRPOConfig

    correction = importance != "off"
    return GRPOConfig(
        output_dir=str(spec.out / "checkpoints"),
        use_cpu=not torch.cuda.is_available(),
        bf16=spec.bf16,
        per_device_train_batch_size=spec.group_size,
        num_generations=spec.group_size,
        learning_rate=spec.learning_rate,
        adam_beta1=spec.adam_beta1,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        beta=spec.beta,
        loss_type=loss_type,
        temperature=spec.temperature,
        report_to=[],
        disable_tqdm=True,
        seed=spec.seed,
        vllm_importance_sampling_correction=correction,
        vllm_importance_sampling_mode=importance if correction else "token_truncate",
        vllm_importance_sampling_clip_max=clip_max,
    )


def lora_config(rank: int, targets: str | Sequence[str] = "all-linear") -> Any:
    """peft's ``LoraConfig`` for ``rank`` on ``targets`` (default every linear layer; alpha
    2 x rank); None for 0."""
    if not rank:
        return None
    try:
        from peft import LoraConfig
    except ImportError:
        raise ValueError(
            f"--lora-rank {rank} needs peft, which is not installed: pip install peft "
            "(or --lora-rank 0 to train the full weights)"
        ) from None
    return LoraConfig(
        r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
        target_modules=targets if isinstance(targets, str) else list(targets),
        task_type="CAUSAL_LM",
    )  # fmt: skip
