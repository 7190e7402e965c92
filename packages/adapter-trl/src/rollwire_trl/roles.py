"""One LoRA adapter per role in one PEFT model (``rollwire train --roles``): each role's adapter
is named for the role, trained with its own optimizer while the others are frozen and off, and
exported alone (PEFT's folder for that adapter), for the servers to load as
``<role>@<version>`` (:mod:`rollwire.trainer.roles`)."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["activate_role", "load_role_adapters", "role_adapters", "save_role_adapter"]


def role_adapters(model: Any, roles: Sequence[str], config: Any) -> Any:
    """``model`` with one fresh LoRA adapter per role (``config`` each), the first active."""
    from peft import get_peft_model

    peft_model = get_peft_model(model, config, adapter_name=roles[0])
    for role in roles[1:]:
        peft_model.add_adapter(role, config)
    activate_role(peft_model, roles[0])
    return peft_model


def load_role_adapters(model: Any, roles: Sequence[str], folder: Path) -> Any:
    """``model`` with each role's trained adapter from ``folder/<role>`` (a checkpoint's PEFT
    folder of every role's adapter), trainable, the first active."""
    from peft import PeftModel

    missing = [r for r in roles if not (folder / r / "adapter_config.json").is_file()]
    if missing:
        raise ValueError(
            f"--resume: {folder} holds no adapter for roles {missing}: resume with the roles "
            "the run was started with"
        )
    peft_model = PeftModel.from_pretrained(
        model, folder / roles[0], adapter_name=roles[0], is_trainable=True
    )
    for role in roles[1:]:
        peft_model.load_adapter(folder / role, adapter_name=role, is_trainable=True)
    activate_role(peft_model, roles[0])
    return peft_model


def activate_role(model: Any, role: str) -> None:
    """Make ``role``'s adapter the one the model applies and the only trainable parameters."""
    model.set_adapter(role)
    marker = f".{role}."
    for name, param in model.named_parameters():
        param.requires_grad = "lora_" in name and marker in name


def save_role_adapter(model: Any, role: str, folder: Path) -> Path:
    """``role``'s adapter alone as a PEFT folder (``adapter_config.json`` and
    ``adapter_model.safetensors``) at ``folder``."""
    shutil.rmtree(folder, ignore_errors=True)
    staging = folder.parent / f".{folder.name}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging, selected_adapters=[role], safe_serialization=True)
    # PEFT writes an adapter not named "default" under a folder of its name
    (staging / role).rename(folder)
    shutil.rmtree(staging, ignore_errors=True)
    return folder
