"""The policy ``rollwire train`` starts from: a model folder, a checkpoint to resume, or the
embedded engine's seeded model after a supervised warm-up on the task's teacher conversations."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["StartingPolicy", "latest_checkpoint", "warmed_up_policy"]

_CHECKPOINT = re.compile(r"checkpoint-(\d+)$")


@dataclass
class StartingPolicy:
    """Where the policy's weights come from and what was done to get them."""

    folder: Path
    step: int = 0
    warmup_steps: int = 0
    warmup_loss: float | None = None
    warmup_seconds: float = 0.0
    #: the folder whose tokenizer files the servers read (the fresh start's, also on a resume)
    tokenizer_dir: Path | None = None
    #: the TRL checkpoint a resumed run continues (optimizer, scheduler, RNG, trainer state)
    checkpoint: Path | None = None

    @property
    def tokenizer_folder(self) -> Path:
        """``tokenizer_dir``, else the weights' own folder."""
        return self.tokenizer_dir or self.folder


def latest_checkpoint(folder: Path) -> tuple[Path, int] | None:
    """The newest ``checkpoint-N`` TRL saved under ``folder`` (with its step), if any."""
    found = []
    for p in folder.glob("checkpoint-*"):
        m = _CHECKPOINT.search(p.name)
        if m and p.is_dir() and (p / "trainer_state.json").exists():
            found.append((int(m.group(1)), p))
    if not found:
        return None
    step, path = max(found)
    return path, step


def resumed_policy(out: Path, start: StartingPolicy) -> StartingPolicy:
    """The newest checkpoint under ``out/checkpoints`` as a model folder a server loads (its
    weights with ``start``'s tokenizer files), to resume from."""
    import shutil

    from rollwire_trl.sync import copy_tokenizer

    found = latest_checkpoint(out / "checkpoints")
    if found is None:
        raise ValueError(f"--resume: no checkpoint under {out / 'checkpoints'} to resume")
    checkpoint, step = found
    folder = out / "policy" / f"resume-{step}"
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(checkpoint / name, folder / name)
    copy_tokenizer(start.tokenizer_folder, folder)
    return StartingPolicy(
        folder, step, start.warmup_steps, start.warmup_loss, 0.0, start.folder, checkpoint
    )


def warmed_up_policy(
    out: Path,
    conversations: Sequence[Sequence[dict[str, Any]]],
    *,
    seed: int,
    steps: int,
    learning_rate: float,
    batch_size: int = 32,
) -> StartingPolicy:
    """The embedded engine's model of ``seed`` as a Hugging Face folder under ``out/base``,
    warmed up for ``steps`` supervised steps into ``out/warmup`` (reused when it is there)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rollwire.engine.hf_export import save_hf
    from rollwire.engine.model import ModelConfig, TinyModel
    from rollwire_trl.sync import save_policy
    from rollwire_trl.warmup import supervised_warmup

    base = out / "base"
    if not (base / "model.safetensors").exists():
        save_hf(TinyModel(ModelConfig(seed=seed)), base)
    if steps <= 0:
        return StartingPolicy(base)
    target = out / "warmup"
    marker = target / "warmup.json"
    if marker.exists():
        import orjson

        info = orjson.loads(marker.read_bytes())
        return StartingPolicy(target, 0, info["steps"], info["loss"], info["seconds"])
    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    losses = supervised_warmup(
        model,
        tokenizer,
        conversations,
        steps=steps,
        batch_size=batch_size,
        learning_rate=learning_rate,
        seed=seed,
    )
    save_policy(model, target, tokenizer_dir=base)
    seconds = time.perf_counter() - t0
    loss = sum(losses[-10:]) / len(losses[-10:])
    import orjson

    marker.write_bytes(orjson.dumps({"steps": steps, "loss": loss, "seconds": seconds}))
    return StartingPolicy(target, 0, steps, loss, seconds)
