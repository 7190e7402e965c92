"""rollwire against what rLLM's real code did with a fixed batch (``tests/data/rllm_contract.json``).

``ci/record_contract.py`` ran rLLM (the commit in the file) on the batch stored in the file:
``Episode.to_dict`` of ``rollwire_rllm.to_episodes``'s Episodes, ``transform_episodes_to_trajectory_groups``
and ``transform_trajectory_groups_to_datums`` (GRPO advantages, Tinker datums), its verl backend's
and its Tinker path's reading of ``Step.routing_matrices``, its Episodes of further rollouts, and
the fields of its ``AgentConfig`` / ``Task``. These tests need no rLLM: they check that rollwire
still hands rLLM exactly those Episodes, and that what rLLM made of them is what rollwire's docs
promise (its rows, its advantages, its routing).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rollwire_rllm
from rollwire.data.protocol import Group, Rollout
from rollwire.data.trajectory import build_rows
from rollwire.testing import moe_rollout
from rollwire_rllm import decode_routing_matrix, decode_verl_routing, episode_rows, to_episode_dicts
from rollwire_rllm.routing import routing_matrices

from .conftest import AgentConfig, Task

DATA = json.loads((Path(__file__).parent / "data" / "rllm_contract.json").read_text())
#: fields rLLM's ``Episode.to_dict`` writes that rollwire's dict form leaves out, at rLLM's default
RLLM_ONLY = {"session_id": None}


def _batch() -> list[Group]:
    return [
        Group(
            group_id=g["group_id"],
            task_id=g["task_id"],
            rollouts=[Rollout.from_json(json.dumps(r)) for r in g["rollouts"]],
        )
        for g in DATA["batch"]
    ]


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=lambda o: o.tolist()))


def test_recorded_with_a_known_rllm() -> None:
    assert DATA["rllm_commit"], "record_contract.py names the rLLM commit it ran"
    assert set(DATA["cases"]) == {"grpo", "grpo_no_std"}


def test_rollwire_gives_rllm_exactly_the_recorded_episodes() -> None:
    ours = _plain(to_episode_dicts(_batch()))
    recorded = DATA["episodes"]
    assert len(ours) == len(recorded)
    for mine, theirs in zip(ours, recorded):
        extra = {k: theirs[k] for k in set(theirs) - set(mine)}
        assert extra == RLLM_ONLY, f"{theirs['id']}: rLLM's Episode has new fields {extra}"
        assert mine == {k: v for k, v in theirs.items() if k not in RLLM_ONLY}


def test_rllm_groups_by_task_id_and_drops_failed_rollouts() -> None:
    by_id = {e["id"]: e for e in DATA["episodes"]}
    assert DATA["episode_task_ids"] == [e["id"].split(":")[0] for e in DATA["episodes"]]
    for case in DATA["cases"].values():
        kept = [eid for g in case["groups"] for eid in g["episodes"]]
        with_trajectories = [e["id"] for e in DATA["episodes"] if e["trajectories"]]
        # a failed rollout is an Episode without trajectories: rLLM leaves it out of its group
        assert sorted(kept) == sorted(with_trajectories)
        assert any(not e["trajectories"] for e in DATA["episodes"])
        for g in case["groups"]:
            assert g["group_id"] == f"{g['episodes'][0].split(':')[0]}:agent"
            assert g["rewards"] == [by_id[e]["trajectories"][0]["reward"] for e in g["episodes"]]


@pytest.mark.parametrize("case", ["grpo", "grpo_no_std"])
def test_rllm_grpo_advantages_are_the_documented_ones(case: str) -> None:
    """rLLM's GRPO: (reward - group mean) / (population std + 1e-6), or without the std; one
    advantage for every step of a trajectory (broadcast)."""
    data = DATA["cases"][case]
    for g in data["groups"]:
        rewards = np.asarray(g["rewards"], dtype=np.float64)
        expected = rewards - rewards.mean()
        if data["norm_adv_by_std_in_grpo"]:
            expected = expected / (rewards.std() + 1e-6)
        for steps, want in zip(g["advantages"], expected):
            assert steps == pytest.approx([want] * len(steps), abs=1e-9)


@pytest.mark.parametrize("case", ["grpo", "grpo_no_std"])
def test_rllm_datums_are_rollwires_rows(case: str) -> None:
    """rLLM's prefix merging makes exactly rollwire's rows, and each datum is the row shifted by
    one: targets, the captured log-probs and the advantage where the policy sampled, 0 elsewhere."""
    data = DATA["cases"][case]
    advantage = {
        eid: steps[0] for g in data["groups"] for eid, steps in zip(g["episodes"], g["advantages"])
    }
    episodes = {e["id"]: e for e in DATA["episodes"]}
    rows = [
        (eid, row)
        for g in data["groups"]
        for eid in g["episodes"]
        for row in episode_rows(episodes[eid])
    ]
    assert len(rows) == len(data["datums"])
    for (eid, row), datum in zip(rows, data["datums"]):
        tokens = np.concatenate([row.prompt_ids, row.response_ids]).astype(np.int64)
        mask = np.concatenate([np.zeros(len(row.prompt_ids)), row.loss_mask]).astype(np.float64)
        logprobs = np.concatenate([np.zeros(len(row.prompt_ids)), row.logprobs * row.loss_mask])
        assert datum["model_input"] == tokens[:-1].tolist()
        assert datum["target_tokens"] == tokens[1:].astype(float).tolist()
        assert datum["mask"] == mask[1:].tolist()
        assert datum["logprobs"] == pytest.approx(logprobs[1:].tolist(), abs=1e-6)
        assert datum["advantages"] == pytest.approx((mask[1:] * advantage[eid]).tolist())


# -- rLLM's own types: what ``to_episodes`` built, and options outside the sample batch ----------


def _summary(arr: Any) -> dict[str, Any]:
    """``record_contract._array``: shape, dtype, sha256 of the C-order bytes, first values."""
    arr = np.ascontiguousarray(arr)
    return {
        "shape": list(arr.shape),
        "dtype": str(arr.dtype),
        "sha256": hashlib.sha256(arr.tobytes()).hexdigest(),
        "head": arr.reshape(-1)[:8].tolist(),
    }


def _without_rllm_only(episode: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in episode.items() if k not in RLLM_ONLY}


def test_to_episodes_builds_rllms_types_and_flattens_back() -> None:
    assert {"rllm.types.Episode", "TerminationReason", "ModelOutput"} <= set(DATA["episode_types"])
    # rLLM's objects, flattened by the adapter, gave the rows the dict form gives
    ours = rollwire_rllm.adapter.flatten(to_episode_dicts(_batch()))
    assert [r.rollout_id for r in ours] == DATA["flat_rollout_ids"]


@pytest.mark.parametrize("name", ["versions_and_credit", "numeric_weight_version"])
def test_rllm_episodes_of_further_options_are_rollwires(name: str) -> None:
    case = DATA["extra_episodes"][name]
    rollouts = [Rollout.from_json(json.dumps(r)) for r in case["rollouts"]]
    ours = _plain(to_episode_dicts(rollouts, **case["options"]))
    assert ours == [_without_rllm_only(e) for e in case["episodes"]]
    for episode, types in zip(case["episodes"], case["types"]):
        assert types["episode"] == "rllm.types.Episode"
        assert [types["task_id"], types["rollout_idx"]] == episode["id"].split(":")
        assert types["steps"] == ["ModelOutput", "Step"]


def test_rllm_keeps_weight_versions_and_step_credit() -> None:
    (ep,) = DATA["extra_episodes"]["versions_and_credit"]["episodes"]
    steps = ep["trajectories"][0]["steps"]
    assert [s["weight_version"] for s in steps] == [1, 1, 2]
    assert [s["mc_return"] for s in steps] == pytest.approx([1.75, 1.5, 1.0])
    assert steps[1]["advantage"] == pytest.approx([1.5] * 5)
    assert steps[1]["info"]["rollwire"]["weight_versions"] == [["1", 0, 2], ["2", 2, 5]]
    (ep,) = DATA["extra_episodes"]["numeric_weight_version"]["episodes"]
    (step,) = ep["trajectories"][0]["steps"]
    assert step["weight_version"] == 12 and step["model_output"]["weight_version"] == 12


def test_rllm_termination_reasons_are_rollwires() -> None:
    reasons = {e["info"]["rollwire"]["status"]: e["termination_reason"] for e in DATA["episodes"]}
    assert reasons == {"completed": "env_done", "failed": "error"}
    failed = [e for e in DATA["episodes"] if e["termination_reason"] == "error"]
    assert failed and all(not e["trajectories"] and not e["is_correct"] for e in failed)


def test_flow_test_configs_have_rllms_fields() -> None:
    """The ``AgentConfig`` / ``Task`` the flow tests hand ``arun`` are rLLM's, field for field."""
    assert [f.name for f in dataclasses.fields(AgentConfig)] == DATA["flow_types"]["AgentConfig"]
    ours = [f.name for f in dataclasses.fields(Task)]
    assert ours == DATA["flow_types"]["Task"][: len(ours)]  # rLLM's later fields have defaults


