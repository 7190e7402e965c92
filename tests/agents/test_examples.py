"""The example agents end to end: RolloutClient → RolloutApp → the framework's agent → gateway →
embedded engine (scripted) → reward posted to ``complete_url`` → rows."""

from __future__ import annotations

import importlib.util
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from rollwire.agent.serving import ServerThread
from rollwire.data.protocol import Rollout
from rollwire.data.trajectory import build_rows
from rollwire.engine.config import EngineConfig
from rollwire.engine.server import EmbeddedEngine
from rollwire.envs.wordle import WordleSolver, agent_openai, make_tasks
from rollwire.envs.wordle.failures import is_infrastructure_error
from rollwire.gateway import serve_in_thread
from rollwire.testing.agent import RecordingServer
from rollwire.trainer.client import RolloutClient

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(path: Path) -> ModuleType:
    name = f"_example_{path.parent.name}_{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


office = _load(EXAMPLES / "office" / "office.py")
office_solver = _load(EXAMPLES / "office" / "solver.py")


@pytest.fixture(scope="module")
def engine_and_gateway() -> Iterator[Callable[[Any], Any]]:
    """A factory: ``start(script)`` returns a running gateway over a scripted engine."""
    started: list[Any] = []

    def start(script: Any) -> Any:
        engine = EmbeddedEngine(EngineConfig(scripted=script)).start()
        gateway = serve_in_thread(backends=[(engine.url, "vllm")])
        started.extend([gateway, engine])
        return gateway

    yield start
    for server in started:
        server.stop()


def _check_rollout(rollout: Rollout, min_calls: int) -> None:
    assert rollout.status == "completed", rollout.error
    assert len(rollout.calls) >= min_calls
    assert all(c.status == "ok" and len(c.completion_ids) for c in rollout.calls)
    rows = build_rows([rollout])
    assert len(rows) == 1, [r.fork for r in rows]  # prefix continuity: one row per rollout
    row = rows[0]
    sampled = row.response_ids[row.loss_mask == 1]
    np.testing.assert_array_equal(
        sampled, np.concatenate([c.completion_ids for c in rollout.calls])
    )
    assert np.all(row.logprobs[row.loss_mask == 1] < 0.0)
    assert np.all(row.logprobs[row.loss_mask == 0] == 0.0)
    assert row.reward == rollout.reward


@pytest.mark.parametrize("agent", ["agent_strands", "agent_langgraph"])
def test_wordle_agent_end_to_end(agent: str, engine_and_gateway: Callable[[Any], Any]) -> None:
    gateway = engine_and_gateway(WordleSolver(seed=0))
    module = _load(EXAMPLES / "wordle" / f"{agent}.py")
    with RolloutClient(
        gateway, app=module.app, group_size=2, sampling={"temperature": 1.0}, deadline=120
    ) as rc:
        groups = rc.run(make_tasks(2, seed=3))
    assert len(groups) == 2 and all(len(g.rollouts) == 2 for g in groups)
    for group in groups:
        for rollout in group.rollouts:
            _check_rollout(rollout, min_calls=2)
            # the reward arrived through RolloutApp → complete_url, with the game's metrics
            assert rollout.reward is not None and rollout.reward > -1.5
            assert rollout.metrics["guesses"] >= 1
            assert len(rollout.calls) >= rollout.metrics["guesses"]


def test_office_agent_end_to_end(engine_and_gateway: Callable[[Any], Any]) -> None:
    gateway = engine_and_gateway(office_solver.OfficeSolver())
    agent = _load(EXAMPLES / "office" / "agent_openai.py")
    tasks = office.make_tasks(3, seed=7)
    with RolloutClient(gateway, app=agent.app, group_size=2, deadline=120) as rc:
        groups = rc.run(tasks)
    for group in groups:
        for rollout in group.rollouts:
            _check_rollout(rollout, min_calls=3)
            assert len(rollout.calls) == 3  # list_events, send_email, the closing answer
            assert rollout.reward == 1.0
            assert rollout.metrics["emails_sent"] == 1.0


def test_office_solver_mistakes_earn_nothing(engine_and_gateway: Callable[[Any], Any]) -> None:
    gateway = engine_and_gateway(office_solver.OfficeSolver(mistake_rate=1.0))
    agent = _load(EXAMPLES / "office" / "agent_openai.py")
    # a task whose user has two upcoming meetings, so the mistaken solver picks the wrong one
    task = next(t for t in office.make_tasks(50, seed=1) if _upcoming(t) >= 2)
    with RolloutClient(gateway, app=agent.app, group_size=1, deadline=120) as rc:
        (group,) = rc.run([task])
    (rollout,) = group.rollouts
    assert rollout.status == "completed"
    assert rollout.reward == 0.0
    assert rollout.metrics["right_subject"] == 0.0


def _upcoming(task: dict[str, Any]) -> int:
    me = f"{task['user']}@example.com"
    return sum(1 for e in task["calendar"] if me in e["attendees"] and e["start"] > task["now"])


