"""The policy ``rollwire train --trainer verl`` starts from: a model folder, or the embedded
engine's seeded model after a supervised warm-up run by verl itself.

The warm-up is verl's SFT step on its own engine: a :class:`~rollwire_verl.actor.VerlActor` whose
loss is verl's ``sft_loss`` (the mean next-token loss over the labelled tokens), on batches of a
task's teacher conversations labelled by :func:`rollwire.data.warmup.assistant_labels` (only
assistant tokens carry loss, as in an RL row). AdamW as TRL's warm-up: betas (0.9, 0.999), no
weight decay, no clipping to speak of.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rollwire.data.warmup import Conversation

__all__ = ["StartingPolicy", "warmed_up_policy"]

#: the warm-up's gradient clipping: far above any norm it sees (verl's optimizer always clips)
_NO_CLIP = 1e6


@dataclass
class StartingPolicy:
    """Where the policy's weights come from and what was done to get them."""

    folder: Path
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
    verbose: bool = False,
    base: Path | None = None,
) -> StartingPolicy:
    """``base`` (default: the embedded engine's model of ``seed``, written to ``out/base``)
    warmed up by verl for ``steps`` supervised steps into ``out/warmup`` (reused when there)."""
    import orjson
    from transformers import AutoTokenizer

    from rollwire.data.warmup import assistant_labels
    from rollwire.engine.hf_export import save_hf
    from rollwire.engine.model import ModelConfig, TinyModel
    from rollwire_verl.actor import ActorSettings, VerlActor
    from rollwire_verl.policy_folder import PolicyFolders

    if base is None:
        base = out / "base"
        if not (base / "model.safetensors").exists():
            save_hf(TinyModel(ModelConfig(seed=seed)), base)
    if steps <= 0:
        return StartingPolicy(base)
    target = out / "warmup"
    marker = target / "warmup.json"
    if marker.exists():
        info = orjson.loads(marker.read_bytes())
        return StartingPolicy(target, info["steps"], info["loss"], info["seconds"], base)
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(base)
    examples = [assistant_labels(tokenizer, c) for c in conversations]
    if not examples:
        raise ValueError("the warm-up has no conversations to learn from")
    settings = ActorSettings(
        learning_rate=learning_rate, adam_beta1=0.9, max_grad_norm=_NO_CLIP, seed=seed
    )
    actor = VerlActor(base, settings, verbose=verbose)
    try:
        rng = random.Random(seed)
        losses = [
            actor.supervised_step(
                [examples[rng.randrange(len(examples))] for _ in range(batch_size)]
            )
            for _ in range(steps)
        ]
        PolicyFolders(base).write(actor.state_dict(), target)
    finally:
        actor.close()
    seconds = time.perf_counter() - t0
    loss = sum(losses[-10:]) / len(losses[-10:])
    marker.write_bytes(orjson.dumps({"steps": steps, "loss": loss, "seconds": seconds}))
    return StartingPolicy(target, steps, loss, seconds, base)
