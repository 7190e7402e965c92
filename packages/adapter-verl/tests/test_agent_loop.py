"""RollwireAgentLoop: pure conversion to verl's AgentLoopOutput, and run() end to end."""

from __future__ import annotations

import logging
import pathlib
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
    _agent_loop_registry,
)

from rollwire.data.protocol import Rollout  # noqa: E402
from rollwire.data.trajectory import TrajectoryBuilder  # noqa: E402
from rollwire.testing import (  # noqa: E402
    failed_rollout,
    forked_rollout,
    merged_rollout,
    moe_rollout,
    single_turn_rollout,
)
from rollwire.trainer.gateway_client import GatewayAPIError  # noqa: E402
from rollwire.trainer.step_stamp import StepStamp  # noqa: E402
from rollwire_verl import agent_loop as al  # noqa: E402
from rollwire_verl import resources  # noqa: E402
from rollwire_verl.agent_loop import (  # noqa: E402
    RolloutFailedError,
    RollwireAgentLoop,
    discover_server_addresses,
    rows_to_agent_loop_outputs,
    served_model_name,
    session_sampling,
)

MODEL_PATH = "/models/Qwen3-0.6B"


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
    # verl's count: prompt + 3 assistant turns + 2 tool/user turns between them
    assert out.reward_score == 0.5 and out.num_turns == 6
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
    assert outs[1].extra_fields["fork"] == "unknown" and outs[1].extra_fields["row_index"] == 1
    for o in outs:
        _valid(o)
    (last,) = _outputs(forked_rollout(), multi_row="last", reward_extra_keys=["turns"])
    assert last.response_ids == outs[-1].response_ids
    assert last.extra_fields["reward_extra_info"] == {"turns": 3.0, "turns_present": 1.0}


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
    (o,) = _outputs(empty, fallback_prompt_ids=[5, 6, 7], fallback_token_id=9)
    # one masked token: verl's v1 as_dict writes the reward at response index -1
    assert o.prompt_ids == [5, 6, 7] and o.response_ids == [9] and o.response_mask == [0]
    assert o.reward_score == 0.0
    d = _valid(o)
    assert d["rm_scores"].tolist() == [0.0]
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
    assert session_sampling(params, response_length=64)["max_tokens"] == 64
    assert session_sampling({"max_tokens": 8}, response_length=64)["max_tokens"] == 8


# -- run() ----------------------------------------------------------------------------------------


def _config(prompt_length: int = 256, response_length: int = 256, **rollout: Any) -> Any:
    return OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "prompt_length": prompt_length,
                    "response_length": response_length,
                    **rollout,
                },
                "model": {"path": MODEL_PATH, "use_shm": False},
            },
            "data": {},
        }
    )


