"""LoRA runs: by default each sync pushes the adapter alone, which the embedded engine loads by
name and serves as the trainer computes it (``rollwire train --lora-rank 8`` on lockbox);
with ``--lora-sync merged`` the folder is the full model with the adapters merged in, under the
base model's own parameter names; the adapters stay unmerged for training."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
import pytest


def test_a_lora_model_is_saved_merged_and_matches_the_trainer(
    trl: ModuleType, tmp_path: Path
) -> None:
    import peft  # setup-venv.sh installs it: the group fails, not skips, without it
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    from rollwire_trl.policy_trainer import lora_config
    from rollwire_trl.sync import save_policy

    cfg = LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    base = LlamaForCausalLM(cfg).float()
    before = {k: v.clone() for k, v in base.state_dict().items()}
    model = peft.get_peft_model(base, lora_config(4))
    with torch.no_grad():  # LoRA starts as a no-op (B = 0): give it a real delta
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    ids = torch.tensor([[1, 5, 9, 33, 70, 2]])
    with torch.no_grad():
        expected = model(ids).logits

    folder = save_policy(model, tmp_path / "step-1")

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert not [k for k in keys if "lora" in k or "base_layer" in k]
    assert keys <= set(before) and "model.layers.0.self_attn.q_proj.weight" in keys
    reloaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        served = reloaded(ids).logits
        plain = LlamaForCausalLM(cfg).float()
        plain.load_state_dict(before)
        untrained = plain(ids).logits
    assert torch.allclose(served, expected, atol=1e-5)
    assert not torch.allclose(served, untrained, atol=1e-2)  # the delta really is in there
    # the trainer's model is unmerged again: its base weights are the starting ones
    q = model.get_base_model().model.layers[0].self_attn.q_proj
    assert torch.equal(q.base_layer.weight, before["model.layers.0.self_attn.q_proj.weight"])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, expected, atol=1e-6)


# peft 0.21 warns that its own pattern for the nested experts wrapper matched nothing
@pytest.mark.filterwarnings("ignore:The following (rank|alpha)_pattern keys:RuntimeWarning")
def test_a_lora_mixtral_export_serves_what_the_trainer_computes(
    trl: ModuleType, base_model: Path, tmp_path: Path
) -> None:
    """Issue 37: on transformers >= 5 the Mixtral experts are fused parameters, which peft's
    ``all-linear`` adapts through ``ParamWrapper``s; the export dropped those deltas, so the
    engine served a policy up to 0.018 off the trainer's and the weight-sync probe failed."""
    import peft
    import torch
    from transformers import AutoModelForCausalLM

    from rollwire.trainer.references import engine_reference, transformers_reference
    from rollwire_trl.sync import save_policy

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
    config = peft.LoraConfig(  # what `rollwire train --lora-rank 8` trains
        r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM"
    )
    model = peft.get_peft_model(base, config)
    adapted = {n for n, m in model.named_modules() if hasattr(m, "parameter_name")}
    assert any(n.endswith("mlp.experts") for n in adapted)  # the fused experts carry LoRA
    with torch.no_grad():  # LoRA starts as a no-op (B = 0): give it a real delta
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)

    folder = save_policy(model, tmp_path / "step-1", base_model)

    prompt, completion = list(range(3, 20)), list(range(40, 72))
    trainer = transformers_reference(model)(prompt, completion)
    served = engine_reference(folder)(prompt, completion)
    untrained = engine_reference(base_model)(prompt, completion)
    assert max(abs(a - b) for a, b in zip(trainer, served)) < 1e-3  # WeightSync's tolerance
    assert max(abs(a - b) for a, b in zip(trainer, untrained)) > 1e-1  # the delta is real


def test_lora_config_is_none_for_full_weights() -> None:
    from rollwire_trl.policy_trainer import lora_config

    assert lora_config(0) is None


def test_a_lora_run_on_lockbox_syncs_adapters(
    trl: ModuleType, train_cli: Any, tmp_path: Path
) -> None:
    """Two steps of ``rollwire train --lora-rank 8`` on the embedded engine: each export is a
    PEFT adapter on the modules servers adapt, loaded by the engine as ``policy@N`` and
    verified against the trainer's LoRA model; the next step's calls were sampled by it."""
    from rollwire_trl.policy_trainer import SERVED_LORA_TARGETS

    train_cli(
        "--out", "run", "--task", "lockbox", "--lora-rank", "8", "--steps", "2", "--seed", "0",
        "--warmup-steps", "10", "--tasks-per-step", "2", "--group-size", "4",
        "--eval-size", "4", "--eval-k", "1", "--eval-every", "0",
        cwd=tmp_path, timeout=1100,
    )  # fmt: skip
    run = tmp_path / "run"
    steps = [orjson.loads(line) for line in (run / "steps.jsonl").read_bytes().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        sync = s["sync"]
        assert sync["sync/adapter"] == 1.0 and sync["sync/servers_verified"] == 1, s
        assert sync["sync/servers_failed"] == 0 and sync["sync/probe_max_abs_diff"] < 1e-3, s
        assert sync["sync/load_s"] > 0 and sync["sync/save_s"] > 0, s
    assert steps[1]["policy_versions"] == ["1"]  # step 2 rolled out on adapter policy@1
    exported = run / "policy" / "step-2"
    assert sorted(p.name for p in exported.glob("adapter_*")) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    assert not (exported / "model.safetensors").exists()  # the adapter alone travels
    config = json.loads((exported / "adapter_config.json").read_text())
    assert config["r"] == 8 and set(config["target_modules"]) <= set(SERVED_LORA_TARGETS)
    assert (run / "final" / "model.safetensors").is_file()  # the trained policy, merged
