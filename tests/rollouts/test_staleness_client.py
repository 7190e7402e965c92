"""``RolloutClient(max_staleness=...)`` (issue 25.1): a run's rollouts are held while the served
policy is too far behind the trainer (``hold``), or run with their calls flagged (``mark``)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from rollwire.data.protocol import Group
from rollwire.data.trajectory import build_rows
from rollwire.envs.wordle import make_tasks
from rollwire.envs.wordle.agent_openai import app as wordle_app
from rollwire.trainer.client import RolloutClient


def _client(stack: Any, **kw: Any) -> RolloutClient:
    return RolloutClient(
        stack,
        runner="local",
        app=wordle_app,
        group_size=2,
        sampling={"max_tokens": 48},
        deadline=60,
        **kw,
    )


def _calls(groups: list[Group]) -> list[Any]:
    return [c for g in groups for r in g.rollouts for c in r.calls]


def test_mark_flags_every_call_of_a_run_beyond_the_bound(stack: Any) -> None:
    with stack.client() as c:
        c.set_trainer_version(c.staleness()["policy_seq"] + 1)
        try:
            groups = _client(stack, max_staleness=0, on_stale="mark").run(make_tasks(1, seed=3))
        finally:
            c.set_trainer_version(None)
    calls = _calls(groups)
    assert calls and all("stale" in call.flags and not call.trainable for call in calls)
    assert all(int(row.loss_mask.sum()) == 0 for row in build_rows(groups))
    # within the bound, the same run trains
    groups = _client(stack, max_staleness=0, on_stale="mark").run(make_tasks(1, seed=3))
    assert all("stale" not in call.flags for call in _calls(groups))
    assert all(int(row.loss_mask.sum()) > 0 for row in build_rows(groups))


def test_hold_waits_for_the_servers_to_catch_up(stack: Any) -> None:
    with stack.client() as c:
        seq = c.staleness()["policy_seq"]
        c.set_trainer_version(seq + 1, version="next")
        out: list[list[Group]] = []
        client = _client(stack, max_staleness=0)
        run = threading.Thread(target=lambda: out.append(client.run(make_tasks(1, seed=4))))
        run.start()
        deadline = time.monotonic() + 60
        while c.staleness()["held"] < 2:  # both rollouts of the group wait at their first call
            assert time.monotonic() < deadline, "the rollouts were not held"
            time.sleep(0.02)
        assert not out
        c.set_policy_version("next", seq=seq + 1)  # the servers caught up
        run.join(60)
        c.set_trainer_version(None)
    calls = _calls(out[0])
    # (the engine reports its own weight version, "0": the calls keep it, flagged as a mismatch)
    assert calls and all(call.trainable and "stale" not in call.flags for call in calls)


def test_max_staleness_is_checked() -> None:
    with pytest.raises(ValueError, match="max_staleness"):
        RolloutClient("http://127.0.0.1:1", admin_key="k", max_staleness=-1)
    with pytest.raises(ValueError, match="on_stale"):
        RolloutClient("http://127.0.0.1:1", admin_key="k", max_staleness=1, on_stale="drop")


def test_rollwire_run_takes_the_bound_from_its_flags(stack: Any, tmp_path: Any) -> None:
    import orjson
    from typer.testing import CliRunner

    from rollwire.cli import app

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(b"".join(orjson.dumps(t) + b"\n" for t in make_tasks(1, seed=5)))
    out = tmp_path / "rollouts.jsonl"
    args = ["run", "--agent", "rollwire.envs.wordle.agent_openai:app", "--tasks", str(tasks),
            "--gateway", stack.url, "--admin-key", stack.admin_key, "-n", "2",
            "--max-tokens", "48", "--no-progress", "-o", str(out), "--max-staleness", "0",
            "--on-stale", "mark"]  # fmt: skip
    with stack.client() as c:
        c.set_trainer_version(c.staleness()["policy_seq"] + 1)
        try:
            result = CliRunner().invoke(app, args)
        finally:
            c.set_trainer_version(None)
    assert result.exit_code == 0, result.output
    calls = [c for line in out.read_bytes().splitlines() for c in orjson.loads(line)["calls"]]
    assert calls and all("stale" in c["flags"] and not c["trainable"] for c in calls)
    bad = CliRunner().invoke(app, [*args[:-1], "later", "--force"])
    assert bad.exit_code == 2 and "on_stale must be 'hold' or 'mark'" in bad.output