def _make_loop(
    server_manager: Any = None, tokenizer: Any = None, cfg: Any = None, **options: Any
) -> RollwireAgentLoop:
    cfg = cfg if cfg is not None else _config()
    return RollwireAgentLoop(
        DictConfigWrap(cfg),
        server_manager,
        tokenizer,
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
        self.version: str | None = None
        self.seq: int | None = None

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

    # the control-plane routes a version stamp uses (recorded, as the gateway would answer)
    async def staleness(self) -> dict[str, Any]:
        return {"policy_seq": self.seq, "policy_version": self.version, "trainer_seq": self.seq}

    async def set_policy_version(self, version: str, *, seq: int | None = None) -> str:
        self.version, self.seq = version, seq
        return version

    async def set_trainer_version(self, seq: int | None, version: str | None = None) -> Any:
        return {}


class _StubRunner:
    def __init__(self) -> None:
        self.payloads: list[dict[str, Any]] = []

    async def invoke(self, payload: dict[str, Any], session_id: str) -> None:
        self.payloads.append(payload)

    async def aclose(self) -> None:
        return None


async def test_run_with_a_stub_gateway(monkeypatch: pytest.MonkeyPatch) -> None:
    gw, runner = _StubGateway(forked_rollout()), _StubRunner()
    res = types.SimpleNamespace(client=lambda: gw, runner=runner, stamp=StepStamp())
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
    assert gw.created["sampling"] == {"max_tokens": 256, "temperature": 0.9, "top_p": 1.0}
    assert gw.created["sampling_policy"] == {"max_tokens": "min"}
    (payload,) = runner.payloads
    assert payload["raw_prompt"] == [{"role": "user", "content": "what is 6*7?"}]
    assert payload["index"] == 3 and payload["global_steps"] == 7
    assert "agent_name" not in payload and "session_id" not in payload
    assert gw.created["metadata"] == {"verl_sample": 2}
    assert payload["_rollwire"]["base_url"] == "http://gw/s/tok/v1"
    assert payload["_rollwire"]["group_id"] == "task-uid-1"
    # step 7 rolls out on what verl pushed at the end of step 6, stamped before the session
    assert (gw.version, gw.seq) == ("6", 6)


# -- end to end: embedded engine standing in for verl's vLLM server --------------------------------

SCRIPT = {
    "rules": [
        {"match": r"FORK", "reply": "Edited."},
        {"match": r".*", "reply": "The answer is 42."},
    ]
}


async def _agent(payload: dict[str, Any]) -> dict[str, Any]:
    from rollwire.agent.context import async_openai_client

    client = async_openai_client(payload)
    messages = list(payload["raw_prompt"])
    model = payload["_rollwire"]["model"]
    assert model == MODEL_PATH, model  # the name verl's vLLM serves
    r1 = await client.chat.completions.create(model=model, messages=messages, max_tokens=16)
    messages += [
        {"role": "assistant", "content": r1.choices[0].message.content},
        {"role": "user", "content": "are you sure?"},
    ]
    await client.chat.completions.create(model=model, messages=messages, max_tokens=16)
    if payload.get("extra_info", {}).get("fork"):
        # a sub-agent style call whose history does not extend the row: a fork
        await client.chat.completions.create(
            model=model,
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
        assert out.reward_score == 1.0 and out.num_turns == 4  # prompt, 2 assistant, 1 user
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


# -- verl's own post-processing of the outputs (v1 TransferQueue worker and legacy worker) --------


def _tokenizer(pad_token_id: int = 0) -> Any:
    """A real transformers tokenizer (pads like verl's workers do); the vocabulary is irrelevant."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": pad_token_id, "a": pad_token_id + 1}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="<pad>")), pad_token="<pad>"
    )


@pytest.fixture
def v1_worker(tq_worker: tuple[Any, Any]) -> tuple[Any, Any]:
    """verl 0.9.1's ``AgentLoopWorkerTQ`` (``tq_worker``) with what these tests' rollouts read."""
    worker, fake = tq_worker
    worker.reward_loop_worker_handles = None
    worker.distillation_enabled = False
    worker.processor = None
    worker.tokenizer = _tokenizer()
    return worker, fake


def _legacy_worker(prompt_length: int, response_length: int) -> Any:
    worker = object.__new__(AgentLoopWorker)
    worker.reward_loop_worker_handles = None
    worker.distillation_enabled = False
    worker.processor = None
    worker.mm_processor_kwargs = {}
    worker.tokenizer = _tokenizer()
    worker.rollout_config = types.SimpleNamespace(
        prompt_length=prompt_length, response_length=response_length
    )
    return worker


async def _run_stub(
    monkeypatch: pytest.MonkeyPatch, rollout: Rollout, cfg: Any = None, **row: Any
) -> tuple[list[AgentLoopOutput], _StubGateway, _StubRunner]:
    gw, runner = _StubGateway(rollout), _StubRunner()
    res = types.SimpleNamespace(client=lambda: gw, runner=runner, stamp=StepStamp())
    monkeypatch.setattr(al, "_resources", lambda settings: res)
    loop = _make_loop(cfg=cfg, tokenizer=_tokenizer(), gateway_url="http://gw", admin_key="k")
    out = await loop.run({"temperature": 1.0}, **{**VERL_ROW, **row})
    return (out if isinstance(out, list) else [out]), gw, runner


async def test_run_classifies_forks_with_verls_tokenizer(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []

    class Recording(TrajectoryBuilder):
        def __init__(self, mode: Any = "merge", tokenizer: Any = None, credit: Any = None) -> None:
            seen.append(tokenizer)
            super().__init__(mode, tokenizer, credit)

    monkeypatch.setattr(al, "TrajectoryBuilder", Recording)
    tok = _tokenizer()
    gw, runner = _StubGateway(forked_rollout()), _StubRunner()
    res = types.SimpleNamespace(client=lambda: gw, runner=runner, stamp=StepStamp())
    monkeypatch.setattr(al, "_resources", lambda settings: res)
    loop = _make_loop(tokenizer=tok, gateway_url="http://gw", admin_key="k")
    await loop.run({"temperature": 1.0}, **VERL_ROW)
    assert seen == [tok]  # not None: fork kinds come from the backend's tokenizer


async def test_v1_worker_tags_convert_to_int_global_steps(
    monkeypatch: pytest.MonkeyPatch, v1_worker: tuple[Any, Any]
) -> None:
    """verl's v1 trainer: AgentLoopWorkerTQ copies extra_fields[min/max_global_steps] into the
    TransferQueue tags and _compute_metrics does np.array([...], dtype=int) on them."""
    worker, fake = v1_worker
    outs, _, _ = await _run_stub(monkeypatch, forked_rollout(), global_steps=7)
    kwargs = {**VERL_ROW, "session_id": 0, "global_steps": 7}
    await worker._agent_loop_postprocess(outs, False, **kwargs)
    (put,) = fake.puts
    tags = put["tags"]
    assert put["keys"] == ["task-uid-1_0_0", "task-uid-1_0_1"]
    assert put["fields"].batch_size[0] == 2  # verl's list_of_dict_to_tensordict took the fields
    # the same conversion as verl's PPOTrainer._compute_metrics (v1/trainer_base.py)
    lo = np.array([tag["min_global_steps"] for tag in tags], dtype=int)
    hi = np.array([tag["max_global_steps"] for tag in tags], dtype=int)
    # verl serves step k with the weights pushed at the end of step k-1 (version k-1)
    assert lo.tolist() == hi.tolist() == [6, 6]
    assert ((7 - 1) - hi).tolist() == [0, 0]  # trajectory_staleness: on-policy
    # a captured integer policy version wins over the step
    versioned = forked_rollout()
    for call in versioned.calls:
        call.policy_version = "5"
    (out, *_), _, _ = await _run_stub(monkeypatch, versioned, global_steps=7)
    assert out.extra_fields["min_global_steps"] == out.extra_fields["max_global_steps"] == 5


async def test_v1_worker_takes_a_failed_rollout_without_usable_calls(
    monkeypatch: pytest.MonkeyPatch, v1_worker: tuple[Any, Any]
) -> None:
    worker, fake = v1_worker
    empty = failed_rollout()
    empty.calls = []
    outs, _, _ = await _run_stub(monkeypatch, empty, global_steps=3)
    await worker._agent_loop_postprocess(outs, False, **VERL_ROW, session_id=1, global_steps=3)
    (put,) = fake.puts
    fields = put["fields"]
    assert int(fields["response_mask"].sum()) == 0
    assert np.array([t["max_global_steps"] for t in put["tags"]], dtype=int).tolist() == [2]


async def test_legacy_worker_pads_the_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """verl's legacy AgentLoopWorker: _agent_loop_postprocess pads each output to
    prompt_length/response_length, _postprocess stacks them into the DataProto it trains on."""
    cfg = _config(prompt_length=16, response_length=12)
    worker = _legacy_worker(16, 12)
    rows = [merged_rollout(), single_turn_rollout()]
    internals = []
    for rollout in rows:
        outs, _, _ = await _run_stub(monkeypatch, rollout, cfg=cfg, global_steps=2)
        (last,) = outs
        internals.append(await worker._agent_loop_postprocess(last, False, **VERL_ROW))
    data = worker._postprocess(internals, input_non_tensor_batch=None)
    data.check_consistency()
    b = data.batch
    assert b["prompts"].shape == (2, 16) and b["responses"].shape == (2, 12)
    # merged_rollout: 17 response tokens cut to the first 12, mask and log-probs with them
    (row,) = TrajectoryBuilder().build(merged_rollout())
    assert b["responses"][0].tolist() == row.response_ids[:12].tolist()
    assert b["response_mask"][0].tolist() == row.loss_mask[:12].tolist()
    np.testing.assert_allclose(b["rollout_log_probs"][0].numpy(), row.logprobs[:12], rtol=1e-6)
    assert b["rm_scores"][0].tolist() == [0.0] * 11 + [0.5]
    assert b["rm_scores"][1].tolist() == [0.0] * 4 + [1.0] + [0.0] * 7
    assert list(data.non_tensor_batch["__num_turns__"]) == [6, 2]
    assert list(data.non_tensor_batch["max_global_steps"]) == [1, 1]
    assert data.meta_info["reward_extra_keys"] == ["turns"]
    # the MoE rollout's routing lands at verl's column: P - len(prompt) + j
    moe_worker = _legacy_worker(16, 12)
    (moe,), _, _ = await _run_stub(monkeypatch, moe_rollout(), cfg=cfg, global_steps=2)
    internal = await moe_worker._agent_loop_postprocess(moe, False, **VERL_ROW)
    (moe_row,) = TrajectoryBuilder().build(moe_rollout())
    assert moe_row.routed_experts is not None
    placed = internal.routed_experts[0]
    assert placed.shape == (28, 2, 2)
    np.testing.assert_array_equal(placed[10 : 10 + 14].numpy(), moe_row.routed_experts)


async def test_outputs_are_cut_to_the_rollout_lengths(monkeypatch: pytest.MonkeyPatch) -> None:
    """Like verl's loops: the first response_length response tokens (mask, log-probs, routing
    cut with them), the last prompt_length prompt tokens; max_tokens defaults to response_length."""
    cfg = _config(prompt_length=4, response_length=5)
    (out,), gw, _ = await _run_stub(monkeypatch, moe_rollout(), cfg=cfg, global_steps=1)
    (row,) = TrajectoryBuilder().build(moe_rollout())
    assert row.prompt_len == 6 and len(row.response_ids) == 9
    assert out.prompt_ids == row.prompt_ids[-4:].tolist()
    assert out.response_ids == row.response_ids[:5].tolist()
    assert out.response_mask == row.loss_mask[:5].tolist()
    np.testing.assert_allclose(out.response_logprobs or [], row.logprobs[:5], rtol=1e-6)
    assert row.routed_experts is not None
    np.testing.assert_array_equal(out.routed_experts, row.routed_experts[2 : 6 + 5])
    assert out.extra_fields["rollwire_truncated"] is True
    assert gw.created["sampling"]["max_tokens"] == 5
    d = _valid(out)
    assert d["routed_experts"].shape == (9, 2, 2)


def test_model_defaults_to_what_verls_server_serves() -> None:
    assert _make_loop(gateway_url="http://gw", admin_key="k").model == MODEL_PATH
    assert served_model_name(_config()) == MODEL_PATH
    named = _config(prometheus={"enable": True, "served_model_name": "org/tiny-model"})
    assert served_model_name(named) == "tiny-model"  # verl keeps the part after the last /
    assert _make_loop(gateway_url="http://gw", admin_key="k", model="mine").model == "mine"
    no_path = OmegaConf.create({"actor_rollout_ref": {"rollout": {}}, "data": {}})
    with pytest.raises(ValueError, match=r"model\.path"):
        served_model_name(no_path)


async def test_run_tells_the_agent_the_served_model(monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, runner = await _run_stub(monkeypatch, merged_rollout(), global_steps=1)
    (payload,) = runner.payloads
    assert payload["_rollwire"]["model"] == MODEL_PATH


class _Remote:
    """``actor.method.remote(...)`` of a Ray actor handle, answered with an awaitable."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def remote(self, *a: Any, **kw: Any) -> Any:
        async def answer() -> Any:
            return self.value

        return answer()


async def test_discover_server_addresses_from_verls_objects() -> None:
    # verl 0.9.1 hands the loop an LLMServerClient: the router actor lists the servers
    client = types.SimpleNamespace(
        _load_balancer=types.SimpleNamespace(get_all_servers=_Remote(["10.0.0.2:8000"]))
    )
    assert await discover_server_addresses(client) == ("http://10.0.0.2:8000",)
    manager = types.SimpleNamespace(server_addresses=["10.0.0.3:9000", "10.0.0.1:9000"])
    assert await discover_server_addresses(manager) == (
        "http://10.0.0.1:9000",
        "http://10.0.0.3:9000",
    )
    with pytest.raises(ValueError, match="gateway_url"):
        await discover_server_addresses(None)


async def test_complete_quietly_swallows_only_a_conflict() -> None:
    class Gw:
        def __init__(self, status: int) -> None:
            self.status = status

        async def complete(self, *a: Any, **kw: Any) -> None:
            raise GatewayAPIError(self.status, "nope")

    await al._complete_quietly(Gw(409), "s", "failed", "x")
    with pytest.raises(GatewayAPIError):
        await al._complete_quietly(Gw(500), "s", "failed", "x")


async def test_fallback_prompt_is_lazy_and_a_template_error_is_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    class Tok:
        pad_token_id = 3
        calls = 0

        def apply_chat_template(self, *a: Any, **kw: Any) -> list[int]:
            Tok.calls += 1
            raise ValueError("no chat template")

    gw, runner = _StubGateway(merged_rollout()), _StubRunner()
    res = types.SimpleNamespace(client=lambda: gw, runner=runner, stamp=StepStamp())
    monkeypatch.setattr(al, "_resources", lambda settings: res)
    loop = _make_loop(tokenizer=Tok(), gateway_url="http://gw", admin_key="k")
    await loop.run({"temperature": 1.0}, **VERL_ROW, global_steps=1)
    assert Tok.calls == 0  # a rollout with rows needs no fallback prompt
    empty = failed_rollout()
    empty.calls = []
    gw.rollout_obj = empty
    with caplog.at_level(logging.WARNING, logger="rollwire_verl.agent_loop"):
        out = await loop.run({"temperature": 1.0}, **VERL_ROW, global_steps=1)
    assert Tok.calls == 1 and "no chat template" in caplog.text
    assert isinstance(out, AgentLoopOutput)
    assert out.prompt_ids == [3] and out.response_ids == [3] and out.response_mask == [0]


async def test_run_discovers_verls_servers_when_no_gateway_is_configured(
    stack: tuple[Any, Any],
) -> None:
    """No gateway_url, no backends: an in-process gateway over the addresses of the server
    manager verl hands the loop (here a stand-in shaped like verl's, over the embedded engine)."""
    engine, _ = stack
    address = engine.url.removeprefix("http://")  # verl reports servers as "ip:port"
    client = types.SimpleNamespace(
        _load_balancer=types.SimpleNamespace(get_all_servers=_Remote([address]))
    )
    loop = _make_loop(server_manager=client, agent="rollwire_verl_test_agent:agent")
    try:
        out = await loop.run({"temperature": 1.0}, **VERL_ROW, global_steps=4)
        assert isinstance(out, AgentLoopOutput) and out.reward_score == 1.0
        assert out.extra_fields["max_global_steps"] is not None
        (res,) = resources._RESOURCES.values()
        assert res.settings.backends == (engine.url,)
    finally:
        await al.aclose_resources()


def test_shipped_yaml_instantiates_the_loop_like_verl(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    """As verl's AgentLoopWorker does: OmegaConf.load the agent_loop_config_path into the
    registry, then hydra.utils.instantiate the entry with the worker's keyword arguments."""
    import hydra
    from verl.experimental.agent_loop.agent_loop import ToolListWrap

    import rollwire_verl

    def load(path: str) -> Any:
        for entry in OmegaConf.load(path):  # AgentLoopWorker.__init__
            monkeypatch.setitem(_agent_loop_registry, entry.name, entry)
        cfg = _config()
        return hydra.utils.instantiate(  # AgentLoopWorker._run_agent_loop
            config=_agent_loop_registry["rollwire_agent"],
            trainer_config=DictConfigWrap(config=cfg),
            server_manager=None,
            tokenizer=None,
            processor=None,
            hf_model_type=None,
            dataset_cls=None,
            data_config=DictConfigWrap(cfg.data),
            tools=ToolListWrap([]),
        )

    loop = load(rollwire_verl.AGENT_LOOP_CONFIG_PATH)
    assert type(loop) is RollwireAgentLoop
    assert loop.settings.runner == "local" and loop.model == MODEL_PATH
    # a copy with rollwire keys: verl passes them to the constructor
    custom = tmp_path / "agent_loop.yaml"
    custom.write_text(
        pathlib.Path(rollwire_verl.AGENT_LOOP_CONFIG_PATH).read_text()
        + "  gateway_url: http://gw:8000\n  admin_key: k\n  multi_row: last\n"
        + "  model: served\n  backends: ['10.0.0.1:8000']\n  reward_extra_keys: [acc]\n"
    )
    loop = load(str(custom))
    assert loop.settings.reward_extra_keys == ("acc",)
    assert loop.settings.gateway_url == "http://gw:8000" and loop.settings.multi_row == "last"
    assert loop.model == "served" and loop.settings.backends == ("http://10.0.0.1:8000",)


def test_session_options_from_yaml_are_hashable_and_json_able() -> None:
    opts = OmegaConf.create({"sampling_policy": {"temperature": "agent"}, "max_calls": 8})
    s = al.LoopSettings.from_options({"session_options": opts})
    hash(s)
    assert al._thaw(s.session_options) == {
        "max_calls": 8,
        "sampling_policy": {"temperature": "agent"},
    }


async def test_rollouts_are_logged_per_global_step_to_the_metrics_sink(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    """One loop per sample, as verl makes them; the samples of a step share one logged step."""
    from rollwire.metrics_sinks.step_logger import close_shared_loggers
    from rollwire.testing.tensorboard import read_scalars

    versioned = merged_rollout("a", reward=1.0)
    for call in versioned.calls:
        call.policy_version = "4"
    batches = [
        (5, versioned),
        (5, forked_rollout("b", reward=-0.5)),
        (6, merged_rollout("c", group_id="g2", reward=0.5)),
        (6, failed_rollout("d")),
    ]
    spec = f"tensorboard:{tmp_path / 'tb'}"
    for step, rollout in batches:
        gw = _StubGateway(rollout)
        res = types.SimpleNamespace(
            client=lambda gw=gw: gw, runner=_StubRunner(), stamp=StepStamp()
        )
        monkeypatch.setattr(al, "_resources", lambda settings, res=res: res)
        loop = _make_loop(gateway_url="http://gw", admin_key="k", metrics=spec)
        await loop.run({"temperature": 1.0}, **VERL_ROW, global_steps=step)
    assert not (tmp_path / "tb").exists() or 6 not in read_scalars(tmp_path / "tb")
    close_shared_loggers()  # at exit: the last step
    steps = read_scalars(tmp_path / "tb")
    assert sorted(steps) == [5, 6]
    five, six = steps[5], steps[6]
    assert five["rollwire/rollouts/total"] == 2 and six["rollwire/rollouts/total"] == 2
    assert five["rollwire/reward/mean"] == pytest.approx(0.25)  # (1.0 - 0.5) / 2
    assert five["rollwire/reward/std"] == pytest.approx(0.75)
    assert five["rollwire/forks/total"] == 1 and five["rollwire/rows/per_rollout"] == 1.5
    assert five["rollwire/policy/version"] == 4.0 and "rollwire/policy/version" not in six
    assert five["rollwire/calls/total"] == 6 and six["rollwire/calls/total"] == 4
    assert six["rollwire/failures/failed"] == 1 and "rollwire/failures/failed" not in five
    assert six["rollwire/reward/mean"] == pytest.approx(0.5)  # the failed one has no reward
    assert (tmp_path / "tb" / "tags.json").read_text().count('"4"') == 1


def test_metrics_settings_from_yaml_or_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLWIRE_METRICS", "mlflow:mlruns")
    monkeypatch.setenv("ROLLWIRE_METRICS_EVERY", "16")
    env = al.LoopSettings.from_options({})
    assert (env.metrics, env.metrics_every) == ("mlflow:mlruns", 16)
    yaml = al.LoopSettings.from_options({"metrics": "tensorboard:tb", "metrics_every": 8})
    assert (yaml.metrics, yaml.metrics_every) == ("tensorboard:tb", 8)
    monkeypatch.setenv("ROLLWIRE_METRICS_EVERY", "0")
    with pytest.raises(ValueError, match="ROLLWIRE_METRICS_EVERY must be a positive integer"):
        al.LoopSettings.from_options({})
