"""``rollwire train --trainer tinker`` end to end against SkyRL's real server on the CPU: the CLI
starts the server on the embedded model made dense, warms it up through ``cross_entropy``, runs
the lockbox agent through the gateway's ``tinker`` backend, and trains two steps.

Runs in .venv-tinker (packages/adapter-tinker/ci/run-tests.sh, inside a network namespace with
only loopback). The plugin's ``policy_trainer`` is wrapped to set the run's ``on_step``, which
keeps each step's trace (groups, the loop's batch, the Tinker step's statistics, the sync
report): the test checks every datum against the rows it came from.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

from rollwire.cli.app import app
from rollwire.data.trajectory import build_rows
from rollwire.trainer.loop import StepTrace
from rollwire_tinker.adapter import TinkerAdapter
from rollwire_tinker.datums import row_datum

pytestmark = pytest.mark.timeout(1800)
STEPS, TASKS_PER_STEP, GROUP = 2, 2, 4


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[StepTrace], str]:
    out = tmp_path_factory.mktemp("tinker-train") / "run"
    traces: list[StepTrace] = []
    real = TinkerAdapter.policy_trainer

    def keep_traces(self: TinkerAdapter, spec: Any) -> Any:
        spec.on_step = traces.append
        return real(self, spec)

    mp = pytest.MonkeyPatch()
    mp.setattr(TinkerAdapter, "policy_trainer", keep_traces)
    args = [
        "train", "--trainer", "tinker", "--out", str(out), "--seed", "0",
        "--steps", str(STEPS), "--tasks-per-step", str(TASKS_PER_STEP), "--group-size", str(GROUP),
        "--warmup-steps", "2", "--eval-size", "4", "--eval-k", "2", "--eval-every", "1",
        "--no-progress",
    ]  # fmt: skip
    t0 = time.perf_counter()
    try:
        result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    finally:
        mp.undo()
    print(f"\nrollwire train --trainer tinker, {STEPS} steps: {time.perf_counter() - t0:.0f} s")
    assert result.exit_code == 0, (result.output[-4000:], result.exception)
    return out, traces, result.output


def test_two_steps_each_swap_the_sampler_and_stamp_its_checkpoint_name(
    run: tuple[Path, list[StepTrace], str],
) -> None:
    out, traces, output = run
    assert [t.step for t in traces] == [1, 2]
    for t in traces:
        assert t.sync.version == f"tinker-{t.step:06d}"
        # the probe: the swapped-in sampler's greedy log-probs match the trainer's forward pass
        (backend,) = t.sync.backends
        assert backend.kind == "tinker" and backend.pushed and backend.verified, t.sync
        assert backend.max_abs_diff is not None and backend.max_abs_diff <= 0.05
        # every call of step n was sampled by the checkpoint step n - 1 swapped in
        calls = [c for g in t.groups for r in g.rollouts for c in r.calls]
        assert len(calls) >= TASKS_PER_STEP * GROUP
        assert {c.policy_version for c in calls} == {f"tinker-{t.step - 1:06d}"}
    steps = [orjson.loads(line) for line in (out / "steps.jsonl").read_bytes().splitlines()]
    assert [s["policy_versions"] for s in steps] == [["tinker-000000"], ["tinker-000001"]]
    assert all(s["rollouts"] == TASKS_PER_STEP * GROUP and s["failed"] == 0 for s in steps)
    assert all(s["eval"]["attempts"] == 8 for s in steps)
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["trainer"] == "tinker" and summary["steps"] == STEPS
    final = orjson.loads((out / "final.json").read_bytes())
    assert summary["final_dir"] == str(out / "final.json")
    assert final["policy_version"] == "tinker-000002"
    assert final["model_path"].startswith("tinker://") and final["model_path"].endswith("000002")
    assert all(s["sampled_tokens"] == s["trained_tokens"] > 0 for s in steps)
    assert all((out / "rollouts" / f"step-{s['step']}.jsonl").is_file() for s in steps)
    assert summary["warmup_steps"] == 2 and summary["baseline"]["attempts"] == 8
    assert (out / "report.html").is_file()
    assert "step   2/2" in output and "held-out pass@1" in output


def test_each_datum_is_the_row_it_came_from_field_by_field(
    run: tuple[Path, list[StepTrace], str],
) -> None:
    _, traces, _ = run
    for t in traces:
        rollouts = [r for g in t.groups for r in g.rollouts if r.status == "completed"]
        rows = {(r.rollout_id, r.row_index): r for r in build_rows(rollouts)}
        datums = [row_datum(r.row, r.advantage) for r in t.batch.rows]
        assert len(datums) == len(rows) == TASKS_PER_STEP * GROUP
        by_id = {r.rollout_id: r for r in rollouts}
        for d in datums:
            row = rows[(d.rollout_id, d.row_index)]
            rollout = by_id[d.rollout_id]
            ids = row.input_ids.astype(np.int64)
            np.testing.assert_array_equal(d.model_input, ids[:-1])
            np.testing.assert_array_equal(d.target_tokens, ids[1:])
            group = [x.reward for x in rollouts if x.group_id == rollout.group_id]
            # GRPO's, the same for every trainer: centred, scaled by the group's sample std
            scale = float(np.std(group, ddof=1)) + 1e-4
            advantage = np.float32((rollout.reward - float(np.mean(group))) / scale)
            for j in range(ids.shape[0] - 1):
                r = j + 1 - row.prompt_len  # the response token target j predicts
                if r >= 0 and row.loss_mask[r] == 1:
                    assert d.logprobs[j] == row.logprobs[r] and d.advantages[j] == advantage
                else:  # prompt, observation and template tokens: context only
                    assert d.logprobs[j] == 0.0 and d.advantages[j] == 0.0
            # the trained targets are exactly what the sampler returned, call by call, with its
            # own log-probs (the gateway's capture, not a re-scoring)
            trained = d.trained()
            sampled = np.concatenate([c.completion_ids for c in rollout.calls])
            captured = np.concatenate([c.logprobs for c in rollout.calls])
            np.testing.assert_array_equal(d.target_tokens[trained], sampled)
            np.testing.assert_array_equal(d.logprobs[trained], captured)
            assert d.policy_version == f"tinker-{t.step - 1:06d}"
        # before the step's update the trainer's log-probs of the sampled tokens are the
        # sampler's: each behaviour log-prob sits on its own token
        assert t.stats["logp_diff_mean"] < 0.05, t.stats
        assert t.batch.trained_tokens == sum(int(d.trained().sum()) for d in datums)
        assert t.record.trainer["datums"] == len(datums)


def test_the_cli_refuses_tinker_options_with_trl_and_the_reverse(tmp_path: Path) -> None:
    runner = CliRunner()
    # another trainer's option (TRL's) is refused by name, with the trainer's own listed
    args = ["train", "--trainer", "tinker", "--out", str(tmp_path / "a"), "--importance-sampling"]
    res = runner.invoke(app, [*args, "off"])
    assert res.exit_code != 0
    assert "no such option '--importance-sampling' for --trainer tinker" in res.output
    assert "--loss-fn" in res.output
    res = runner.invoke(
        app, ["train", "--trainer", "tinker", "--out", str(tmp_path / "b"), "--base-model", "m"]
    )
    assert res.exit_code != 0 and "pass its --base-url too" in res.output
    res = runner.invoke(app, ["train", "--trainer", "tinker", "--beta", "0.1"])
    assert res.exit_code != 0 and "no KL penalty" in res.output
    res = runner.invoke(app, ["train", "--trainer", "tinker", "--help-trainer"])
    assert res.exit_code == 0 and "--loss-fn" in res.output and "--base-url" in res.output
