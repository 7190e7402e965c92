"""Two roles, two adapters, both learn (``rollwire train --roles planner,executor``): the relay
task on the embedded engine, then each role's own held-out measure
(:func:`rollwire.envs.relay.measure_roles`) before RL (the warmed-up model: the zero-initialised
adapters change nothing) and after (each role's final adapter), 64 held-out tasks x 4 rollouts.
The planner's measure is ``note_correct``, the executor's ``action_follows_note`` over the
rollouts whose note named a digit; each role's 95 % Wilson intervals must be disjoint, so a run
that trained one role only (or whose adapters the servers never applied) fails.

The configuration is the smallest that passed with room to spare on a loaded 2-core machine
(150-190 s for the warm-up, the steps and both measurements). The teacher of the warm-up is
right half the time (``benchmarks/roles.py``'s default 30 %): the reward needs both roles right,
so the stronger start gives each role a signal within few steps. The same configuration through
``benchmarks/roles.py --warmup-steps 100 --teacher-accuracy 0.5 --steps 30 --seed S`` (its own
agent, tasks and SFT file; 64 held-out tasks x 4): seed 0 planner 0.316 -> 0.832, executor
0.424 -> 0.918; seed 1 planner 0.332 -> 0.641, executor 0.340 -> 0.871, intervals apart.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
import pytest

ROLES = ("planner", "executor")
STEPS = 30
HELDOUT, K = 64, 4
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def measured(trl: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The run, and each measure's ``(hits, count)`` before RL and after."""
    from rollwire.envs.relay import make_tasks, measure_roles
    from rollwire.trainer.loop import RunSpec, run
    from rollwire_trl.policy_trainer import TrlTrainer

    out = tmp_path_factory.mktemp("roles-learning") / "run"
    spec = RunSpec(
        out=out, task="relay", roles=list(ROLES), lora_rank=8, seed=0,
        warmup_steps=100, teacher_accuracy=0.5, steps=STEPS, tasks_per_step=4, group_size=8,
        learning_rate=1e-3, eval_every=0, eval_size=4, eval_k=1, save_every=STEPS,
        progress=False, options={"threads": 1}, log=lambda _: None,
    )  # fmt: skip
    trainer: Any = TrlTrainer(spec)
    run(spec, trainer)
    held = make_tasks(HELDOUT, "heldout", 1)
    adapters = {role: out / "final" / role for role in ROLES}
    return {
        "out": out,
        "before": measure_roles(out / "warmup", held, K),
        "after": measure_roles(out / "warmup", held, K, adapters),
    }


@pytest.mark.parametrize("role", ROLES)
def test_each_role_learns_its_own_held_out_measure(measured: dict[str, Any], role: str) -> None:
    from rollwire.envs.relay import ROLE_MEASURES
    from rollwire.evaluation.estimators import wilson_interval

    name = ROLE_MEASURES[role]
    before = wilson_interval(*measured["before"][name])
    after = wilson_interval(*measured["after"][name])
    report = {"before": measured["before"], "after": measured["after"]}
    assert measured["before"][name][1] >= HELDOUT * K // 2, report  # most notes named a digit
    assert measured["after"][name][1] >= HELDOUT * K // 2, report
    assert after.low > before.high, (name, before, after, report)  # disjoint 95 % intervals


def test_every_step_trained_and_pushed_each_role(measured: dict[str, Any]) -> None:
    out: Path = measured["out"]
    steps = [orjson.loads(line) for line in (out / "steps.jsonl").read_bytes().splitlines()]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    for s in steps:
        for role in ROLES:
            record = s["roles"][role]
            assert record["rows"] > 0 and record["adapter"] == f"{role}@{s['step']}", record
            assert record["verified"] is True, record
