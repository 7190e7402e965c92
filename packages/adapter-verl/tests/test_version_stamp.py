"""verl's step as the gateway's policy version (issue 24.5), through verl 0.9.1's own v1 path.

verl pushes its own weights: ``update_weights(global_steps)`` at the end of each step (and with the
loaded step before the first), so step S rolls out on version ``S - 1``. Its v1 trainer tags each
batch ``global_steps`` (``PPOTrainer._next_train_batch``: ``tu.assign_non_tensor_data``), and
``AgentLoopWorkerTQ.generate_sequences`` → ``_run_prompt`` → ``_run_agent_loop(**prompt)`` hands
it to ``RollwireAgentLoop.run``, which stamps the gateway before the step's first session. Here
the batches are built as verl's dataloader builds them (``collate_fn``, ``tu.get_tensordict``),
and verl's real worker runs them (only ``transfer_queue`` is a stand-in: it is not installed).
"""

from __future__ import annotations

import asyncio
import sys
import types
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("verl")
torch = pytest.importorskip("torch")

from omegaconf import OmegaConf  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils.dataset.rl_dataset import collate_fn  # noqa: E402

from rollwire.data.protocol import Group  # noqa: E402
from rollwire_verl import agent_loop as al  # noqa: E402
from rollwire_verl import resources, to_dataproto  # noqa: E402

AGENT_MODULE = "rollwire_verl_stamp_agent"
N = 2  # rollout.n


async def _agent(payload: dict[str, Any]) -> dict[str, Any]:
    from rollwire.agent.context import async_openai_client

    client = async_openai_client(payload)
    model = payload["_rollwire"]["model"]
    await client.chat.completions.create(
        model=model, messages=list(payload["raw_prompt"]), max_tokens=8
    )
    return {"reward": 1.0}


@pytest.fixture
def stack(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Any]]:
    """verl's vLLM servers report no weight version of their own (verl keeps ``global_steps`` on
    its Ray actor): the embedded engine says vLLM's ``"default"``, behind a real gateway."""
    from rollwire.engine import EmbeddedEngine, EngineConfig
    from rollwire.gateway import serve_in_thread

    module = types.ModuleType(AGENT_MODULE)
    module.agent = _agent  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, AGENT_MODULE, module)
    script = {"rules": [{"match": r".*", "reply": "42"}]}
    with (
        EmbeddedEngine(EngineConfig(scripted=script, weight_version="default")) as engine,
        serve_in_thread(backends=[(engine.url, "vllm")]) as gateway,
    ):
        # what a verl user sets: the registry entry has no options, the loop reads these
        monkeypatch.setenv("ROLLWIRE_GATEWAY_URL", gateway.url)
        monkeypatch.setenv("ROLLWIRE_ADMIN_KEY", gateway.admin_key)
        monkeypatch.setenv("ROLLWIRE_AGENT", f"{AGENT_MODULE}:agent")
        monkeypatch.setenv("ROLLWIRE_MODEL", "policy")
        yield engine, gateway


def _tokenizer() -> Any:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel({"<pad>": 0}, unk_token="<pad>")), pad_token="<pad>"
    )


@pytest.fixture
def worker(tq_worker: tuple[Any, Any]) -> tuple[Any, Any]:
    """verl 0.9.1's ``AgentLoopWorkerTQ`` (``tq_worker``) given what its ``__init__`` sets."""
    w, fake = tq_worker
    rollout = {
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "calculate_log_probs": True,
        "n": N,
        "prompt_length": 64,
        "response_length": 32,
        "val_kwargs": {"top_p": 1.0, "top_k": -1, "temperature": 0.0, "n": 1},
        "agent": {"default_agent_loop": al.AGENT_NAME},
    }
    w.config = OmegaConf.create(
        {"actor_rollout_ref": {"rollout": rollout, "model": {"path": "policy"}}, "data": {}}
    )
    w.rollout_config = w.config.actor_rollout_ref.rollout
    w.llm_client, w.processor, w.tools, w.dataset_cls, w.hf_model_type = None, None, [], None, None
    w.tokenizer = _tokenizer()
    w.reward_loop_worker_handles, w.distillation_enabled = None, False
    w.background_tasks = set()
    return w, fake


