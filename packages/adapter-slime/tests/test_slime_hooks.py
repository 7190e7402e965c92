"""slime hooks end to end: embedded engine (scripted, MoE) as slime's SGLang router, a real gateway,
a real RolloutApp agent. slime itself is not installable here, so ``slime.utils.types`` is the
stand-in of ``conftest.py``, written from slime's ``Sample`` field list: ``from_dict`` builds a
dataclass with the ``Status`` enum and checks response lengths as slime does.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import rollwire_slime
from rollwire.agent.context import async_openai_client
from rollwire.engine.server import EmbeddedEngine
from rollwire_slime import HookConfig, generate, generate_rollout, normalize_rewards
from rollwire_slime.hooks import _stop_gateways, slime_sampling, slime_task


def _script(messages: list[dict[str, Any]], tools: Any) -> str:
    last = messages[-1]["content"] if messages else ""
    return "The answer is 4." if str(last).startswith("tool:") else "Let me compute."


async def agent(payload: dict[str, Any]) -> dict[str, Any]:
    """Two turns; the second prompt extends the first, so one merged row."""
    client = async_openai_client(payload)
    msgs: list[Any] = [{"role": "user", "content": payload["prompt"]}]
    r = await client.chat.completions.create(model="policy", messages=msgs)
    msgs += [{"role": "assistant", "content": r.choices[0].message.content}]
    msgs += [{"role": "user", "content": "tool: 4"}]
    r = await client.chat.completions.create(model="policy", messages=msgs)
    ok = "4" in (r.choices[0].message.content or "")
    return {"reward": 1.0 if ok else 0.0, "metrics": {"turns": 2.0}}


async def forking_agent(payload: dict[str, Any]) -> float:
    """The second call rewrites the history (a summarised context): two rows, one rollout."""
    client = async_openai_client(payload)
    first: list[Any] = [{"role": "user", "content": payload["prompt"]}]
    await client.chat.completions.create(model="policy", messages=first)
    summary: list[Any] = [
        {"role": "system", "content": "summary: asked 2+2"},
        {"role": "user", "content": "tool: 4"},
    ]
    await client.chat.completions.create(model="policy", messages=summary)
    return 0.5


@pytest.fixture
def router() -> Iterator[EmbeddedEngine]:
    """The embedded engine in slime's router seat (it speaks SGLang's ``/generate``)."""
    with EmbeddedEngine(scripted=_script, return_routed_experts=True) as engine:
        yield engine
    _stop_gateways()


@pytest.fixture
def slime_stub(slime_types: types.ModuleType) -> None:
    """slime's ``Sample`` stand-in installed (see conftest.py)."""


def _args(router: EmbeddedEngine, handler: Any, **kw: Any) -> SimpleNamespace:
    return SimpleNamespace(
        sglang_router_ip="127.0.0.1",
        sglang_router_port=router.port,
        rollwire_agent=handler,
        rollwire_deadline=60,
        rollout_batch_size=2,
        n_samples_per_prompt=2,
        rollout_temperature=1.0,
        rollout_top_p=1.0,
        rollout_top_k=-1,
        rollout_max_response_len=32,
        rollout_stop=None,
        rollout_stop_token_ids=None,
        advantage_estimator="grpo",
        rewards_normalization=True,
        grpo_std_normalization=True,
        reward_key=None,
        **kw,
    )


def _sample(index: int, group_index: int) -> SimpleNamespace:
    return SimpleNamespace(
        index=index,
        group_index=group_index,
        prompt="2+2?",
        label="4",
        metadata={"source": "unit"},
        multimodal_inputs=None,
        multimodal_train_inputs=None,
        generate_function_path=None,
        train_metadata=None,
    )


def _check_row(s: Any) -> None:
    n = s.response_length
    assert len(s.loss_mask) == len(s.rollout_log_probs) == n > 0
    assert all(lp == 0.0 for lp, m in zip(s.rollout_log_probs, s.loss_mask) if m == 0)
    experts = s.rollout_routed_experts  # an int32 ndarray, as slime's own SGLang path keeps it
    assert isinstance(experts, np.ndarray) and experts.dtype == np.int32
    assert experts.ndim == 3 and experts.shape[0] == len(s.tokens) - 1


