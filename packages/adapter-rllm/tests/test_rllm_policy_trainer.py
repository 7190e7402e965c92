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


class _Tokenizer:
    """Renders each message as its role's id, its characters, then end-of-turn (2)."""

    eos_token_id = 2
    roles = {"user": 4, "assistant": 3}

    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool, tokenize: bool
    ) -> list[int]:
        ids = [
            t
            for m in messages
            for t in [self.roles[m["role"]], *(10 + ord(c) % 50 for c in m["content"]), 2]
        ]
        return ids + [3] * add_generation_prompt


class _Future:
    def __init__(self, value: object) -> None:
        self.value = value

    def result(self) -> object:
        return self.value


class _TrainingClient:
    """Records the warm-up's batches; every target token gets log-prob -1."""

    def __init__(self) -> None:
        self.batches: list[list[object]] = []
        self.rates: list[float] = []

    def forward_backward(self, datums: list[object], loss_fn: str) -> _Future:
        import numpy as np
        import tinker

        assert loss_fn == "cross_entropy"
        self.batches.append(datums)
        outputs = [
            {"logprobs": tinker.types.TensorData.from_numpy(np.full(d.model_input.length, -1.0))}  # type: ignore[attr-defined]
            for d in datums
        ]
        return _Future(type("Out", (), {"loss_fn_outputs": outputs})())

    def optim_step(self, adam: object) -> _Future:
        self.rates.append(adam.learning_rate)  # type: ignore[attr-defined]
        return _Future(None)


def test_sft_warms_up_on_the_assistant_turns(tmp_path: Path) -> None:
    pytest.importorskip("tinker")
    from rollwire_rllm.policy_trainer import sft_warmup

    conversation = [
        {"role": "user", "content": "Box A"},
        {"role": "assistant", "content": "read"},
        {"role": "user", "content": "code 7"},
        {"role": "assistant", "content": "7"},
    ]
    spec = RunSpec(out=tmp_path, warmup_steps=3, warmup_batch_size=2, warmup_learning_rate=3e-3)
    client = _TrainingClient()
    losses = sft_warmup(client, _Tokenizer(), [conversation], spec)
    assert losses == [1.0, 1.0, 1.0]  # -log-prob per labelled token
    assert client.rates == [3e-3] * 3 and [len(b) for b in client.batches] == [2, 2, 2]
    datum = client.batches[0][0]
    targets = datum.loss_fn_inputs["target_tokens"].to_numpy().tolist()  # type: ignore[attr-defined]
    weights = datum.loss_fn_inputs["weights"].to_numpy().tolist()  # type: ignore[attr-defined]
    trained = [t for t, w in zip(targets, weights) if w]
    read = [10 + ord(c) % 50 for c in "read"]
    assert trained == [*read, 2, 10 + ord("7") % 50, 2]  # assistant text and end-of-turn only
