"""One policy per role (``rollwire train --roles planner,executor``) on the embedded engine:
two steps of the relay task's agent (whose calls ask for ``model="planner"`` and
``model="executor"``), run as a user's own agent (``--agent``/``--tasks``/``--eval-tasks``,
the warm-up from ``--sft``). Each role's adapter trains on its own rows, is pushed as
``<role>@<step>``, verified through that adapter, and the next step's calls of each role were
answered by it; an update of one role leaves the other role's adapter as it was."""

from __future__ import annotations

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
    tasks = _jsonl(cwd / "tasks.jsonl", make_tasks(8, "train", 0))
    held = _jsonl(cwd / "heldout.jsonl", make_tasks(4, "heldout", 1))
    sft = _jsonl(cwd / "sft.jsonl", warmup_conversations(320))
    train_cli(
        "--out", "run", "--agent", "rollwire.envs.relay.agent_openai:app",
        "--tasks", str(tasks), "--eval-tasks", str(held), "--sft", str(sft),
        "--warmup-steps", "10", "--lora-rank", "8", "--roles", ",".join(ROLES),
        "--steps", "2", "--tasks-per-step", "2", "--group-size", "4", "--seed", "0",
        "--eval-size", "4", "--eval-k", "1", "--eval-every", "0", "--threads", "1",
        cwd=cwd, timeout=1100,
    )  # fmt: skip
    return cwd / "run"


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
