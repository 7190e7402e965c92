"""``rollwire train --trainer verl`` end to end on the CPU: verl's supervised warm-up, rollouts
through the gateway, verl's actor updating, every sync verified against the actor, a resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

pytest.importorskip("verl")

pytestmark = pytest.mark.timeout(900)

OPTIONS = ("--trainer", "verl", "--warmup-steps", "20", "--eval-size", "8", "--eval-k", "1")


def _steps(out: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in (out / "steps.jsonl").read_bytes().splitlines()]


def test_two_steps_every_sync_verified_then_a_resume(train_cli: Any, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = train_cli(*OPTIONS, "--steps", "2", "--out", str(out))
    steps = _steps(out)
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        assert s["policy_versions"] == [str(s["step"] - 1)], s
        assert s["rollouts"] == 32 and s["failed"] == 0
        # every token the policy sampled was trained on
        assert s["sampled_tokens"] == s["trained_tokens"] > 0, s
        for key in ("loss", "grad_norm", "kl_behaviour", "is_ratio_min", "is_ratio_max"):
            assert key in s["trainer"], (key, s["trainer"])
        # the engine served exactly the weights verl's actor held: ratios of 1
        assert 0.99 < s["trainer"]["is_ratio_min"] <= s["trainer"]["is_ratio_max"] < 1.01
        assert s["sync"]["sync/servers_verified"] == 1 and s["sync"]["sync/servers_failed"] == 0
        assert s["sync"]["sync/probe_max_abs_diff"] < 1e-3
    assert (out / "warmup" / "warmup.json").is_file()
    assert (out / "final" / "model.safetensors").is_file()
    assert (out / "checkpoints" / "step-2" / "state.json").is_file()
    assert "held-out pass@1 after" in proc.stdout
    assert "Saved model" not in proc.stdout + proc.stderr  # verl's own log lines stay quiet

    proc = train_cli(*OPTIONS, "--steps", "3", "--out", str(out), "--resume")
    assert "baseline before step 1" not in proc.stdout
    steps = _steps(out)
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert steps[-1]["policy_versions"] == ["2"]
    assert steps[-1]["sync"]["sync/servers_verified"] == 1


def test_help_trainer_lists_verls_options(train_cli: Any) -> None:
    proc = train_cli("--trainer", "verl", "--help-trainer")
    for flag in ("--rollout-is", "--rollout-is-threshold", "--clip-ratio", "--loss-agg-mode"):
        assert flag in proc.stdout
