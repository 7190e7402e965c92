"""One MoE batch end to end under verl: a clean, a forked, a failed and a no-call rollout.

The embedded engine (routing on) stands in for verl's vLLM server behind a real gateway; the real
``RollwireAgentLoop`` runs each rollout; verl's legacy ``AgentLoopWorker`` post-processes the
outputs into the DataProto it trains on, and the same rollouts, exported with ``to_dataproto``, go
through verl's ``compute_advantage``. Checked against the full contract: shapes, dtypes, masks,
routing on every row, rewards.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

pytest.importorskip("verl")
torch = pytest.importorskip("torch")

from omegaconf import OmegaConf  # noqa: E402
from verl.experimental.agent_loop.agent_loop import (  # noqa: E402
    AgentLoopOutput,
    AgentLoopWorker,
    DictConfigWrap,
)
from verl.trainer.config import AlgoConfig  # noqa: E402
from verl.trainer.ppo.core_algos import AdvantageEstimator  # noqa: E402
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402

from rollwire.data.protocol import Group  # noqa: E402
from rollwire.testing.mixed_batch import KINDS, MixedAgent, script  # noqa: E402
from rollwire_verl import agent_loop as al  # noqa: E402
from rollwire_verl import to_dataproto  # noqa: E402

P, R = 64, 64
AGENT_MODULE = "rollwire_verl_mixed_agent"


@pytest.fixture
def stack() -> Iterator[tuple[Any, Any, MixedAgent]]:
    from rollwire.engine import EmbeddedEngine, EngineConfig
    from rollwire.gateway import serve_in_thread

    agent = MixedAgent()
    module = types.ModuleType(AGENT_MODULE)
    module.agent = agent  # type: ignore[attr-defined]
    sys.modules[AGENT_MODULE] = module
    try:
        with (
            EmbeddedEngine(EngineConfig(scripted=script, return_routed_experts=True)) as engine,
            serve_in_thread(backends=[(engine.url, "vllm")]) as gateway,
        ):
            yield engine, gateway, agent
    finally:
        sys.modules.pop(AGENT_MODULE, None)


def _loop(gateway: Any, engine: Any, **options: Any) -> al.RollwireAgentLoop:
    cfg = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {"prompt_length": P, "response_length": R},
                "model": {"path": "rollwire-tiny", "use_shm": False},
            },
            "data": {},
        }
    )
    model = engine.engine.model.config
    return al.RollwireAgentLoop(
        DictConfigWrap(cfg),
        None,
        engine.engine.tokenizer,  # the backend's tokenizer: forks get a real class
        None,
        None,
        DictConfigWrap(cfg.data),
        name="rollwire_agent",
        gateway_url=gateway.url,
        admin_key=gateway.admin_key,
        agent=f"{AGENT_MODULE}:agent",
        model="rollwire-tiny",
        routed_experts_shape=[model.n_layers, model.top_k],
        **options,
    )


def _legacy_worker() -> Any:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    worker = object.__new__(AgentLoopWorker)
    worker.reward_loop_worker_handles = None
    worker.distillation_enabled = False
    worker.processor = None
    worker.mm_processor_kwargs = {}
    worker.tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel({"<pad>": 0}, unk_token="<pad>")), pad_token="<pad>"
    )
    worker.rollout_config = types.SimpleNamespace(prompt_length=P, response_length=R)
    return worker


ROW = {
    "raw_prompt": np.array([{"role": "user", "content": "2+2?"}], dtype=object),
    "uid": "task-1",
    "index": np.int64(0),
    "agent_name": "rollwire_agent",
}


async def test_mixed_moe_batch_through_the_agent_loop_and_verl(
    stack: tuple[Any, Any, MixedAgent],
) -> None:
    engine, gateway, agent = stack
    layers, top_k = engine.engine.model.config.n_layers, engine.engine.model.config.top_k
    loop = _loop(gateway, engine, multi_row="last", reward_extra_keys=["clean", "forked"])
    try:
        outs: list[AgentLoopOutput] = []
        for _ in KINDS:
            out = await loop.run({"temperature": 1.0}, **ROW)
            assert isinstance(out, AgentLoopOutput)
            outs.append(out)
        listed = _loop(gateway, engine)  # verl's v1 trainer: a forked rollout is a list
        forked_list = None
        while forked_list is None:
            got = await listed.run({"temperature": 1.0}, **ROW)
            if isinstance(got, list):
                forked_list = got
    finally:
        await al.aclose_resources()
    assert agent.kinds[:4] == list(KINDS)
    by_kind = dict(zip(KINDS, outs))
    for kind, out in by_kind.items():
        assert isinstance(out.routed_experts, np.ndarray) and out.routed_experts.dtype == np.int16
        assert out.routed_experts.shape == (
            len(out.prompt_ids) + len(out.response_ids) - (0 if kind == "no_call" else 1),
            layers,
            top_k,
        ) or out.routed_experts.shape[1:] == (layers, top_k)
        info = out.extra_fields["reward_extra_info"]
        assert set(info) == {"clean", "clean_present", "forked", "forked_present"}
    assert any(by_kind["clean"].response_mask) and any(by_kind["forked"].response_mask)
    assert not any(by_kind["failed"].response_mask) and not any(by_kind["no_call"].response_mask)
    assert by_kind["no_call"].extra_fields["rollwire_placeholder"] is True
    assert by_kind["forked"].extra_fields["fork"] is not None  # the last row of a fork
    assert len(forked_list) == 2 and forked_list[1].extra_fields["fork"] is not None

    worker = _legacy_worker()
    internals = [await worker._agent_loop_postprocess(o, False, **ROW) for o in outs]
    data = worker._postprocess(internals, input_non_tensor_batch=None)
    data.check_consistency()
    b = data.batch
    assert b["routed_experts"].shape == (4, P + R, layers, top_k)
    assert b["routed_experts"].dtype == torch.int16
    assert [float(b["rm_scores"][i].sum()) for i in range(4)] == [1.0, 0.5, 0.0, 0.0]
    assert data.non_tensor_batch["clean_present"].tolist() == [1.0, 0.0, 0.0, 0.0]

    # the same rollouts, from the gateway, as the padded DataProto through verl's estimator
    client = gateway.client()
    rollouts = [client.rollout(o.extra_fields["rollout_id"]) for o in outs]
    for r in rollouts:
        r.group_id = "task-1"
    dp, report = to_dataproto([Group(group_id="task-1", rollouts=rollouts)], return_report=True)
    assert len(dp) == 5 and report.placeholders == 1 and report.failed == 2  # forked: 2 rows
    assert dp.batch["routed_experts"].shape[2:] == (layers, top_k)
    assert bool(
        dp.non_tensor_batch["has_routed_experts"][~dp.non_tensor_batch["placeholder"]].all()
    )
    dp.batch["token_level_rewards"] = dp.batch["rm_scores"]
    compute_advantage(dp, AdvantageEstimator.GRPO, config=AlgoConfig())
    adv = dp.batch["advantages"]
    assert torch.isfinite(adv).all() and bool((adv[dp.batch["response_mask"] == 0] == 0).all())
