"""``rollwire train --async``: each step's rollouts ran while the previous step trained, no rollout
was sampled more than ``max_staleness`` versions behind the weights that trained on it, and TRL's
importance sampling saw the difference (ratios away from 1)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
import pytest

pytestmark = pytest.mark.timeout(900)
STEPS = 4


def _steps(out: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in (out / "steps.jsonl").read_bytes().splitlines()]


@pytest.fixture(scope="module")
def async_run(trl: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    import torch

    from rollwire.trainer.loop import RunSpec, run
    from rollwire_trl.policy_trainer import TrlTrainer

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("async") / "run"
    spec = RunSpec(
        out=out,
        steps=STEPS,
        tasks_per_step=2,
        group_size=4,
        warmup_steps=30,
        eval_every=0,
        eval_size=4,
        eval_k=1,
        save_every=STEPS,
        progress=False,
        async_rollouts=True,
        max_staleness=1,
        log=lambda _line: None,
    )
    return out, run(spec, TrlTrainer(spec))


def test_rollouts_ran_ahead_within_the_staleness_bound(async_run: tuple[Path, Any]) -> None:
    out, result = async_run
    steps = _steps(out)
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    for s in steps:
        # step k trains the weights of step k-1; its batch came from version k-2 or k-1
        versions = [int(v) for v in s["policy_versions"]]
        assert versions, s
        lag = (s["step"] - 1) - min(versions)
        assert 0 <= lag <= 1, s
        assert s["rollouts"] == 8 and s["failed"] == 0
    # from step 2 on the batch was rolled out during the step before: the step waited for
    # less than the rollouts took, and at least one batch was a whole version behind
    later = steps[1:]
    assert sum(s["rollout_wait_s"] < s["rollout_s"] for s in later) >= len(later) - 1, later
    assert any(min(int(v) for v in s["policy_versions"]) == s["step"] - 2 for s in later), later
    assert result.final.step == STEPS


def test_importance_sampling_corrects_the_stale_batches(async_run: tuple[Path, Any]) -> None:
    out, _ = async_run
    steps = _steps(out)
    stale = [s for s in steps if min(int(v) for v in s["policy_versions"]) == s["step"] - 2]
    assert stale
    # a batch from the weights before the last update: the trainer's log-probs differ from
    # the captured ones, so some ratio leaves 1 (step 1 is on-policy: no update yet)
    moved = [
        s
        for s in stale
        if s["trainer"]["is_ratio_max"] > 1.001 or s["trainer"]["is_ratio_min"] < 0.999
    ]
    assert moved, [s["trainer"] for s in stale]
    # the weights TRL's loss applied are truncated at 3 (token_truncate)
    assert all(s["trainer"]["is_weight_max"] <= 3.0 + 1e-6 for s in steps)