def _world() -> dict[str, Any]:
    return {
        "task_id": "t",
        "user": "alice",
        "now": "2025-03-03T09:00",
        "calendar": [
            {
                "id": "a",
                "title": "Standup",
                "start": "2025-03-03T08:30",
                "organizer": "bob@example.com",
                "attendees": ["alice@example.com"],
            },
            {
                "id": "b",
                "title": "Roadmap",
                "start": "2025-03-03T11:00",
                "organizer": "carol@example.com",
                "attendees": ["alice@example.com"],
            },
            {
                "id": "c",
                "title": "Retro",
                "start": "2025-03-03T10:00",
                "organizer": "dave@example.com",
                "attendees": ["erin@example.com"],
            },
            {
                "id": "d",
                "title": "Budget",
                "start": "2025-03-04T09:00",
                "organizer": "erin@example.com",
                "attendees": ["alice@example.com"],
            },
        ],
    }


@pytest.mark.parametrize(
    ("emails", "reward"),
    [
        ([("carol@example.com", "Running late: Roadmap", "sorry")], 1.0),
        ([("bob@example.com", "Running late: Standup", "sorry")], 0.0),  # a past meeting
        ([("dave@example.com", "Running late: Retro", "sorry")], 0.0),  # not her meeting
        ([("carol@example.com", "Late", "sorry")], 0.0),  # wrong subject
        ([("carol@example.com", "Running late: Roadmap", "")], 0.0),  # no body
        ([("carol@example.com", "Running late: Roadmap", "sorry")] * 2, 0.0),  # sent twice
        ([], 0.0),
    ],
)
def test_office_reward_checks_the_state_exactly(
    emails: list[tuple[str, str, str]], reward: float
) -> None:
    world = office.Office(_world())
    for to, subject, body in emails:
        world.send_email(to, subject, body)
    assert office.score_office(world).reward == reward


def test_office_tools() -> None:
    world = office.Office(_world())
    listing = world.list_events("alice")
    assert '"Roadmap"' in listing and '"Retro"' not in listing
    assert world.call("send_email", '{"to": "nobody"}').startswith("Error")
    assert world.call("delete_everything", "{}").startswith("Error")
    assert world.tool_errors == 2 and world.outbox == []


# -- the Wordle agents' contract: agent errors score, infrastructure errors fail ------------------

WORDLE_AGENTS = ["agent_openai", "agent_strands", "agent_langgraph"]


def _wordle_agent(name: str) -> ModuleType:
    return agent_openai if name == "agent_openai" else _load(EXAMPLES / "wordle" / f"{name}.py")


def _payload(base_url: str, **task: Any) -> dict[str, Any]:
    return {
        **task,
        "_rollwire": {
            "version": 1,
            "session_id": "s-1",
            "base_url": base_url,
            "api_key": "tok",
            "model": "policy",
            "sampling": {"temperature": 0.3, "max_tokens": 20, "top_k": 5},
            "complete_url": "http://127.0.0.1:9/api/sessions/s-1/complete",
            "deadline": time.time() + 60,
        },
    }


@pytest.mark.parametrize("name", WORDLE_AGENTS)
def test_a_broken_task_scores_no_valid_guess_with_agent_error(name: str) -> None:
    result = _wordle_agent(name).play(_payload("http://127.0.0.1:9/v1"))  # no secret word
    assert result == {"reward": -1.5, "metrics": {"agent_error": 1.0}}


def _unauthorized() -> ServerThread:
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def refuse(request: Any) -> JSONResponse:
        error = {"message": "invalid session token", "type": "authentication_error"}
        return JSONResponse({"error": error}, status_code=401)

    return ServerThread(Starlette(routes=[Route("/{path:path}", refuse, methods=["GET", "POST"])]))


@pytest.mark.parametrize("failure", ["connection refused", "401"])
@pytest.mark.parametrize("name", WORDLE_AGENTS)
def test_an_infrastructure_error_is_raised_not_scored(name: str, failure: str) -> None:
    module = _wordle_agent(name)
    if failure == "401":
        with _unauthorized() as server, pytest.raises(Exception) as info:
            module.play(_payload(f"{server.url}/v1", secret="crane"))
    else:
        with pytest.raises(Exception) as info:
            module.play(_payload("http://127.0.0.1:9/v1", secret="crane"))  # nothing listens
    assert is_infrastructure_error(info.value), repr(info.value)


@pytest.mark.parametrize("name", WORDLE_AGENTS)
def test_an_outage_is_a_failed_rollout_not_a_reward(name: str) -> None:
    module = _wordle_agent(name)
    # the gateway works, but the inference server behind it is gone: every call answers 5xx
    with (
        serve_in_thread(backends=[("http://127.0.0.1:9", "vllm")]) as gateway,
        RolloutClient(gateway, app=module.app, group_size=1, deadline=60) as rc,
    ):
        (group,) = rc.run(make_tasks(1, seed=4))
    (rollout,) = group.rollouts
    assert rollout.status == "failed", (rollout.status, rollout.reward, rollout.metrics)
    assert "agent_error" not in rollout.metrics


def test_the_openai_wordle_agent_sends_the_session_sampling() -> None:
    with RecordingServer() as server:
        result = agent_openai.play(_payload(f"{server.url}/v1", secret="crane"))
    assert result["reward"] == -1.5 and "agent_error" not in result["metrics"]  # it never guessed
    body = server.chat_requests[0].body
    assert body["model"] == "policy"
    assert body["temperature"] == 0.3 and body["max_tokens"] == 20 and body["top_k"] == 5
