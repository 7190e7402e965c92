"""After each optimizer step: save the policy as a Hugging Face folder and push it to the servers.

:class:`WeightSyncCallback` is a ``transformers.TrainerCallback``; what it calls is one function,
``sync(weights_dir, version)`` (a :data:`SyncHook`), so any transport fits: rollwire's
``WeightSync(...).sync`` (pause, push to every backend, verify, stamp, resume), or
:func:`http_weight_sync`, which reloads a list of vLLM-shaped servers (vLLM with
``VLLM_SERVER_DEV_MODE=1``, the embedded engine) and stamps the gateway's policy version.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from transformers import TrainerCallback

__all__ = [
    "SyncHook",
    "SyncRecord",
    "WeightSyncCallback",
    "copy_tokenizer",
    "http_weight_sync",
    "save_policy",
]

#: ``sync(weights_dir, version)``: make every server serve the folder, labelled ``version``
SyncHook = Callable[[Path, str], Any]
#: the tokenizer files a server reads from a model folder (copied from ``tokenizer_dir``)
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)


@dataclass
class SyncRecord:
    """One sync: the step's version, where its weights are, and how long saving and pushing took."""

    version: str
    weights_dir: Path
    save_seconds: float
    sync_seconds: float
    result: Any = None


class WeightSyncCallback(TrainerCallback):  # type: ignore[misc]
    """Saves the policy to ``out_dir/step-<N>`` after each optimizer step (every ``every``
    steps) and calls ``sync(folder, str(N))``; keeps the newest ``keep`` folders.

    ``tokenizer_dir`` (the starting model's folder) supplies the tokenizer files the servers
    read, byte for byte; without it the trainer's ``processing_class`` is saved. ``on_sync`` is
    called with each :class:`SyncRecord`. A sync that raises stops training: the servers would
    otherwise keep sampling with weights the trainer has left behind.
    """

    def __init__(
        self,
        sync: SyncHook,
        out_dir: str | Path,
        *,
        tokenizer_dir: str | Path | None = None,
        every: int = 1,
        keep: int = 2,
        on_sync: Callable[[SyncRecord], None] | None = None,
    ) -> None:
        if every < 1 or keep < 1:
            raise ValueError(f"every and keep must be at least 1, got {every} and {keep}")
        self.sync = sync
        self.out_dir = Path(out_dir)
        self.tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir is not None else None
        self.every = every
        self.keep = keep
        self.on_sync = on_sync
        self.records: list[SyncRecord] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        """Save and sync the weights the next rollouts will sample with."""
        if state.global_step % self.every:
            return control
        model = kwargs["model"]
        version = str(state.global_step)
        t0 = time.perf_counter()
        folder = save_policy(
            model,
            self.out_dir / f"step-{version}",
            self.tokenizer_dir,
            kwargs.get("processing_class"),
        )
        t1 = time.perf_counter()
        result = self.sync(folder, version)
        record = SyncRecord(version, folder, t1 - t0, time.perf_counter() - t1, result)
        self.records.append(record)
        self._prune(folder)
        if self.on_sync is not None:
            self.on_sync(record)
        return control

    def _prune(self, current: Path) -> None:
        folders = sorted(
            (p for p in self.out_dir.glob("step-*") if p.is_dir() and p != current),
            key=lambda p: p.stat().st_mtime,
        )
        for old in folders[: max(0, len(folders) - (self.keep - 1))]:
            shutil.rmtree(old, ignore_errors=True)


def save_policy(
    model: Any, folder: Path, tokenizer_dir: Path | None = None, tokenizer: Any = None
) -> Path:
    """``model`` as a Hugging Face folder (safetensors, float32) a server can load; a LoRA
    (peft) model is saved with its adapters merged in, as the full model a server reloads."""
    folder.mkdir(parents=True, exist_ok=True)
    unwrapped = getattr(model, "module", model)
    if getattr(unwrapped, "peft_config", None) and hasattr(unwrapped, "merge_adapter"):
        _save_merged(unwrapped, folder)
    else:
        unwrapped.save_pretrained(folder, safe_serialization=True)
    if tokenizer_dir is not None:
        copy_tokenizer(tokenizer_dir, folder)
    elif tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return folder