async def test_generate_one_sample(router: EmbeddedEngine, slime_stub: None) -> None:
    args = _args(router, agent)
    sampling = {"temperature": 1.0, "top_k": -1, "max_new_tokens": 32, "stop": None}
    rows = await generate(args, _sample(7, 3), sampling)
    assert isinstance(rows, list) and len(rows) == 1
    (s,) = rows
    _check_row(s)
    assert (s.index, s.group_index, s.rollout_id) == (7, 3, 7)
    assert s.reward == 1.0 and s.status.value == "completed"
    assert s.prompt == "2+2?" and s.label == "4"
    assert s.metadata["source"] == "unit"
    assert len(s.metadata["rollwire"]["call_ids"]) == 2  # two calls merged into one row
    assert s.metadata["rollwire"]["metrics"] == {"turns": 2.0}
    assert sum(s.loss_mask) < s.response_length  # the user turn between is masked out


async def test_generate_forked_rollout_rows_share_rollout_id(
    router: EmbeddedEngine, slime_stub: None
) -> None:
    rows = await generate(_args(router, forking_agent), _sample(11, 0), {"max_new_tokens": 16})
    assert len(rows) == 2
    for s in rows:
        _check_row(s)
    assert {s.rollout_id for s in rows} == {11}
    assert rows[1].metadata["rollwire"]["fork"] is not None
    assert [s.reward for s in rows] == [0.5, 0.5]
    _, adv = normalize_rewards(_args(router, agent), rows)
    assert adv == [0.0, 0.0]  # one rollout in its group: counted once, no spread


@pytest.mark.parametrize(
    "flag", [{"dynamic_sampling_filter_path": "x.y"}, {"partial_rollout": True}]
)
async def test_generate_refuses_paths_that_read_groups_as_samples(
    router: EmbeddedEngine, slime_stub: None, flag: dict[str, Any]
) -> None:
    with pytest.raises(ValueError, match=r"rollwire_slime\.generate_rollout"):
        await generate(_args(router, agent, **flag), _sample(1, 0), {})


async def test_generate_in_evaluation_ignores_the_filter(
    router: EmbeddedEngine, slime_stub: None
) -> None:
    args = _args(router, agent, dynamic_sampling_filter_path="x.y")
    (s,) = await generate(args, _sample(1, 0), {}, evaluation=True)
    assert s.rollout_id == 1


def test_generate_rollout_whole_batch(router: EmbeddedEngine, slime_stub: None) -> None:
    class DataSource:
        def __init__(self) -> None:
            self.asked: list[int] = []

        def get_samples(self, n: int) -> list[list[SimpleNamespace]]:
            self.asked.append(n)
            return [[_sample(2 * g + k, g) for k in range(2)] for g in range(n)]

    source = DataSource()
    out = generate_rollout(_args(router, agent), 0, source)
    assert source.asked == [2]
    samples = out.samples if hasattr(out, "samples") else out
    assert len(samples) == 2 and all(len(g) == 2 for g in samples)
    for g, group in enumerate(samples):
        for k, s in enumerate(group):  # flat groups: Samples, not lists
            _check_row(s)
            assert (s.group_index, s.index, s.rollout_id) == (g, 2 * g + k, 2 * g + k)
            assert s.reward == 1.0