def _batch(global_steps: int, prompts: int = 2) -> Any:
    """One batch as verl's v1 trainer submits it: collated rows, uids, ``global_steps``."""
    rows = [
        {"raw_prompt": [{"role": "user", "content": f"q{i}"}], "index": i} for i in range(prompts)
    ]
    batch_dict = collate_fn(rows)
    batch_dict["uid"] = [str(uuid.uuid4()) for _ in range(prompts)]
    batch = tu.get_tensordict(batch_dict)
    tu.assign_non_tensor_data(batch, "global_steps", global_steps)
    return batch


async def _rollout_step(worker: Any, fake: Any, global_steps: int) -> list[dict[str, Any]]:
    """verl's worker on one batch: it spawns the agent loops and returns; wait for their puts."""
    before = len(fake.puts)
    await worker.generate_sequences(_batch(global_steps))
    while worker.background_tasks:
        await asyncio.wait(set(worker.background_tasks))
    return fake.puts[before:]


def _versions(gateway: Any) -> tuple[str | None, int, int | None]:
    with gateway.client() as c:
        info = c.staleness()
    return info["policy_version"], info["policy_seq"], info["trainer_seq"]


def _calls_of(gateway: Any, puts: list[dict[str, Any]]) -> list[Any]:
    fields = [put["fields"] for put in puts]
    ids = [f["extra_fields"][i]["rollout_id"] for f in fields for i in range(f.batch_size[0])]
    with gateway.client() as c:
        return [c.rollout(rid) for rid in ids]


async def test_each_step_stamps_verls_served_version(
    stack: tuple[Any, Any], worker: tuple[Any, Any]
) -> None:
    _, gateway = stack
    w, fake = worker
    try:
        assert _versions(gateway) == (None, 0, None)
        step1 = await _rollout_step(w, fake, global_steps=1)
        # step 1 rolls out on the weights verl loaded before it: version 0
        assert _versions(gateway) == ("0", 0, 0)
        step2 = await _rollout_step(w, fake, global_steps=2)
        assert _versions(gateway) == ("1", 1, 1)
        # verl's own staleness tags: max_global_steps is the version that sampled the rollout
        assert [t["max_global_steps"] for p in step1 for t in p["tags"]] == [0] * 2 * N
        assert [t["max_global_steps"] for p in step2 for t in p["tags"]] == [1] * 2 * N
        # every call the gateway recorded carries the stamp, and so does the export
        r1, r2 = _calls_of(gateway, step1), _calls_of(gateway, step2)
        assert {c.policy_version for r in r1 for c in r.calls} == {"0"}
        assert {c.policy_version for r in r2 for c in r.calls} == {"1"}
        dp = to_dataproto([Group(group_id="g", rollouts=r2)])
        assert [list(v) for v in dp.non_tensor_batch["weight_versions"]] == [["1"]] * 2 * N

        # a worker late on step 1 (or verl's validation, tagged with the step it follows): the
        # gateway stays on version 1, and those calls carry it
        late = await _rollout_step(w, fake, global_steps=1)
        assert _versions(gateway) == ("1", 1, 1)
        assert {c.policy_version for r in _calls_of(gateway, late) for c in r.calls} == {"1"}
    finally:
        await al.aclose_resources()


async def test_one_stamp_per_step_per_process(
    stack: tuple[Any, Any], worker: tuple[Any, Any]
) -> None:
    _, gateway = stack
    w, fake = worker
    try:
        await _rollout_step(w, fake, global_steps=3)
        await _rollout_step(w, fake, global_steps=3)
        (res,) = resources._RESOURCES.values()
        assert (res.stamp.step, res.stamp.version, res.stamp.moved) == (2, "2", 1)
        assert _versions(gateway) == ("2", 2, 2)
    finally:
        await al.aclose_resources()


async def test_stamping_can_be_turned_off(
    stack: tuple[Any, Any], worker: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, gateway = stack
    w, fake = worker
    monkeypatch.setenv("ROLLWIRE_STAMP_VERSION", "false")
    try:
        puts = await _rollout_step(w, fake, global_steps=5)
        assert _versions(gateway) == (None, 0, None)
        # nothing stamped, nothing reported: verl's own fallback, global_steps - 1
        assert [t["max_global_steps"] for p in puts for t in p["tags"]] == [4] * 2 * N
    finally:
        await al.aclose_resources()
    monkeypatch.setenv("ROLLWIRE_STAMP_VERSION", "sometimes")
    with pytest.raises(ValueError, match="stamp_version must be true or false, got 'sometimes'"):
        al.LoopSettings.from_options({})
