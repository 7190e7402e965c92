"""RollwireAgentLoop: pure conversion to verl's AgentLoopOutput, and run() end to end."""

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
    DictConfigWrap,
    _agent_loop_registry,
)

from rollwire.protocol import Rollout  # noqa: E402
from rollwire.testing import (  # noqa: E402
    failed_rollout,
    forked_rollout,
    merged_rollout,
    moe_rollout,
)
from rollwire.trajectory import TrajectoryBuilder  # noqa: E402
from rollwire_verl import agent_loop as al  # noqa: E402
from rollwire_verl.agent_loop import (  # noqa: E402
    RolloutFailedError,
    RollwireAgentLoop,
    rows_to_agent_loop_outputs,
    session_sampling,
)


def _outputs(rollout: Rollout, **kw: Any) -> list[AgentLoopOutput]:
    out = rows_to_agent_loop_outputs(rollout, TrajectoryBuilder().build(rollout), **kw)
    return out if isinstance(out, list) else [out]


def _valid(o: AgentLoopOutput) -> dict[str, Any]:
    """Round-trip through verl's own model and its v1 tensor form (AgentLoopOutput.as_dict)."""
    AgentLoopOutput.model_validate(o.model_dump())
    d = o.as_dict()
    assert d["prompts"].dtype == torch.int64 and d["responses"].shape == d["response_mask"].shape
    assert d["rollout_log_probs"].shape == d["responses"].shape
    return d


def test_registered_by_name() -> None:
    assert _agent_loop_registry["rollwire_agent"] == {
        "_target_": "rollwire_verl.agent_loop.RollwireAgentLoop"
    }


def test_single_row_output_matches_the_row() -> None:
    r = merged_rollout()
    (row,) = TrajectoryBuilder().build(r)
    out = rows_to_agent_loop_outputs(r, [row])
    assert isinstance(out, AgentLoopOutput)
    assert out.prompt_ids == row.prompt_ids.tolist()
    assert out.response_ids == row.response_ids.tolist()
    assert out.response_mask == row.loss_mask.tolist()
    np.testing.assert_allclose(out.response_logprobs, row.logprobs, rtol=1e-6)
    assert out.reward_score == 0.5 and out.num_turns == 3
    assert out.extra_fields["reward_extra_info"] == {"turns": 3.0}
    assert out.extra_fields["rollout_id"] == "r-merged"
    d = _valid(out)
    assert float(d["rm_scores"][-1]) == 0.5


def test_forked_rollout_returns_a_list_with_reward_extra_info_on_the_final() -> None:
    outs = _outputs(forked_rollout())
    assert len(outs) == 2
    assert all(o.reward_score == -0.5 for o in outs)
    assert "reward_extra_info" not in outs[0].extra_fields
    assert outs[-1].extra_fields["reward_extra_info"] == {"turns": 3.0}
    assert outs[1].extra_fields["fork"] == "other" and outs[1].extra_fields["row_index"] == 1
    for o in outs:
        _valid(o)
    (last,) = _outputs(forked_rollout(), multi_row="last")
    assert last.response_ids == outs[-1].response_ids
    assert "reward_extra_info" in last.extra_fields


def test_routed_experts_are_handed_over_as_int16() -> None:
    (o,) = _outputs(moe_rollout())
    assert isinstance(o.routed_experts, np.ndarray) and o.routed_experts.dtype == np.int16
    n = len(o.prompt_ids) + len(o.response_ids)
    assert o.routed_experts.shape == (n - 1, 2, 2)
    d = _valid(o)
    assert d["routed_experts"].shape == (n, 2, 2) and d["routed_experts"].dtype == torch.int16


