"""A small dense Llama folder with the embedded engine's tokenizer, for tests against real vLLM."""

from __future__ import annotations

import shutil
from pathlib import Path

from rollwire.testing.llama import tiny_llama_config


def llama_folder(
    path: Path, tokenizer_folder: Path, *, seed: int, noise: float = 0.0, tied: bool = False
) -> Path:
    """A small dense Llama with the engine's tokenizer, random weights from ``seed``; ``noise``
    perturbs ``lm_head`` (the input embeddings too when ``tied``)."""
    import torch
    from transformers import LlamaForCausalLM

    cfg = tiny_llama_config(tied=tied)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).float()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2) if p.dim() > 1 else None
        if noise:
            gen = torch.Generator().manual_seed(seed + 1)
            model.lm_head.weight.add_(
                torch.randn(model.lm_head.weight.shape, generator=gen) * noise
            )
    model.save_pretrained(path, safe_serialization=True)
    for src in tokenizer_folder.iterdir():
        if src.is_file() and src.name not in (
            "config.json",
            "model.safetensors",
            "generation_config.json",
        ):
            shutil.copyfile(src, path / src.name)
    return path
