"""``rollwire train`` trains a user's own agent as it is: ``examples/own_agent/notes_agent.py``,
written outside rollwire (three calls per episode, one of them a side call in its own
conversation, ``max_tokens`` 24, its own reward), on the embedded engine — every sampled token
trained, the agent's sampling kept, the rollouts of each step kept, every sync verified; and the
same with LoRA (``--lora-rank 8``), resumed."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
import pytest

pytestmark = pytest.mark.timeout(1200)
ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "own_agent"
#: small steps: 2 tasks x 4 rollouts
OPTIONS = ("--seed", "0", "--tasks-per-step", "2", "--group-size", "4", "--eval-k", "1",
           "--eval-every", "0")  # fmt: skip


def _train(train_cli: Any, cwd: Path, out: str, *extra: str) -> Any:
    env = {"PYTHONPATH": str(EXAMPLE)}
    return train_cli("--out", out, *OPTIONS, *extra, cwd=cwd, env=env, timeout=1100)


def _steps(out: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in (out / "steps.jsonl").read_bytes().splitlines()]


@pytest.fixture(scope="module")
def own_agent_run(
    trl: ModuleType, train_cli: Any, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    sys.path.insert(0, str(EXAMPLE))
    try:
        import make_tasks
    finally:
        sys.path.remove(str(EXAMPLE))
    cwd = tmp_path_factory.mktemp("own")
    make_tasks.write(cwd)
    _train(
        train_cli, cwd, "run", "--agent", "notes_agent:app", "--tasks", "tasks.jsonl",
        "--eval-tasks", "heldout.jsonl", "--steps", "2", "--warmup-steps", "0",
    )  # fmt: skip
    return cwd / "run"


def test_every_sampled_token_is_trained_and_every_sync_verified(own_agent_run: Path) -> None:
    steps = _steps(own_agent_run)
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        assert s["rollouts"] == 8 and s["failed"] == 0, s
        assert s["sampled_tokens"] == s["trained_tokens"] > 0, s
        # the side call is a conversation of its own: at least two rows per rollout (more where
        # the agent's text re-tokenized differently from what was sampled: a fork)
        assert s["rows"] >= 16 and s["forked"] == 8, s
        assert s["sync"]["sync/servers_verified"] == 1, s
        assert (own_agent_run / "rollouts" / f"step-{s['step']}.jsonl").is_file()


def test_the_agent_keeps_its_own_max_tokens(own_agent_run: Path) -> None:
    from rollwire.data.dataset import read_jsonl

    rollouts = read_jsonl(own_agent_run / "rollouts" / "step-1.jsonl")
    calls = [c for r in rollouts for c in r.calls]
    assert len(calls) == 24  # three calls per episode
    assert all(c.sampling.get("max_tokens") == 24 for c in calls)
    assert all(len(c.completion_ids) <= 24 for c in calls)
    # the random model rarely stops early: most calls run to the agent's 24 tokens, not 8
    assert max(len(c.completion_ids) for c in calls) == 24
    truncated = sum(c.finish_reason == "length" for c in calls)
    assert _steps(own_agent_run)[0]["truncated_calls"] == truncated


def test_lora_on_the_default_engine_syncs_verified_and_resumes(
    trl: ModuleType, train_cli: Any, tmp_path: Path
) -> None:
    common = ("--lora-rank", "8", "--warmup-steps", "10", "--eval-size", "4", "--save-every", "1")
    _train(train_cli, tmp_path, "lora", "--steps", "2", *common)
    _train(train_cli, tmp_path, "lora", "--steps", "3", "--resume", *common)
    steps = _steps(tmp_path / "lora")
    assert [s["step"] for s in steps] == [1, 2, 3]
    for s in steps:
        assert s["sync"]["sync/servers_verified"] == 1 and s["sync"]["sync/servers_failed"] == 0
        assert s["sync"]["sync/probe_max_abs_diff"] < 1e-3, s
    # the resumed step trained the adapter the checkpoint held, on the version it served
    assert steps[2]["policy_versions"] == ["2"]
    assert (tmp_path / "lora" / "checkpoints" / "step-3" / "adapter").is_dir()
