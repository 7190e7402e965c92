"""One policy per role (``rollwire train --roles planner,executor``) on the embedded engine:
two steps of the relay task's agent (whose calls ask for ``model="planner"`` and
``model="executor"``), run as a user's own agent (``--agent``/``--tasks``/``--eval-tasks``,
the warm-up from ``--sft``). Each role's adapter trains on its own rows, is pushed as
``<role>@<step>``, verified through that adapter, and the next step's calls of each role were
answered by it; an update of one role leaves the other role's adapter as it was; ``--resume``
continues each role from the checkpoint's adapter."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
import pytest

ROLES = ("planner", "executor")
pytestmark = pytest.mark.timeout(1200)


def _jsonl(path: Path, items: list[Any]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in items))
    return path


@pytest.fixture(scope="module")
def run(trl: ModuleType, train_cli: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rollwire.envs.relay import make_tasks, warmup_conversations

    cwd = tmp_path_factory.mktemp("roles")
    _jsonl(cwd / "tasks.jsonl", make_tasks(8, "train", 0))
    _jsonl(cwd / "heldout.jsonl", make_tasks(4, "heldout", 1))
    _jsonl(cwd / "sft.jsonl", warmup_conversations(320))
    train_cli("--out", "run", *_options(cwd), "--steps", "2", cwd=cwd, timeout=1100)
    return cwd / "run"


def _options(cwd: Path) -> tuple[str, ...]:
    """The run's options besides ``--out`` and ``--steps`` (the files the fixture wrote)."""
    return (
        "--agent", "rollwire.envs.relay.agent_openai:app", "--tasks", str(cwd / "tasks.jsonl"),
        "--eval-tasks", str(cwd / "heldout.jsonl"), "--sft", str(cwd / "sft.jsonl"),
        "--warmup-steps", "10", "--lora-rank", "8", "--roles", ",".join(ROLES),
        "--tasks-per-step", "2", "--group-size", "4", "--seed", "0",
        "--eval-size", "4", "--eval-k", "1", "--eval-every", "0", "--threads", "1",
    )  # fmt: skip


def _steps(run: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in (run / "steps.jsonl").read_bytes().splitlines()]


def test_each_step_records_each_role_and_syncs_its_adapter(run: Path) -> None:
    from rollwire.data.dataset import read_jsonl

    steps = _steps(run)
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        roles = s["roles"]
        assert sorted(roles) == sorted(ROLES), s
        calls = [
            c for r in read_jsonl(run / "rollouts" / f"step-{s['step']}.jsonl") for c in r.calls
        ]
        for role in ROLES:
            record = roles[role]
            assert record["calls"] == sum(c.request.get("model") == role for c in calls)
            assert record["rows"] > 0 and record["trained_tokens"] > 0, record
            assert record["adapter"] == f"{role}@{s['step']}" and record["version"] == str(
                s["step"]
            )
            assert record["verified"] is True and record["probe_max_abs_diff"] < 1e-3, record
            assert "loss" in record and "grad_norm" in record
        # every trained token is one role's
        assert s["trained_tokens"] == sum(roles[r]["trained_tokens"] for r in ROLES)
        assert s["sync"]["sync/servers_verified"] == 1 and s["sync"]["sync/servers_failed"] == 0
    summary = orjson.loads((run / "summary.json").read_bytes())
    assert summary["roles"] == list(ROLES)
    for role in ROLES:  # each role's adapter alone, exported and kept
        assert (run / "policy" / "step-2" / role / "adapter_model.safetensors").is_file()
        assert (run / "final" / role / "adapter_config.json").is_file()


def test_the_next_step_calls_of_each_role_were_answered_by_its_adapter(run: Path) -> None:
    from rollwire.data.dataset import read_jsonl

    calls = [c for r in read_jsonl(run / "rollouts" / "step-2.jsonl") for c in r.calls]
    assert {c.request.get("model") for c in calls} == set(ROLES)
    for call in calls:
        assert call.response is not None
        assert call.response["model"] == f"{call.request['model']}@1", call.response
        assert call.policy_version == "1"