def test_failed_rollout_policies() -> None:
    (o,) = _outputs(failed_rollout(), failure_reward=-1.0)
    assert o.reward_score == -1.0 and set(o.response_mask) == {0}
    assert set(o.response_logprobs or []) == {0.0}
    assert o.extra_fields["rollwire_status"] == "failed"
    _valid(o)
    with pytest.raises(RolloutFailedError, match="tool crashed"):
        _outputs(failed_rollout(), on_failure="raise")
    empty = failed_rollout()
    empty.calls = []
    (o,) = _outputs(empty, fallback_prompt_ids=[5, 6, 7])
    assert o.prompt_ids == [5, 6, 7] and o.response_ids == [] and o.reward_score == 0.0
    with pytest.raises(ValueError, match="on_failure"):
        _outputs(failed_rollout(), on_failure="ignore")  # type: ignore[arg-type]


def test_session_sampling_maps_verl_params() -> None:
    params = {
        "temperature": 0.7,
        "top_p": 1.0,
        "top_k": -1,
        "repetition_penalty": 1.0,
        "logprobs": True,
    }
    assert session_sampling(params) == {"temperature": 0.7, "top_p": 1.0}
    assert session_sampling({"top_k": 20, "repetition_penalty": 1.1})["top_k"] == 20


# -- run() ----------------------------------------------------------------------------------------


def _make_loop(**options: Any) -> RollwireAgentLoop:
    cfg = OmegaConf.create(
        {
            "actor_rollout_ref": {"rollout": {"prompt_length": 256, "response_length": 256}},
            "data": {},
        }
    )
    return RollwireAgentLoop(
        DictConfigWrap(cfg),
        None,
        None,
        None,
        None,
        DictConfigWrap(cfg.data),
        name="rollwire_agent",
        **options,
    )


VERL_ROW: dict[str, Any] = {
    "raw_prompt": np.array([{"role": "user", "content": "what is 6*7?"}], dtype=object),
    "uid": "task-uid-1",
    "index": np.int64(3),
    "agent_name": "rollwire_agent",
    "extra_info": {"answer": "42"},
}


class _StubGateway:
    """Stands in for AsyncGatewayClient: serves one prepared rollout."""

    def __init__(self, rollout: Rollout) -> None:
        self.rollout_obj = rollout
        self.created: dict[str, Any] = {}

    async def create_session(self, **fields: Any) -> Any:
        self.created = fields
        return types.SimpleNamespace(
            session_id=self.rollout_obj.rollout_id,
            token="tok",
            base_url="http://gw/s/tok/v1",
            complete_url="http://gw/api/sessions/x/complete",
        )

    async def wait(self, sid: str, timeout: float = 30.0) -> Any:
        return types.SimpleNamespace(status="completed")

    async def rollout(self, sid: str) -> Rollout:
        return self.rollout_obj

    async def complete(self, *a: Any, **kw: Any) -> None:
        return None


class _StubRunner:
    def __init__(self) -> None:
        self.payloads: list[dict[str, Any]] = []

    async def invoke(self, payload: dict[str, Any], session_id: str) -> None:
        self.payloads.append(payload)

    async def aclose(self) -> None:
        return None


async def test_run_with_a_stub_gateway(monkeypatch: pytest.MonkeyPatch) -> None:
    gw, runner = _StubGateway(forked_rollout()), _StubRunner()
    res = types.SimpleNamespace(client=lambda: gw, runner=runner)
    monkeypatch.setattr(al, "_resources", lambda settings: res)
    loop = _make_loop(gateway_url="http://gw", admin_key="k")
    out = await loop.run(
        {"temperature": 0.9, "top_p": 1.0, "top_k": -1, "logprobs": True},
        **VERL_ROW,
        session_id=2,
        global_steps=7,
    )
    assert isinstance(out, list) and len(out) == 2
    assert gw.created["group_id"] == "task-uid-1" and gw.created["task_id"] == "3"
    assert gw.created["sampling"] == {"temperature": 0.9, "top_p": 1.0}
    (payload,) = runner.payloads
    assert payload["raw_prompt"] == [{"role": "user", "content": "what is 6*7?"}]
    assert payload["index"] == 3 and payload["global_steps"] == 7
    assert "agent_name" not in payload and "session_id" not in payload
    assert gw.created["metadata"] == {"verl_sample": 2}
    assert payload["_rollwire"]["base_url"] == "http://gw/s/tok/v1"
    assert payload["_rollwire"]["group_id"] == "task-uid-1"


