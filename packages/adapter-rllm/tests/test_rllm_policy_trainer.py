"""``rollwire train --trainer rllm``'s plugin surface, without rLLM or a Tinker service."""

from __future__ import annotations

from pathlib import Path

import pytest

import rollwire_rllm
from rollwire.testing.samples import sample_batch
from rollwire.trainer.loop import RunSpec
from rollwire_rllm.policy_trainer import RllmPolicyTrainer, _group_by_rollout_group


def test_the_plugin_trains_and_names_what_it_needs() -> None:
    adapter = rollwire_rllm.adapter
    assert callable(adapter.policy_trainer)
    assert "rllm" in adapter.train_requires
    assert "--no-deps" in adapter.install_hint
    assert {o.flag for o in adapter.train_options} >= {"--base-url", "--base-model"}


def test_it_needs_a_service(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--base-url URL and --base-model NAME"):
        RllmPolicyTrainer(RunSpec(out=tmp_path, trainer="rllm"))
    spec = RunSpec(out=tmp_path, trainer="rllm", lora_rank=0)
    spec.options = {"base_url": "http://127.0.0.1:1", "base_model": "m"}
    with pytest.raises(ValueError, match="--lora-rank"):
        RllmPolicyTrainer(spec)


def test_rollouts_are_regrouped_in_group_order() -> None:
    groups = sample_batch()
    shuffled = [r for g in groups for r in g.rollouts][::-1]
    ordered = _group_by_rollout_group(shuffled)
    assert [r.group_id for r in ordered] == ["g1"] * 3 + ["g0"] * 3
