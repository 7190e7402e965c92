"""The environment standards' rollout apps without their frameworks: how a task becomes the
request, how a result becomes the reward, and rollwire's NeMo Gym model server routing each
request to its rollout session (against a stand-in gateway on loopback). The frameworks
themselves run in tests/hubs (.venv-hubs)."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from rollwire.agent.context import RolloutContext
from rollwire.agent.serving import ServerThread, free_port
from rollwire.envs.hubs import nemo_gym, openenv, verifiers_env
from rollwire.envs.hubs.episode import episode_result, import_framework
from rollwire.envs.hubs.nemo_gym_model import SESSION_METADATA_KEY, SessionModelServer


def test_a_nemo_gym_row_goes_to_run_without_rollwires_keys_and_with_the_session() -> None:
    task = {
        "_rollwire": {"api_key": "secret"},
        "agent_url": "http://agent",
        "task_id": "t0",
        "responses_create_params": {"input": "hi", "metadata": {"kept": "1"}},
        "box": "C",
    }
    row = nemo_gym.run_request(task, {SESSION_METADATA_KEY: "s1"})
    metadata = {"kept": "1", "rollwire_session_id": "s1"}
    assert row == {"responses_create_params": {"input": "hi", "metadata": metadata}, "box": "C"}
    with pytest.raises(ValueError, match="responses_create_params"):
        nemo_gym.run_request({"box": "C"}, {})


def test_verify_gives_the_reward_and_its_own_numbers_as_metrics() -> None:
    row = {"responses_create_params": {}, "code": 482}
    answer = {
        **row,
        "response": {"output": [{"type": "function_call"}, {"type": "message"}]},
        "reward": 1.2,
        "read_right_box": True,
        "note": "text is not a metric",
    }
    result = nemo_gym.verify_result(answer, row)
    assert result == {"reward": 1.2, "metrics": {"read_right_box": 1.0, "tool_calls": 1.0}}
    with pytest.raises(RuntimeError, match="no 'reward'"):
        nemo_gym.verify_result({"response": {}}, row)


def test_per_turn_rewards_become_step_reward_metrics() -> None:
    assert episode_result(1.2, {"turns": 2.0}, [0.2, 1.0]) == {
        "reward": 1.2,
        "metrics": {"turns": 2.0, "step_reward/0": 0.2, "step_reward/1": 1.0},
    }


def test_a_missing_framework_names_the_package_to_install() -> None:
    with pytest.raises(ImportError, match="pip install 'no-such-dist>=1'"):
        import_framework("no_such_framework_module", "no-such-dist>=1")


def test_an_openenv_task_says_what_it_lacks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROLLWIRE_OPENENV_URL", raising=False)
    with pytest.raises(ValueError, match=r"no 'env_url'.*ROLLWIRE_OPENENV_URL"):
        openenv.Episode.from_task({"prompt": "Open box A."})
    monkeypatch.setenv("ROLLWIRE_OPENENV_URL", "http://env")
    episode = openenv.Episode.from_task({"prompt": "p", "reset": {"box": "A"}, "max_turns": 2})
    assert (episode.env_url, episode.reset, episode.max_turns) == ("http://env", {"box": "A"}, 2)


def test_openenv_tools_and_results_as_the_policy_sees_them() -> None:
    tool = SimpleNamespace(name="read_code", description="Read.", input_schema={"type": "object"})
    assert openenv.openai_tool(tool) == {
        "type": "function",
        "function": {"name": "read_code", "description": "Read.", "parameters": {"type": "object"}},
    }
    text = {"content": [{"type": "text", "text": "Box A's code is 1."}]}
    assert openenv.result_text(SimpleNamespace(error=None, result=text)) == "Box A's code is 1."
    assert openenv.result_text(SimpleNamespace(error=None, result={"data": 7})) == "7"
    error = SimpleNamespace(message="unknown tool")
    assert openenv.result_text(SimpleNamespace(error=error, result=None)) == "error: unknown tool"


def _trace(**over: Any) -> Any:
    reward = SimpleNamespace(score=1.0)
    fields = {
        "errors": [],
        "ok": True,
        "metrics": {"reads": 1.0, "unscored": None},
        "rewards": {"opened": reward, "skipped": None},
        "num_turns": 3,
        "reward": 1.0,
    }
    return SimpleNamespace(**{**fields, **over})


def test_a_verifiers_trace_gives_its_reward_and_each_score() -> None:
    assert verifiers_env.trace_result(_trace()) == {
        "reward": 1.0,
        "metrics": {"reads": 1.0, "reward/opened": 1.0, "turns": 3.0},
    }
    failed = _trace(errors=[SimpleNamespace(message="provider unreachable")], ok=False)
    with pytest.raises(RuntimeError, match="provider unreachable"):
        verifiers_env.trace_result(failed)


@pytest.fixture
def gateway() -> Iterator[dict[str, Any]]:
    """A stand-in for the gateway's data plane: records what reaches ``/s/tok/v1/...``."""
    seen: dict[str, Any] = {}

    async def answer(request: Request) -> JSONResponse:
        seen["path"] = request.url.path
        seen["auth"] = request.headers.get("authorization")
        seen["body"] = await request.json()
        return JSONResponse({"id": "resp_1", "output": []})

    app = Starlette(routes=[Route("/s/tok/v1/{rest:path}", answer, methods=["POST"])])
    with ServerThread(app) as server:
        seen["url"] = server.url
        yield seen


def test_the_model_server_forwards_each_request_to_its_session(gateway: dict[str, Any]) -> None:
    ctx = RolloutContext(
        session_id="s1",
        base_url=f"{gateway['url']}/s/tok/v1",
        api_key="tok",
        complete_url="http://unused",
        model="policy",
    )
    server = SessionModelServer()
    port = free_port()
    server.start("127.0.0.1", port)
    try:
        url = f"http://127.0.0.1:{port}/v1/responses"
        with server.session(ctx) as metadata:
            body = {"model": "gpt-x", "input": "hi", "metadata": {**metadata, "kept": "1"}}
            answer = httpx.post(url, json=body)
        assert answer.status_code == 200 and answer.json()["id"] == "resp_1"
        assert gateway["path"] == "/s/tok/v1/responses" and gateway["auth"] == "Bearer tok"
        assert gateway["body"] == {"model": "policy", "input": "hi", "metadata": {"kept": "1"}}
        # once the rollout is over, its session is no longer served
        late = httpx.post(url, json={"input": "hi", "metadata": metadata})
        assert late.status_code == 400 and "no live rollout session 's1'" in late.text
        server.start("127.0.0.1", port)  # starting again at the same address is a no-op
        with pytest.raises(RuntimeError, match="already serves"):
            server.start("127.0.0.1", free_port())
    finally:
        server.stop()
