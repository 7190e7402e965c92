"""LoRA adapters for the engine, in PEFT's folder format (``adapter_config.json`` +
``adapter_model.safetensors``), as vLLM's ``/v1/load_lora_adapter`` takes them.

An adapter adds ``scaling * B @ A`` (``A``: ``[r, in]``, ``B``: ``[out, r]``, ``scaling`` =
``lora_alpha / r``, or ``/ sqrt(r)`` with rsLoRA) to the weight of each module it targets. The
engine serves an adapter as :class:`AdaptedModel`: the base's weights, shared, and the adapter's
factors applied at each projection (``x @ W + (x @ A') @ B'``, the q/k/v and gate/up factors
stacked as the engine stacks those matrices), as PEFT computes it while training. Loading costs
reading the folder (a merged copy of a 135M-parameter model's matrices took seconds: the rank-r
products are as large as the weights); a step costs two thin matmuls per adapted projection.
Mixtral's per-expert ``w1``/``w2``/``w3`` and router ``gate``, when targeted, are merged into
copies of those matrices. Targets are the modules PEFT names on the engine's models: ``q_proj``,
``k_proj``, ``v_proj``, ``o_proj``, the dense ``gate_proj``/``up_proj``/``down_proj`` and those.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from .hf_export import write_safetensors
from .hf_import import read_safetensors
from .model import ModelConfig, TinyModel, WeightsError, _Weights

__all__ = [
    "AdaptedModel",
    "LoraDelta",
    "ServedAdapter",
    "adapted",
    "adapter_version",
    "read_adapter",
    "write_adapter",
]

_F32 = np.float32
#: ``adapter_model.safetensors`` keys: ``base_model.model.<module>.lora_A|B[.<adapter>].weight``
_KEY = re.compile(
    r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<ab>[AB])(?:\.[^.]+)?\.weight$"
)
_LAYER = re.compile(r"^model\.layers\.(?P<layer>\d+)\.(?P<rest>.+)$")
_EXPERT = re.compile(r"^block_sparse_moe\.experts\.(?P<e>\d+)\.(?P<w>w[123])$")
#: ``adapter_config.json`` settings the engine cannot apply, with the value it needs
_REFUSED = {
    "use_dora": False,
    "fan_in_fan_out": False,
    "bias": "none",
    "lora_bias": False,
    "modules_to_save": None,
    "target_parameters": None,
    "rank_pattern": None,
    "alpha_pattern": None,
}


#: the engine's matrices an adapter is applied to at matmul time (the others are merged)
_FACTORED = ("wqkv", "wo", "mlp_in", "mlp_out")


@dataclass(frozen=True)
class LoraDelta:
    """One adapted matrix: where its delta goes in the engine's weights (array, layer, expert,
    output columns) and its factors in the engine's ``x @ W`` orientation: ``a`` ``[in, r]``
    (scaling included) and ``b`` ``[r, out]``, the delta being ``a @ b``."""

    array: str
    layer: int
    expert: int | None
    columns: tuple[int, int]
    a: np.ndarray
    b: np.ndarray


class AdaptedModel(TinyModel):
    """The base model's weights (shared, not copied) with LoRA factors added at each projection:
    ``factors[(array, layer)] = (A', B')`` with ``x @ W + (x @ A') @ B'``."""

    def __init__(
        self,
        base: TinyModel,
        factors: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]],
        weights: _Weights | None = None,
    ) -> None:
        super().__init__(base.config, base.tokenizer, _weights=weights or base.w)
        self.factors = factors

    def _proj(self, x: np.ndarray, name: str, layer: int) -> np.ndarray:
        out = super()._proj(x, name, layer)
        f = self.factors.get((name, layer))
        if f is not None:
            out += (x @ f[0]) @ f[1]
        return out


@dataclass(frozen=True)
class ServedAdapter:
    """A loaded adapter: its name, folder and version, the model that serves it (the base with
    its factors) and its deltas (applied again to new base weights after a reload). ``tag`` is
    unique per load (prefix-cache entries of one never serve another)."""

    name: str
    path: str
    version: str
    model: TinyModel
    tag: int
    deltas: tuple[LoraDelta, ...]


def adapter_version(name: str, default: str) -> str:
    """The version an adapter's answers report: what follows the last ``@`` of a versioned name
    (``policy@3`` -> ``3``), else ``default`` (the engine's weight version at load time)."""
    head, at, tail = name.rpartition("@")
    return tail if at and head and tail else default


def _slot(cfg: ModelConfig, module: str) -> tuple[str, int, int | None, tuple[int, int], int]:
    """Where the module's weight lives: engine array, layer, expert, columns, input width."""
    m = _LAYER.match(module)
    rest = m.group("rest") if m else ""
    layer = int(m.group("layer")) if m else -1
    d, h, q, kv = cfg.d_model, cfg.expert_hidden, cfg.q_width, cfg.kv_width
    dense = {
        "self_attn.q_proj": ("wqkv", (0, q), d),
        "self_attn.k_proj": ("wqkv", (q, q + kv), d),
        "self_attn.v_proj": ("wqkv", (q + kv, q + 2 * kv), d),
        "self_attn.o_proj": ("wo", (0, d), q),
    }
    if not cfg.routed:
        dense |= {
            "mlp.gate_proj": ("mlp_in", (0, h), d),
            "mlp.up_proj": ("mlp_in", (h, 2 * h), d),
            "mlp.down_proj": ("mlp_out", (0, d), h),
        }
    else:
        dense["block_sparse_moe.gate"] = ("router", (0, cfg.n_experts), d)
    if m is not None and 0 <= layer < cfg.n_layers and rest in dense:
        array, cols, width = dense[rest]
        return array, layer, None, cols, width
    e = _EXPERT.match(rest) if cfg.routed else None
    if m is not None and e is not None and 0 <= layer < cfg.n_layers:
        expert, w = int(e.group("e")), e.group("w")
        if expert < cfg.n_experts:
            cols, width = ((0, d), h) if w == "w2" else ((0, h), d)
            return w, layer, expert, cols, width
    raise WeightsError(
        f"the adapter targets {module!r}, which the engine's {cfg.model_type} model "
        f"({cfg.n_layers} layers) does not have or applies no adapter to; the engine adapts "
        "q_proj, k_proj, v_proj, o_proj and the MLP's gate_proj/up_proj/down_proj (Mixtral: "
        "experts.E.w1/w2/w3 and the router gate). Train the adapter on those modules"
    )


def _config(folder: Path) -> dict[str, Any]:
    path = folder / "adapter_config.json"
    if not path.is_file():
        raise WeightsError(
            f"{folder} has no adapter_config.json: a LoRA adapter is a PEFT folder "
            "(adapter_config.json + adapter_model.safetensors, as PeftModel.save_pretrained "
            "writes it)"
        )
    try:
        cfg = json.loads(path.read_text())
    except ValueError as exc:
        raise WeightsError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(cfg, dict) or cfg.get("peft_type", "LORA") != "LORA":
        raise WeightsError(f"{path} is not a LoRA adapter (peft_type {cfg.get('peft_type')!r})")
    for key, want in _REFUSED.items():
        got = cfg.get(key)
        if got not in (want, None) and not (want is None and not got):
            raise WeightsError(f"{path} has {key} {got!r}; the engine applies plain LoRA only")
    return cfg


def read_adapter(folder: str | Path, cfg: ModelConfig) -> list[LoraDelta]:
    """The deltas of the PEFT LoRA adapter in ``folder`` for a model of shape ``cfg``; any
    problem is a :class:`WeightsError` naming the file, tensor or setting."""
    src = Path(folder)
    if not src.is_dir():
        raise WeightsError(f"adapter folder {str(src)!r} does not exist or is not a folder")
    conf = _config(src)
    weights = src / "adapter_model.safetensors"
    if not weights.is_file():
        raise WeightsError(f"{src} has no adapter_model.safetensors (the engine reads no .bin)")
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for key, arr in read_safetensors(weights).items():
        k = _KEY.match(key)
        if k is None:
            raise WeightsError(f"tensor {key!r} in {weights} is not a LoRA A or B matrix")
        pairs.setdefault(k.group("module"), {})[k.group("ab")] = arr
    alpha = float(conf.get("lora_alpha", conf.get("r", 8)))
    out = []
    for module, ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            raise WeightsError(f"{weights} has lora_{''.join(ab)} of {module!r} but not both")
        a, b = ab["A"], ab["B"]
        array, layer, expert, cols, width = _slot(cfg, module)
        rank = a.shape[0]
        if (
            a.ndim != 2
            or b.ndim != 2
            or b.shape != (cols[1] - cols[0], rank)
            or a.shape[1] != width
        ):
            raise WeightsError(
                f"{module} in {weights}: lora_A {list(a.shape)} and lora_B {list(b.shape)} do not "
                f"fit its weight [{cols[1] - cols[0]}, {width}] at one rank"
            )
        scaling = alpha / (math.sqrt(rank) if conf.get("use_rslora") else rank)
        factor_a = np.ascontiguousarray(a.T * _F32(scaling), dtype=_F32)
        out.append(LoraDelta(array, layer, expert, cols, factor_a, np.ascontiguousarray(b.T)))
    if not out:
        raise WeightsError(f"{weights} holds no LoRA matrices")
    return out


def adapted(base: TinyModel, deltas: Sequence[LoraDelta]) -> AdaptedModel:
    """``base`` serving the adapter ``deltas``: the factors of each attention and dense MLP
    projection stacked per engine matrix (q/k/v side by side, gate/up too) and applied at
    matmul time; expert and router deltas merged into copies of those matrices."""
    groups: dict[tuple[str, int], list[LoraDelta]] = {}
    touched: dict[str, np.ndarray] = {}
    for d in deltas:
        if d.array in _FACTORED:
            groups.setdefault((d.array, d.layer), []).append(d)
            continue
        arr = touched.get(d.array)
        if arr is None:
            arr = touched[d.array] = np.array(getattr(base.w, d.array), dtype=_F32, copy=True)
        target = arr[d.layer] if d.expert is None else arr[d.layer, d.expert]
        target[:, d.columns[0] : d.columns[1]] += d.a @ d.b
    factors = {}
    for (array, layer), parts in groups.items():
        width = getattr(base.w, array).shape[-1]
        a = np.concatenate([p.a for p in parts], axis=1)
        b = np.zeros((a.shape[1], width), _F32)
        row = 0
        for p in parts:  # block by block: each module's rows write its own columns
            b[row : row + p.b.shape[0], p.columns[0] : p.columns[1]] = p.b
            row += p.b.shape[0]
        factors[(array, layer)] = (a, b)
    weights = replace(base.w, **touched) if touched else None
    return AdaptedModel(base, factors, weights)


def write_adapter(
    folder: str | Path,
    matrices: dict[str, tuple[np.ndarray, np.ndarray]],
    *,
    alpha: float,
    base_model: str = "",
) -> Path:
    """Write a PEFT LoRA folder: ``matrices`` maps a module name (``model.layers.0.self_attn.
    q_proj``) to its ``(A [r, in], B [out, r])``; the rank is ``A``'s first axis."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    ranks = {a.shape[0] for a, _ in matrices.values()}
    if len(ranks) != 1:
        raise ValueError(f"every matrix of one adapter has the same rank; got {sorted(ranks)}")
    tensors: dict[str, np.ndarray] = {}
    for module, (a, b) in matrices.items():
        tensors[f"base_model.model.{module}.lora_A.weight"] = np.asarray(a, _F32)
        tensors[f"base_model.model.{module}.lora_B.weight"] = np.asarray(b, _F32)
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": ranks.pop(),
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": sorted({m.rsplit(".", 1)[-1] for m in matrices}),
        "base_model_name_or_path": base_model,
    }
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_safetensors(out / "adapter_model.safetensors", tensors)
    return out