# -- Step.routing_matrices: rLLM's verl backend and its Tinker path -----------------------------

ROUTING = DATA["routing"]


def _moe() -> tuple[dict[str, Any], Rollout]:
    (episode,) = [
        e for e in to_episode_dicts(_batch()) if e["id"] == ROUTING["verl"]["moe_episode"]
    ]
    rid = episode["info"]["rollwire"]["rollout_id"]
    (rollout,) = [r for g in _batch() for r in g.rollouts if r.rollout_id == rid]
    return episode, rollout


def test_rllm_verl_decodes_each_step_as_the_captured_routing() -> None:
    episode, rollout = _moe()
    steps = episode["trajectories"][0]["steps"]
    assert len(steps) == len(ROUTING["verl"]["steps"]) == len(rollout.calls)
    for step, call, theirs in zip(steps, rollout.calls, ROUTING["verl"]["steps"]):
        assert call.routed_experts is not None
        assert theirs["decoded"] == _summary(call.routed_experts)
        assert _summary(decode_verl_routing(step["routing_matrices"])) == theirs["decoded"]


@pytest.mark.parametrize("which", ["moe", "batch"])
def test_rllm_verl_rows_and_routed_experts_are_rollwires(which: str) -> None:
    """rLLM's verl rows are rollwire's rows with their routing; ``routed_experts`` places each
    from the row's first prompt column, and is dropped unless every row of the batch has it."""
    data = ROUTING["verl"][which]
    episodes = to_episode_dicts(_batch())
    if which == "moe":
        episodes = [e for e in episodes if e["id"] == ROUTING["verl"]["moe_episode"]]
    rollouts = {r.rollout_id: r for g in _batch() for r in g.rollouts}
    rows = []
    for e in episodes:
        # the Episode's own rows for the tokens; the rollout's rows for the captured routing
        if not e["trajectories"]:
            continue  # a failed rollout: no rows for rLLM
        built = build_rows([rollouts[e["info"]["rollwire"]["rollout_id"]]])
        mine = episode_rows(e)
        assert [b.input_ids.tolist() for b in built] == [m.input_ids.tolist() for m in mine]
        rows += built
    assert len(rows) == len(data["rows"])
    for row, theirs in zip(rows, data["rows"]):
        assert theirs["prompt"] + theirs["response"] == row.input_ids.tolist()
        assert theirs["mask"] == row.loss_mask.astype(int).tolist()
        if "routing" in theirs:
            assert row.routed_experts is not None
            assert theirs["routing"] == _summary(row.routed_experts)
    routed = [r for r in rows if r.routed_experts is not None]
    assert data["rows_with_routing"] == len(routed)
    if len(routed) < len(rows):
        assert data["routed_experts"] is None
        return
    p, r = data["max_prompt"], data["max_response"]
    placed = np.zeros((len(rows), p + r, *routed[0].routed_experts.shape[1:]), np.int16)
    for i, row in enumerate(rows):
        assert row.routed_experts is not None
        start = p - len(row.prompt_ids)
        placed[i, start : start + len(row.routed_experts)] = row.routed_experts
    assert data["routed_experts"] == _summary(placed)


