"""``RolloutClient.evaluate``: the Wordle demo setup (embedded engine, gateway, agent) at two
temperatures, through the real client."""

from __future__ import annotations

import pytest

from rollwire.engine import EmbeddedEngine, EngineConfig
from rollwire.envs.wordle import WordleSolver, make_tasks
from rollwire.envs.wordle.agent_openai import app
from rollwire.gateway import serve_in_thread
from rollwire.trainer.client import RolloutClient
from rollwire.trainer.runners import LocalRunner


def test_evaluate_at_two_temperatures(capsys: pytest.CaptureFixture[str]) -> None:
    with (
        EmbeddedEngine(EngineConfig(scripted=WordleSolver(seed=0), seed=0)) as engine,
        serve_in_thread(backends=[(engine.url, "vllm")]) as gw,
    ):
        client = RolloutClient(
            gw,
            runner=LocalRunner(app),
            group_size=3,
            sampling={"max_tokens": 48},
            progress=True,  # stderr is not a terminal here: no bar may be drawn
        )
        result = client.evaluate(
            make_tasks(2, "validation"), [{"temperature": 0.0}, {"temperature": 1.0}], k=2
        )
        client.close()
        with gw.client() as c:
            records = c.list_sessions()
    assert client.sampling == {"max_tokens": 48} and client.group_size == 3
    assert client.session_options == {}
    # the gateway's own record of each session says it was an evaluation, and at which setting
    assert len(records) == 8
    marks = sorted(r.metadata["eval"]["setting"] for r in records)
    assert marks == ["temperature=0.0"] * 4 + ["temperature=1.0"] * 4
    assert all("rollout_index" in r.metadata for r in records)
    names = [s.setting.name for s in result.settings]
    assert names == ["temperature=0.0", "temperature=1.0"]
    for s in result.settings:
        assert (s.tasks, s.attempts) == (2, 4)
        assert s.completed + s.failed == 4
        assert set(s.pass_at_k) == {1, 2}
        assert s.pass_at_k[1].value <= s.pass_at_k[2].value
        assert 0.0 <= s.success_rate.low <= s.success_rate.value <= s.success_rate.high <= 1.0
    assert client.stats.rollouts == 4  # the last setting's run
    assert capsys.readouterr().err == ""
