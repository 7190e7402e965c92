"""LoRA adapters for tests and benchmarks, without torch: a random PEFT adapter for a Hugging Face
model folder, and the same folder with an adapter merged in — in NumPy on the Hugging Face
tensors (``W + alpha / r * B @ A``), apart from the engine's own merge, so a test that compares
the two checks the engine."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rollwire.engine.hf_export import write_safetensors
from rollwire.engine.hf_import import read_safetensors, read_tensors
from rollwire.engine.lora import write_adapter

__all__ = ["ATTENTION", "merged_folder", "random_adapter"]

#: the attention projections PEFT names on Llama and Mixtral alike
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


def random_adapter(
    base: str | Path,
    folder: str | Path,
    *,
    rank: int = 8,
    alpha: float = 16.0,
    targets: Sequence[str] = (*ATTENTION, "gate_proj", "up_proj", "down_proj"),
    scale: float = 0.05,
    seed: int = 0,
) -> Path:
    """A PEFT adapter on every 2-D ``*.weight`` of ``base`` whose module name ends in one of
    ``targets``, with random ``A`` and ``B`` (``B`` is not zero: the adapter changes answers)."""
    rng = np.random.default_rng(seed)
    matrices: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name, w in sorted(read_tensors(base).items()):
        module = name.removesuffix(".weight")
        if w.ndim != 2 or module.rsplit(".", 1)[-1] not in targets or "layers." not in module:
            continue
        out, inp = w.shape
        a = rng.normal(0, inp**-0.5, (rank, inp)).astype(np.float32)
        b = rng.normal(0, scale, (out, rank)).astype(np.float32)
        matrices[module] = (a, b)
    if not matrices:
        raise ValueError(f"{base} has no weight named like {list(targets)}")
    return write_adapter(folder, matrices, alpha=alpha, base_model=str(base))


def merged_folder(base: str | Path, adapter: str | Path, folder: str | Path) -> Path:
    """``base`` (a one-file Hugging Face folder) with the PEFT ``adapter`` merged into its
    weights, written to ``folder`` with ``base``'s config and tokenizer files."""
    src, out = Path(base), Path(folder)
    config = json.loads((Path(adapter) / "adapter_config.json").read_text())
    scaling = float(config["lora_alpha"]) / int(config["r"])
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for key, arr in read_safetensors(Path(adapter) / "adapter_model.safetensors").items():
        module, ab = key.removeprefix("base_model.model.").split(".lora_")
        pairs.setdefault(module, {})[ab.split(".")[0]] = arr
    tensors = read_tensors(src)
    for module, mats in pairs.items():
        w = tensors[module + ".weight"].astype(np.float64)
        tensors[module + ".weight"] = (w + scaling * (mats["B"] @ mats["A"])).astype(np.float32)
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and "index" not in f.name:
            shutil.copyfile(f, out / f.name)
    write_safetensors(out / "model.safetensors", tensors)
    return out
