"""The policy ``rollwire train`` starts from: a model folder, or the embedded engine's seeded model
after a supervised warm-up on the task's teacher conversations."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rollwire.data.warmup import Conversation

__all__ = ["StartingPolicy", "warmed_up_policy"]


@dataclass
class StartingPolicy:
    """Where the policy's weights come from and what was done to get them."""

    folder: Path
    step: int = 0
    warmup_steps: int = 0
    warmup_loss: float | None = None
    warmup_seconds: float = 0.0
    #: the folder whose tokenizer files the servers read (default: the weights' own)
    tokenizer_dir: Path | None = None

    @property
    def tokenizer_folder(self) -> Path:
        """``tokenizer_dir``, else the weights' own folder."""
        return self.tokenizer_dir or self.folder


def warmed_up_policy(
    out: Path,
    conversations: Sequence[Conversation],
    *,
    seed: int,
    steps: int,
    learning_rate: float,
    batch_size: int = 32,
    micro_batch_size: int = 0,
    base: Path | None = None,
) -> StartingPolicy:
    """``base`` (default: the embedded engine's model of ``seed``, written to ``out/base``)
    warmed up for ``steps`` supervised steps into ``out/warmup`` (reused when it is there)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rollwire.engine.hf_export import save_hf
    from rollwire.engine.model import ModelConfig, TinyModel
    from rollwire_trl.sync import save_policy
    from rollwire_trl.warmup import supervised_warmup

    if base is None:
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
        micro_batch_size=micro_batch_size,
    )
    save_policy(model, target, tokenizer_dir=base)
    seconds = time.perf_counter() - t0
    loss = sum(losses[-10:]) / len(losses[-10:])
    import orjson

    marker.write_bytes(orjson.dumps({"steps": steps, "loss": loss, "seconds": seconds}))
    return StartingPolicy(target, 0, steps, loss, seconds)