def test_rllm_verl_reads_a_two_token_step_but_not_its_tinker_form() -> None:
    rollout = moe_rollout("two")
    call = rollout.calls[0]
    p = call.prompt_ids.shape[0]
    call.completion_ids, call.logprobs = call.completion_ids[:2], call.logprobs[:2]
    assert call.routed_experts is not None
    call.routed_experts = call.routed_experts[: p + 1]
    recorded = ROUTING["verl"]["two_token_step"]
    assert recorded["verl"] == _summary(decode_verl_routing(routing_matrices(call, "verl")))
    assert recorded["tinker"] == {"error": "TypeError"}  # the README's warning
    # a per-token list of any other length is ignored by the verl backend
    assert ROUTING["verl"]["tinker_form_read_by_verl"] == [None, None]


def test_rllm_tinker_path_passes_each_tokens_routing_with_its_input() -> None:
    """rLLM's Tinker datum carries, at input position i, the routing of the forward pass that
    sampled token i + 1 (``routed_experts[i]``), and ``""`` where token i + 1 was not sampled."""
    (episode,) = [
        e
        for e in to_episode_dicts(_batch(), routing_format="tinker")
        if e["id"] == ROUTING["tinker"]["episode"]
    ]
    (row,) = episode_rows(episode)
    (datum,) = ROUTING["tinker"]["datums"]
    _, rollout = _moe()
    experts = rollout.calls[-1].routed_experts
    assert experts is not None
    assert datum["model_input"] == row.input_ids[:-1].tolist()
    sampled = np.concatenate([np.zeros(len(row.prompt_ids)), row.loss_mask])[1:]
    assert len(datum["routing_matrices"]) == len(sampled)
    for i, (entry, s) in enumerate(zip(datum["routing_matrices"], sampled)):
        if s:
            np.testing.assert_array_equal(decode_routing_matrix(entry), experts[i])
        else:
            assert entry == ""
