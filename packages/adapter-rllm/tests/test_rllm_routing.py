"""``Step.routing_matrices`` against the two readers rLLM has (issue 14, item 3).

rLLM's verl backend reads a ``[header_json, base64_blob]`` pair covering the step's prompt and
response, ignores a list of any other length, and fails on a per-token list of exactly two entries;
its Tinker/Fireworks path reads one entry per completion token. What rLLM's real code makes of
both forms is recorded (``test_rllm_contract.py``); these tests check rollwire's encoding against
the captured routing with rollwire's own decoders, which that recording ties to rLLM's. The last
test runs one MoE batch (a clean, a forked, a
failed and a no-call rollout) through a real gateway over the engine with routing on.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from rollwire.data.protocol import Rollout
from rollwire.data.trajectory import build_rows
from rollwire.engine.server import EmbeddedEngine
from rollwire.gateway import RunningGateway, serve_in_thread
from rollwire.testing import moe_rollout
from rollwire.testing.mixed_batch import KINDS, MixedAgent, script
from rollwire.testing.samples import LAYERS, TOP_K
from rollwire_rllm import (
    RollwireAgentFlow,
    decode_routing_matrix,
    decode_verl_routing,
    episode_rows,
    to_episode_dicts,
)
from rollwire_rllm.routing import routing_matrices

from .conftest import AgentConfig, Task


def test_verl_form_is_one_pair_covering_prompt_and_response() -> None:
    (ep,) = to_episode_dicts([moe_rollout("m")])  # the default format
    for step, call in zip(ep["trajectories"][0]["steps"], moe_rollout("m").calls):
        pair = step["routing_matrices"]
        assert isinstance(pair, list) and len(pair) == 2
        assert json.loads(pair[0]) == {"shape": [LAYERS, TOP_K], "dtype": "int16"}
        decoded = decode_verl_routing(pair)
        assert decoded is not None and decoded.dtype == np.int16
        np.testing.assert_array_equal(decoded, call.routed_experts)
        assert step["model_output"]["routing_matrices"] == pair


def test_tinker_form_has_one_entry_per_completion_token() -> None:
    call = moe_rollout("m").calls[0]
    entries = routing_matrices(call, "tinker")
    assert entries is not None and len(entries) == call.completion_ids.shape[0]
    p = call.prompt_ids.shape[0]
    assert call.routed_experts is not None
    for j, entry in enumerate(entries):
        np.testing.assert_array_equal(decode_routing_matrix(entry), call.routed_experts[p + j - 1])


def test_unknown_routing_format_is_an_error() -> None:
    with pytest.raises(ValueError, match="routing_format"):
        to_episode_dicts([moe_rollout("m")], routing_format="fireworks")  # type: ignore[arg-type]


# -- one MoE batch end to end ---------------------------------------------------------------------


@pytest.fixture
def gateway() -> Iterator[RunningGateway]:
    with (
        EmbeddedEngine(scripted=script, return_routed_experts=True) as engine,
        serve_in_thread(backends=[(engine.url, "sglang")]) as gw,
    ):
        yield gw


async def test_end_to_end_mixed_moe_batch(gateway: RunningGateway) -> None:
    agent = MixedAgent()
    flow = RollwireAgentFlow(agent, gateway=gateway, capture="tokens", native=False)
    task = Task(id="t1", instruction="2+2?", metadata={"answer": "4"})
    episodes = [
        await flow.arun(task, AgentConfig(base_url="-", model="policy", session_uid=f"t1:{i}"))
        for i in range(4)
    ]
    assert agent.kinds == list(KINDS)
    by_kind = dict(zip(agent.kinds, episodes))
    for kind in ("failed", "no_call"):
        assert by_kind[kind]["trajectories"] == []  # dropped by rLLM: trains nothing
        assert by_kind[kind]["termination_reason"] == "error"
    rows = {kind: episode_rows(ep) for kind, ep in by_kind.items()}
    assert [len(rows[k]) for k in KINDS] == [1, 2, 0, 0]
    model = gateway.client()
    # every step has routing (rLLM's verl backend keeps it only when every row has), and each
    # row's last step's routing, as rLLM decodes it (test_rllm_contract.py), is what the gateway
    # captured for the row's last call, covering its prompt and response
    for kind in ("clean", "forked"):
        ep = by_kind[kind]
        steps = ep["trajectories"][0]["steps"]
        assert all(len(s["routing_matrices"]) == 2 for s in steps)  # rLLM's verl pair
        calls = model.calls(ep["info"]["rollwire"]["rollout_id"])
        for row in rows[kind]:
            assert row.loss_mask.any()
            full = row.input_ids.tolist()
            step = next(s for s in steps if s["prompt_ids"] + s["response_ids"] == full)
            last = next(
                c for c in calls if c.prompt_ids.tolist() + c.completion_ids.tolist() == full
            )
            decoded = decode_verl_routing(step["routing_matrices"])
            assert decoded.shape[0] == len(full) - 1
            np.testing.assert_array_equal(decoded, last.routed_experts)
    rollout: Rollout = model.rollout(by_kind["forked"]["info"]["rollwire"]["rollout_id"])
    assert len(build_rows([rollout])) == 2


async def _streaming_agent(payload: dict[str, Any]) -> float:
    from rollwire.agent.context import async_openai_client

    client = async_openai_client(payload)
    stream = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "2+2?"}], stream=True
    )
    async for _ in stream:
        pass
    return 1.0


async def test_streamed_passthrough_steps_carry_routing(gateway: RunningGateway) -> None:
    flow = RollwireAgentFlow(
        _streaming_agent, gateway=gateway, capture="passthrough", native=False, routed_experts=True
    )
    task = Task(id="t2", instruction="2+2?")
    ep = await flow.arun(task, AgentConfig(base_url="-", model="policy", session_uid="t2:0"))
    (step,) = ep["trajectories"][0]["steps"]
    decoded = decode_verl_routing(step["routing_matrices"])
    assert decoded is not None
    assert decoded.shape[0] == len(step["prompt_ids"]) + len(step["response_ids"]) - 1
