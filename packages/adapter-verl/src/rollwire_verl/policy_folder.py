"""The actor's weights as a Hugging Face model folder the servers load (the embedded engine, vLLM).

The FSDP module holds the model under transformers' in-memory names (transformers 5 fuses a
Mixtral layer's experts into ``mlp.experts.gate_up_proj``); the folder must carry the
checkpoint's names (``block_sparse_moe.experts.N.w1``), which the embedded engine and vLLM read.
So the weights go into a plain copy of the starting model and that model's own
``save_pretrained`` writes them, converting the names as transformers does for any checkpoint.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

__all__ = ["PolicyFolders", "copy_tokenizer"]

#: the tokenizer files a server reads from a model folder
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)


def copy_tokenizer(src: Path, dst: Path) -> None:
    """The tokenizer files a server reads, from the model folder ``src`` into ``dst``."""
    for name in _TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, dst / name)


class PolicyFolders:
    """Writes weights (the actor's full state dict) as model folders shaped like ``source``."""

    def __init__(self, source: Path, tokenizer_dir: Path | None = None) -> None:
        self.source = Path(source)
        self.tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir is not None else self.source
        self._model: Any = None

    def write(self, state: dict[str, torch.Tensor], folder: Path) -> Path:
        """``state`` as a float32 safetensors model folder at ``folder``, with the tokenizer."""
        if self._model is None:
            from transformers import AutoModelForCausalLM

            self._model = AutoModelForCausalLM.from_pretrained(self.source, dtype=torch.float32)
        self._model.load_state_dict(state, strict=True)
        folder.mkdir(parents=True, exist_ok=True)
        self._model.save_pretrained(folder, safe_serialization=True)
        copy_tokenizer(self.tokenizer_dir, folder)
        return folder
