"""``Step.routing_matrices`` against the two readers rLLM has (issue 14, item 3).

rLLM's verl backend reads a ``[header_json, base64_blob]`` pair covering the step's prompt and
response, ignores a list of any other length, and fails on a per-token list of exactly two entries;
its Tinker/Fireworks path reads one entry per completion token. The readers are the stand-ins of
conftest.py, written from that behaviour. The last test runs one MoE batch (a clean, a forked, a
failed and a no-call rollout) through a real gateway over the engine with routing on.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
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
from rollwire_rllm import RollwireAgentFlow, decode_routing_matrix, to_episode_dicts
from rollwire_rllm.routing import routing_matrices

from .conftest import verl_decode_routing, verl_routed_experts, verl_segments


def _two_token_call() -> Any:
    rollout = moe_rollout("two")
    call = rollout.calls[0]
    p = call.prompt_ids.shape[0]
    call.completion_ids = call.completion_ids[:2]
    call.logprobs = call.logprobs[:2]
    assert call.routed_experts is not None
    call.routed_experts = call.routed_experts[: p + 1]
    return call


def test_verl_form_is_one_pair_covering_prompt_and_response() -> None:
    (ep,) = to_episode_dicts([moe_rollout("m")])  # the default format
    for step, call in zip(ep["trajectories"][0]["steps"], moe_rollout("m").calls):
        pair = step["routing_matrices"]
        assert isinstance(pair, list) and len(pair) == 2
        assert json.loads(pair[0]) == {"shape": [LAYERS, TOP_K], "dtype": "int16"}
        decoded = verl_decode_routing(pair)
        assert decoded is not None and decoded.dtype == np.int16
        np.testing.assert_array_equal(decoded, call.routed_experts)
        assert step["model_output"]["routing_matrices"] == pair


def test_verl_form_of_a_two_token_step_is_read_not_crashed() -> None:
    call = _two_token_call()
    decoded = verl_decode_routing(routing_matrices(call, "verl"))
    assert decoded is not None and decoded.shape == (call.prompt_ids.shape[0] + 1, LAYERS, TOP_K)
    # the per-token form is a different contract: rLLM's verl reader cannot take it
    with pytest.raises(TypeError):
        verl_decode_routing(routing_matrices(call, "tinker"))


def test_tinker_form_has_one_entry_per_completion_token() -> None:
    call = moe_rollout("m").calls[0]
    entries = routing_matrices(call, "tinker")
    assert entries is not None and len(entries) == call.completion_ids.shape[0]
    p = call.prompt_ids.shape[0]
    assert call.routed_experts is not None
    for j, entry in enumerate(entries):
        np.testing.assert_array_equal(decode_routing_matrix(entry), call.routed_experts[p + j - 1])
    assert verl_decode_routing(entries) is None  # ignored by the verl backend (length != 2)


def test_unknown_routing_format_is_an_error() -> None:
    with pytest.raises(ValueError, match="routing_format"):
        to_episode_dicts([moe_rollout("m")], routing_format="fireworks")  # type: ignore[arg-type]


def test_merged_segment_routing_is_the_rows_routing() -> None:
    rollout = moe_rollout("m")
    (row,) = build_rows([rollout])
    (seg,) = verl_segments(to_episode_dicts([rollout])[0])
    assert seg["prompt"] + seg["response"] == row.input_ids.tolist()
    decoded = verl_decode_routing(seg["routing"])
    assert row.routed_experts is not None
    np.testing.assert_array_equal(decoded, row.routed_experts)


# -- one MoE batch end to end ---------------------------------------------------------------------


@dataclass
class AgentConfig:
    """rLLM's ``AgentConfig`` shape, as its ``AgentFlowEngine`` fills it."""

    base_url: str
    model: str
    session_uid: str
    metadata: dict[str, Any] = field(default_factory=dict)
    is_validation: bool = False
    sampling_params: dict[str, Any] = field(default_factory=dict)


@dataclass
class Task:
    id: str
    instruction: str
    metadata: dict[str, Any] = field(default_factory=dict)


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
    segments = {kind: verl_segments(ep) for kind, ep in by_kind.items()}
    assert [len(segments[k]) for k in KINDS] == [1, 2, 0, 0]
    rows = [s for k in KINDS for s in segments[k]]
    p = max(len(s["prompt"]) for s in rows)
    r = max(len(s["response"]) for s in rows)
    placed = verl_routed_experts(rows, p, r)
    assert placed is not None  # every trained row has routing: the batch keeps it
    model = gateway.client()
    for i, seg in enumerate(rows):
        assert any(seg["mask"])
        start = p - len(seg["prompt"])
        n = len(seg["prompt"]) + len(seg["response"]) - 1
        assert np.count_nonzero(placed[i, :start]) == 0
        assert placed[i, start : start + n].any()
    # each segment's routing is exactly what the gateway captured for its last call
    for kind in ("clean", "forked"):
        ep = by_kind[kind]
        calls = model.calls(ep["info"]["rollwire"]["rollout_id"])
        for seg in segments[kind]:
            last = next(
                c for c in calls if c.prompt_ids.tolist() + c.completion_ids.tolist() == seg["full"]
            )
            np.testing.assert_array_equal(verl_decode_routing(seg["routing"]), last.routed_experts)
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
    decoded = verl_decode_routing(step["routing_matrices"])
    assert decoded is not None
    assert decoded.shape[0] == len(step["prompt_ids"]) + len(step["response_ids"]) - 1