def test_a_role_update_changes_its_own_adapter_only(trl: ModuleType, run: Path) -> None:
    """The trainer of the run's warmed-up model, one update of the planner on the planner's
    rows of step 1: the planner's LoRA weights moved, the executor's did not."""
    import torch

    from rollwire.data.dataset import read_jsonl
    from rollwire.trainer.loop import RunSpec
    from rollwire.trainer.roles import role_rollouts
    from rollwire.trainer.train_batch import build_train_batch
    from rollwire_trl.policy_trainer import TrlTrainer

    out = run.parent / "unit"
    spec = RunSpec(
        out=out, model=run / "warmup", lora_rank=8, roles=list(ROLES), learning_rate=1e-2,
        warmup_steps=0, log=lambda _: None,
    )  # fmt: skip
    trainer = TrlTrainer(spec)
    trainer.start(spec)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}
    rollouts = read_jsonl(run / "rollouts" / "step-1.jsonl")
    # rewards that differ within each group, so the update has a gradient
    for i, rollout in enumerate(rollouts):
        rollout.reward = float(i % 2)
    batch = build_train_batch(role_rollouts(rollouts, "planner"))
    assert batch.rows
    trainer.use_role("planner")
    trainer.update(batch)
    moved = {
        n: not torch.equal(p.detach(), before[n])
        for n, p in trainer.model.named_parameters()
        if "lora_" in n
    }
    assert any(v for n, v in moved.items() if ".planner." in n)
    assert not any(v for n, v in moved.items() if ".executor." in n)


@pytest.fixture(scope="module")
def resumed(run: Path, train_cli: Any) -> Path:
    """A copy of the run, resumed by ``--resume --steps 3`` from its step-2 checkpoint."""
    out = run.parent / "resumed"
    shutil.copytree(run, out)
    train_cli("--out", str(out), *_options(run.parent), "--steps", "3", "--resume",
              cwd=run.parent, timeout=1100)  # fmt: skip
    return out


def test_resume_continues_each_role_from_the_checkpoint(trl: ModuleType, resumed: Path) -> None:
    """Each role's adapter of the step-2 checkpoint is pushed as ``<role>@2`` and verified
    before step 3, whose calls it answered; step 3 trains and verifies both roles again."""
    import torch
    from safetensors.torch import load_file

    from rollwire.data.dataset import read_jsonl

    out = resumed
    steps = _steps(out)
    assert [s["step"] for s in steps] == [1, 2, 3]
    roles = steps[-1]["roles"]
    for role in ROLES:
        record = roles[role]
        assert record["rows"] > 0 and record["adapter"] == f"{role}@3", record
        assert record["verified"] is True and record["probe_max_abs_diff"] < 1e-3, record
        # what the servers were given at the resume is the checkpoint's adapter
        pushed = load_file(out / "policy" / "resume-2" / role / "adapter_model.safetensors")
        saved = load_file(
            out / "checkpoints" / "step-2" / "adapter" / role / "adapter_model.safetensors"
        )
        assert sorted(pushed) == sorted(saved) and pushed
        assert all(torch.equal(pushed[k], saved[k]) for k in saved), role
    assert steps[-1]["sync"]["sync/servers_verified"] == 1
    calls = [c for r in read_jsonl(out / "rollouts" / "step-3.jsonl") for c in r.calls]
    assert {c.request.get("model") for c in calls} == set(ROLES)
    for call in calls:  # answered by the role's checkpoint adapter, pushed as <role>@2
        assert call.response is not None
        assert call.response["model"] == f"{call.request['model']}@2", call.response
        assert call.policy_version == "2"


def test_resume_loads_each_roles_optimizer_state(trl: ModuleType, resumed: Path) -> None:
    """The trainer resumed from the step-3 checkpoint holds each role's optimizer state as
    saved, each in that role's own optimizer."""
    import torch

    from rollwire.trainer.loop import RunSpec
    from rollwire_trl.policy_trainer import TrlTrainer

    spec = RunSpec(
        out=resumed, model=resumed / "warmup", lora_rank=8, roles=list(ROLES), resume=True,
        warmup_steps=0, log=lambda _: None,
    )  # fmt: skip
    trainer = TrlTrainer(spec)
    start = trainer.start(spec)
    assert (
        start.step == 3 and start.adapters is not None and sorted(start.adapters) == sorted(ROLES)
    )
    saved = torch.load(resumed / "checkpoints" / "step-3" / "optimizer.pt")
    for role in ROLES:
        state = trainer.optimizers[role].state_dict()["state"]
        assert state and sorted(state) == sorted(saved[role]["state"]), role
        for key, value in saved[role]["state"].items():
            assert torch.equal(state[key]["exp_avg_sq"], value["exp_avg_sq"]), (role, key)
    first = saved[ROLES[0]]["state"][0]["exp_avg_sq"]
    assert not torch.equal(first, saved[ROLES[1]]["state"][0]["exp_avg_sq"])  # two states