def _save_merged(model: Any, folder: Path) -> None:
    """The base model with each LoRA layer's delta added to its weight, under the base model's
    own parameter names (as TRL names them for its vLLM push). Computed beside the weights, not
    merged into them: a merge and unmerge would leave rounding drift in the trained base.

    A LoRA layer adapts a module's ``weight`` or, for a peft ``ParamWrapper`` (``target_parameters``,
    which ``all-linear`` picks for the fused MoE experts and router of transformers >= 5), the
    parameter it names, possibly under nested wrappers (``experts.base_layer.base_layer.down_proj``):
    each delta goes to the parameter itself, found by identity, never to a guessed name."""
    base = model.get_base_model()
    owners = {id(p): n for n, p in base.named_parameters(remove_duplicate=False)}
    deltas: dict[str, Any] = {}
    for name, module in base.named_modules():
        if not (hasattr(module, "get_delta_weight") and hasattr(module, "base_layer")):
            continue
        if getattr(module, "merged", False):  # already in the weight
            continue
        for adapter in getattr(module, "active_adapters", ()):
            if adapter in getattr(module, "lora_A", {}):
                key = _adapted_parameter(module, name, owners)
                delta = module.get_delta_weight(adapter).detach()
                deltas[key] = deltas[key] + delta if key in deltas else delta
    state = {}
    for name, tensor in base.state_dict().items():
        if "lora_" in name or "original_module" in name:
            continue
        value = tensor + deltas[name].to(tensor.dtype) if name in deltas else tensor
        state[name.replace(".base_layer", "").replace("modules_to_save.default.", "")] = value
    base.save_pretrained(folder, state_dict=state, safe_serialization=True)


def _adapted_parameter(layer: Any, name: str, owners: dict[int, str]) -> str:
    """The state-dict name of the parameter the LoRA ``layer`` (at ``name``) adds its delta to."""
    if hasattr(layer, "get_param"):  # a ParamWrapper: the parameter it names, on its base module
        param = layer.get_param()
    else:
        param = getattr(layer.get_base_layer(), "weight", None)
    key = owners.get(id(param))
    if key is None:
        raise RuntimeError(
            f"LoRA layer {name} ({type(layer).__name__}) adapts no parameter of the base model "
            "this export can find; its delta cannot be merged into the folder the servers load"
        )
    return key


def copy_tokenizer(src: Path, dst: Path) -> None:
    """The tokenizer files a server reads, from the model folder ``src`` into ``dst``."""
    for name in _TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, dst / name)


def http_weight_sync(
    servers: Sequence[str],
    *,
    gateway: str | None = None,
    admin_key: str | None = None,
    timeout: float = 300.0,
) -> SyncHook:
    """A :data:`SyncHook` for vLLM-shaped servers: ``POST /collective_rpc`` ``reload_weights``
    with the folder, ``POST /reset_prefix_cache`` (a reload keeps the cache) and ``POST
    /update_weight_version`` on each, then the gateway's ``POST /api/policy_version``. No
    verification: rollwire's ``WeightSync`` probes each server against the trainer instead."""
    urls = [u.rstrip("/") for u in servers]
    if not urls:
        raise ValueError("http_weight_sync needs at least one server URL")

    def sync(weights_dir: Path, version: str) -> dict[str, float]:
        t0 = time.perf_counter()
        # absolute: a server started in another working folder reads the path from its own
        folder = str(Path(weights_dir).resolve())
        with httpx.Client(timeout=timeout) as http:
            for url in urls:
                _post(
                    http,
                    f"{url}/collective_rpc",
                    {"method": "reload_weights", "kwargs": {"weights_path": folder}},
                )
                _post(http, f"{url}/reset_prefix_cache", None)
                _post(http, f"{url}/update_weight_version", {"new_version": version})
            if gateway is not None:
                headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
                _post(
                    http,
                    f"{gateway.rstrip('/')}/api/policy_version",
                    {"version": version},
                    headers,
                )
        return {"push_seconds": time.perf_counter() - t0}

    return sync


def _post(http: httpx.Client, url: str, body: Any, headers: dict[str, str] | None = None) -> None:
    resp = http.post(url, json=body, headers=headers or {})
    if resp.status_code >= 400:
        raise RuntimeError(
            f"weight sync: POST {url} answered {resp.status_code}: {resp.text[:300]}; the "
            "server keeps its old weights (vLLM needs VLLM_SERVER_DEV_MODE=1 for these routes)"
        )