# -- end to end: embedded engine standing in for verl's vLLM server --------------------------------

SCRIPT = {
    "rules": [
        {"match": r"FORK", "reply": "Edited."},
        {"match": r".*", "reply": "The answer is 42."},
    ]
}


async def _agent(payload: dict[str, Any]) -> dict[str, Any]:
    from rollwire.context import async_openai_client

    client = async_openai_client(payload)
    messages = list(payload["raw_prompt"])
    r1 = await client.chat.completions.create(model="policy", messages=messages, max_tokens=16)
    messages += [
        {"role": "assistant", "content": r1.choices[0].message.content},
        {"role": "user", "content": "are you sure?"},
    ]
    await client.chat.completions.create(model="policy", messages=messages, max_tokens=16)
    if payload.get("extra_info", {}).get("fork"):
        # a sub-agent style call whose history does not extend the row: a fork
        await client.chat.completions.create(
            model="policy",
            messages=[{"role": "user", "content": "FORK: summarise"}],
            max_tokens=16,
        )
    if payload.get("extra_info", {}).get("crash"):
        raise RuntimeError("tool crashed")
    return {"reward": 1.0, "metrics": {"acc": 1.0}}


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[Any, Any]]:
    from rollwire.engine import EmbeddedEngine, EngineConfig
    from rollwire.gateway import serve_in_thread

    module = types.ModuleType("rollwire_verl_test_agent")
    module.agent = _agent  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    try:
        with (
            EmbeddedEngine(EngineConfig(scripted=SCRIPT)) as engine,
            serve_in_thread(backends=[(engine.url, "vllm")]) as gateway,
        ):
            yield engine, gateway
    finally:
        sys.modules.pop(module.__name__, None)


async def test_run_end_to_end_through_gateway_and_engine(stack: tuple[Any, Any]) -> None:
    _, gateway = stack
    loop = _make_loop(
        gateway_url=gateway.url,
        admin_key=gateway.admin_key,
        agent="rollwire_verl_test_agent:agent",
        runner="local",
    )
    try:
        out = await loop.run({"temperature": 1.0, "top_p": 1.0, "top_k": -1}, **VERL_ROW)
        assert isinstance(out, AgentLoopOutput)
        d = _valid(out)
        assert out.reward_score == 1.0 and out.num_turns == 2
        assert out.extra_fields["reward_extra_info"] == {"acc": 1.0}
        mask = np.array(out.response_mask)
        assert mask[0] == 1 and mask[-1] == 1 and 0 in mask  # sampled, user turn, sampled
        assert all(lp < 0 for lp, m in zip(out.response_logprobs or [], mask) if m)
        assert float(d["rm_scores"][-1]) == 1.0

        forked = await loop.run({"temperature": 1.0}, **{**VERL_ROW, "extra_info": {"fork": True}})
        assert isinstance(forked, list) and len(forked) == 2
        assert forked[-1].extra_fields["reward_extra_info"] == {"acc": 1.0}
        for o in forked:
            _valid(o)

        failed = await loop.run({"temperature": 1.0}, **{**VERL_ROW, "extra_info": {"crash": True}})
        assert isinstance(failed, AgentLoopOutput)
        assert failed.reward_score == 0.0 and set(failed.response_mask) == {0}
        assert failed.extra_fields["rollwire_status"] == "failed"
    finally:
        await al.aclose_resources()


async def test_run_with_in_process_gateway_over_verl_server_addresses(
    stack: tuple[Any, Any],
) -> None:
    engine, _ = stack
    address = engine.url.removeprefix("http://")  # verl reports servers as "ip:port"
    loop = _make_loop(backends=[address], agent="rollwire_verl_test_agent:agent")
    try:
        out = await loop.run({"temperature": 1.0}, **VERL_ROW)
        assert isinstance(out, AgentLoopOutput) and out.reward_score == 1.0
    finally:
        await al.aclose_resources()
