"""What every standard's ``rollwire train`` run must show: two steps of 16 rollouts, none
failed, every sampled token trained, the environment's rewards recorded, the weights moved by RL
(the final policy differs from the warmed-up one) and every push verified."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

__all__ = ["assert_trained", "step_rollouts", "steps"]


def steps(run: Path) -> list[dict[str, Any]]:
    """``steps.jsonl`` of ``run``."""
    return [orjson.loads(line) for line in (run / "steps.jsonl").read_bytes().splitlines()]


def step_rollouts(run: Path, step: int) -> list[dict[str, Any]]:
    """The rollouts step ``step`` trained on."""
    path = run / "rollouts" / f"step-{step}.jsonl"
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def _weights_moved(before: Path, after: Path) -> float:
    from safetensors.torch import load_file

    a, b = load_file(str(before / "model.safetensors")), load_file(str(after / "model.safetensors"))
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def assert_trained(run: Path) -> list[dict[str, Any]]:
    """Check the run (see the module docstring); returns its steps."""
    records = steps(run)
    assert [s["step"] for s in records] == [1, 2]
    # the warmed-up policy's tool calls parse; after an RL step the tiny model may drift into
    # text (steps.jsonl flags that step: what the tool-call health counters are for)
    assert records[0]["tool_calls_parsed"] > 0, records[0]
    for s in records:
        assert s["rollouts"] == 16 and s["failed"] == 0, s
        assert s["sampled_tokens"] == s["trained_tokens"] > 0, s
        assert s["tool_offered_calls"] >= 16, s
        if s["tool_calls_parsed"] == 0:
            assert "no_tool_calls_parsed" in s["flags"], s
        assert s["sync"]["sync/servers_verified"] == 1, s
        assert s["sync"]["sync/probe_max_abs_diff"] < 1e-3, s
        rewards = [r["reward"] for r in step_rollouts(run, s["step"])]
        assert len(rewards) == 16 and all(r is not None for r in rewards)
        assert abs(sum(rewards) / 16 - s["reward_mean"]) < 1e-6, (rewards, s)
    # a step whose group rewards all tie has no advantage to follow: some step must have moved
    assert max(s["trainer"]["grad_norm"] for s in records) > 0, records
    assert _weights_moved(run / "warmup", run / "final") > 0
    return records
