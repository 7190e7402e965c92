"""rollwire batches through the slime paths that broke on them (issue 14, items 1 and 2).

Each test encodes a behaviour observed in slime's own code, through the stand-ins of conftest.py:
the train-data conversion builds one routing tensor per sample as soon as ``data[0]`` has routing,
Megatron's batch builder pads each loss mask by ``prompt_len - 1``, the dynamic-sampling filter and
the partial-rollout abort loop read every element of a group as a ``Sample``, and the flattening
decides the nesting from ``data[0]``. The last test runs one MoE batch of a clean, a forked, a
failed and a no-call rollout end to end: engine with routing, gateway, agent, ``generate_rollout``.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import rollwire_slime
from rollwire.data.protocol import Group, Rollout
from rollwire.engine.server import EmbeddedEngine
from rollwire.testing import failed_rollout, forked_rollout, moe_rollout, single_turn_rollout
from rollwire.testing.mixed_batch import KINDS, MixedAgent, script
from rollwire.testing.samples import LAYERS, TOP_K
from rollwire_slime import generate_rollout, normalize_rewards
from rollwire_slime.hooks import _stop_gateways, apply_dynamic_filter


def _no_call(rid: str, group_id: str) -> Rollout:
    return Rollout(rollout_id=rid, group_id=group_id, status="failed", error="crashed at start")


def _r3_args(**kw: Any) -> SimpleNamespace:
    return SimpleNamespace(
        use_rollout_routing_replay=True,
        num_layers=LAYERS,
        moe_router_topk=TOP_K,
        reward_key=None,
        advantage_estimator="grpo",
        rewards_normalization=True,
        grpo_std_normalization=True,
        n_samples_per_prompt=None,
        **kw,
    )


@pytest.mark.parametrize("first", ["no_call", "routed"])
def test_moe_batch_with_a_no_call_rollout_keeps_routing_for_every_sample(
    slime_types: types.ModuleType, first: str
) -> None:
    rollouts = [_no_call("e", "g"), moe_rollout("m", "g")]
    if first == "routed":
        rollouts.reverse()
    nested = rollwire_slime.to_samples([Group(group_id="g", rollouts=rollouts)])
    samples = slime_types.flatten_like_slime(nested)
    data = slime_types.train_data(samples, _r3_args())  # routing check passes, nothing is None
    assert len(data["rollout_routed_experts"]) == 2  # not dropped for the batch
    for experts, s in zip(data["rollout_routed_experts"], samples):
        assert experts.dtype == np.int32
        assert experts.shape == (len(s.tokens) - 1, LAYERS, TOP_K)
    placeholder = next(s for s in samples if s.metadata["rollwire"]["placeholder"])
    assert placeholder.tokens == [0, 0] and placeholder.response_length == 1
    assert placeholder.loss_mask == [0] and placeholder.rollout_log_probs == [0.0]
    assert placeholder.remove_sample is True


def test_batch_without_routing_pads_the_placeholder_mask(slime_types: types.ModuleType) -> None:
    nested = rollwire_slime.to_samples([_no_call("e", "g"), single_turn_rollout("a", "g")])
    samples = slime_types.flatten_like_slime(nested)
    assert samples[0].rollout_routed_experts is None  # no routing anywhere: none invented
    data = slime_types.train_data(samples, SimpleNamespace())  # no negative pad length
    assert data["loss_masks"][0] == [0]


def _batch(forks: bool) -> list[Group]:
    g0 = [single_turn_rollout("a0", "g0", 1.0), single_turn_rollout("a1", "g0", 0.0)]
    if forks:
        g0.append(forked_rollout("a2", "g0", reward=0.5))
    g1 = [failed_rollout("b0", "g1"), moe_rollout("b1", "g1", reward=2.0), _no_call("b2", "g1")]
    return [Group(group_id="g0", rollouts=g0), Group(group_id="g1", rollouts=g1)]


@pytest.mark.parametrize("forks", [False, True])
def test_groups_pass_flattening_filter_and_abort(
    slime_types: types.ModuleType, forks: bool
) -> None:
    nested = rollwire_slime.to_samples(_batch(forks))
    slime_types.validate_rollout_id_annotated(nested)
    args = SimpleNamespace(reward_key=None)
    # the reward-std filter and the abort loop read each element of a group as a Sample
    kept = [g for g in nested if slime_types.reward_nonzero_std(args, g)]
    assert len(kept) == 2
    assert slime_types.collect_partial(nested, rollout_id=3) == sum(len(g) for g in nested)
    flat = slime_types.flatten_like_slime(nested)
    assert all(isinstance(s, slime_types.Sample) for s in flat)
    assert len(flat) == (7 if forks else 5)
    # a forked rollout's rows are consecutive and share rollout_id; rewards count it once
    forked = [s for s in flat if s.metadata["rollwire"]["rollout_id"] == "a2"]
    assert len(forked) == (2 if forks else 0)
    assert len({s.rollout_id for s in forked}) <= 1
    raw, adv = normalize_rewards(_r3_args(), flat)
    assert len(raw) == len(adv) == len(flat)
    if forks:
        a2 = [adv[i] for i, s in enumerate(flat) if s.metadata["rollwire"]["rollout_id"] == "a2"]
        # three rollouts 1.0, 0.0, 0.5: the forked one sits at the mean, counted once
        assert a2 == pytest.approx([0.0, 0.0], abs=1e-6)


def test_generate_rollout_applies_the_dynamic_filter(
    slime_types: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    nested = rollwire_slime.to_samples(_batch(True))
    same = rollwire_slime.to_samples(
        [single_turn_rollout("c0", "g2"), single_turn_rollout("c1", "g2")]
    )
    seen: list[int] = []

    def reward_std_filter(a: Any, group: list[Any]) -> bool:
        seen.append(len(group))
        return bool(slime_types.reward_nonzero_std(a, group))

    # slime's filter plumbing: load the function by path, call it, wrap a bool as a verdict
    base_types = types.ModuleType("slime.rollout.filter_hub.base_types")
    base_types.call_dynamic_filter = lambda fn, *a: SimpleNamespace(  # type: ignore[attr-defined]
        keep=fn(*a), reason="zero_std_1.0"
    )
    misc = types.ModuleType("slime.utils.misc")
    misc.load_function = lambda path: reward_std_filter  # type: ignore[attr-defined]
    for name in ("slime.rollout", "slime.rollout.filter_hub"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "slime.rollout.filter_hub.base_types", base_types)
    monkeypatch.setitem(sys.modules, "slime.utils.misc", misc)
    metrics: dict[str, Any] = {}
    args = SimpleNamespace(dynamic_sampling_filter_path="my.filters:std", reward_key=None)
    kept = apply_dynamic_filter(args, [*nested, *same], metrics)
    assert seen == [4, 3, 2]  # every flat group, forked rows included
    assert [len(g) for g in kept] == [4, 3]
    assert metrics == {"rollout/dynamic_filter/drop_zero_std_1.0": 1}


@pytest.fixture
def router() -> Iterator[EmbeddedEngine]:
    with EmbeddedEngine(scripted=script, return_routed_experts=True) as engine:
        yield engine
    _stop_gateways()


def test_end_to_end_mixed_moe_batch(router: EmbeddedEngine, slime_types: types.ModuleType) -> None:
    agent = MixedAgent()

    class DataSource:
        def get_samples(self, n: int) -> list[list[Any]]:
            return [
                [
                    SimpleNamespace(index=k, group_index=0, prompt="2+2?", label="4", metadata={})
                    for k in range(4)
                ]
            ]

    args = _r3_args(
        sglang_router_ip="127.0.0.1",
        sglang_router_port=router.port,
        rollwire_agent=agent,
        rollwire_deadline=60,
        rollout_batch_size=1,
        rollout_max_response_len=32,
    )
    args.n_samples_per_prompt = 4
    model = router.engine.model.config  # slime's --num-layers / --moe-router-topk
    args.num_layers, args.moe_router_topk = model.n_layers, model.top_k
    out = generate_rollout(args, 0, DataSource())
    data = out.samples if hasattr(out, "samples") else out
    assert sorted(agent.kinds) == sorted(KINDS)
    slime_types.validate_rollout_id_annotated(data)
    assert slime_types.collect_partial(data, rollout_id=0) == 5
    assert slime_types.reward_nonzero_std(args, data[0])
    samples = slime_types.flatten_like_slime(data)
    assert len(samples) == 5  # clean 1, forked 2, failed 1, placeholder 1
    train = slime_types.train_data(samples, args)
    assert len(train["rollout_routed_experts"]) == 5
    by_rollout: dict[int, list[Any]] = {}
    for s in samples:
        assert isinstance(s.rollout_routed_experts, np.ndarray)
        assert s.rollout_routed_experts.shape == (len(s.tokens) - 1, model.n_layers, model.top_k)
        assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length
        by_rollout.setdefault(s.rollout_id, []).append(s)
    kinds = {}
    for rows in by_rollout.values():
        meta = rows[0].metadata["rollwire"]
        if meta["placeholder"]:
            kinds["no_call"] = rows
        elif meta["rollout_status"] == "failed":
            kinds["failed"] = rows
        elif len(rows) == 2:
            kinds["forked"] = rows
        else:
            kinds["clean"] = rows
    assert set(kinds) == set(KINDS)
    assert any(kinds["clean"][0].loss_mask) and kinds["clean"][0].remove_sample is False
    assert kinds["forked"][1].metadata["rollwire"]["fork"] is not None
    assert all(any(s.loss_mask) for s in kinds["forked"])
    for kind in ("failed", "no_call"):
        (s,) = kinds[kind]
        assert s.remove_sample is True and not any(s.loss_mask)
    (ph,) = kinds["no_call"]
    assert ph.tokens == [0, 0] and ph.response_length == 1
    # captured routing, not a stand-in, on every sample that has tokens of its own
    assert not any(s.metadata["rollwire"]["routing_missing"] for s in samples)
    _, adv = normalize_rewards(args, samples)
    assert adv[samples.index(ph)] == 0.0