def test_hook_config_from_env_and_args() -> None:
    env = {
        "ROLLWIRE_AGENT": "pkg.mod:app",
        "ROLLWIRE_RUNNER": "http:http://agent:8080",
        "ROLLWIRE_CAPTURE": "passthrough",
        "ROLLWIRE_DEADLINE": "30",
        "ROLLWIRE_GATEWAY_OPTIONS": '{"pool_size": 8}',
    }
    args = SimpleNamespace(
        sglang_router_ip="10.0.0.1", sglang_router_port=3000, rollwire_deadline=5
    )
    cfg = HookConfig.from_args(args, env)
    assert cfg.agent == "pkg.mod:app" and cfg.runner == "http:http://agent:8080"
    assert cfg.capture == "passthrough" and cfg.deadline == 5.0  # args win over the environment
    assert cfg.gateway_options == {"pool_size": 8}
    assert cfg.router_url == "http://10.0.0.1:3000"
    with pytest.raises(ValueError, match="capture"):
        HookConfig.from_args(SimpleNamespace(), {"ROLLWIRE_CAPTURE": "bytes"})


def test_sampling_and_task_mapping() -> None:
    got = slime_sampling(
        {
            "temperature": 0.7,
            "top_k": -1,
            "max_new_tokens": 64,
            "stop": [],
            "no_stop_trim": True,
            "sampling_seed": 3,
        }
    )
    assert got == {"temperature": 0.7, "max_tokens": 64, "seed": 3}
    task = slime_task(_sample(5, 1))
    assert task["prompt"] == "2+2?" and task["answer"] == "4" and task["source"] == "unit"
    assert task["slime_index"] == 5


def test_hooks_need_an_agent(router: EmbeddedEngine, slime_stub: None) -> None:
    args = _args(router, None)
    with pytest.raises(ValueError, match="ROLLWIRE_AGENT"):
        rollwire_slime.hooks._runner(HookConfig.from_args(args, {}))


async def graded_agent(payload: dict[str, Any]) -> dict[str, Any]:
    """One call; reward 0.25 for slime group 0 and 0.75 for group 1, solved in group 1 only."""
    client = async_openai_client(payload)
    msgs: list[Any] = [{"role": "user", "content": payload["prompt"]}]
    await client.chat.completions.create(model="policy", messages=msgs)
    g = int(payload["slime_group_index"])
    return {"reward": 0.25 + 0.5 * g, "metrics": {"solved": float(g)}}


def test_generate_rollout_logs_each_step_to_the_metrics_sink(
    router: EmbeddedEngine, slime_stub: None, tmp_path: Any
) -> None:
    from rollwire.metrics_sinks.step_logger import close_shared_loggers
    from rollwire.testing.tensorboard import read_scalars

    class DataSource:
        def get_samples(self, n: int) -> list[list[SimpleNamespace]]:
            return [[_sample(2 * g + k, g) for k in range(2)] for g in range(n)]

    args = _args(router, graded_agent, rollwire_metrics=f"tensorboard:{tmp_path / 'tb'}")
    for rollout_id in (3, 4):  # slime's rollout step numbers are the sink's steps
        generate_rollout(args, rollout_id, DataSource())
    close_shared_loggers()
    steps = read_scalars(tmp_path / "tb")
    assert sorted(steps) == [3, 4]
    for m in steps.values():
        assert m["rollwire/rollouts/total"] == 4 and m["rollwire/rollouts/groups"] == 2
        assert m["rollwire/reward/mean"] == pytest.approx(0.5)  # (0.25 * 2 + 0.75 * 2) / 4
        assert m["rollwire/reward/std"] == pytest.approx(0.25)
        assert m["rollwire/solve_rate"] == pytest.approx(0.5)
        assert m["rollwire/turns/mean"] == 1.0 and m["rollwire/calls/total"] == 4
        assert m["rollwire/calls/failed"] == 0 and m["rollwire/forks/total"] == 0
        assert m["rollwire/tokens/response"] > 0 and m["rollwire/calls/per_s"] > 0


def test_hook_config_metrics_from_env_or_args() -> None:
    assert HookConfig.from_args(SimpleNamespace(), {}).metrics is None
    env = {"ROLLWIRE_METRICS": "mlflow:mlruns"}
    assert HookConfig.from_args(SimpleNamespace(), env).metrics == "mlflow:mlruns"
    args = SimpleNamespace(rollwire_metrics="tensorboard:tb")
    assert HookConfig.from_args(args, env).metrics == "tensorboard:tb"
