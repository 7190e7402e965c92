"""The agents of the two AgentCore RL guides and SageMaker's, written as the guides show, run under
rollwire with only the import of their app changed: RolloutApp over HTTP, a real gateway and the
scripted embedded engine. Each rollout gets the guide's reward and its two model calls."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("agentcore_rl_toolkit", reason="the toolkit needs Python 3.11+")

from rollwire.agent.app import SESSION_HEADER
from rollwire.agent.serving import ServerThread
from rollwire.testing.recording import CompleteRecorder
from rollwire.trainer.client import RolloutClient

from .dropin import TASKS, load_agent, math_script, with_import

GEN1 = {
    "from agentcore_rl_toolkit import AgentCoreRLApp": (
        "from rollwire.compat.agentcore_rl_toolkit import AgentCoreRLApp"
    )
}
GEN2 = {
    "from agentcore_rl_toolkit import AgentCoreRuntimeApp": (
        "from rollwire.compat.agentcore_rl_toolkit import AgentCoreRuntimeApp"
    )
}
SAGEMAKER_APP = {
    "from bedrock_agentcore import BedrockAgentCoreApp": (
        "from rollwire.compat.bedrock_agentcore import BedrockAgentCoreApp"
    )
}
# without sagemaker-train installed, its three imports come from rollwire.compat.sagemaker too
SAGEMAKER_ALL = {
    **SAGEMAKER_APP,
    "from sagemaker.core.token_generator import generate_token": (
        "from rollwire.compat.sagemaker import generate_token"
    ),
    "from sagemaker.train.rft import sagemaker_rft_handler": (
        "from rollwire.compat.sagemaker import sagemaker_rft_handler"
    ),
    "from sagemaker.train.rft.adapters.strands import wrap_model": (
        "from rollwire.compat.sagemaker import wrap_model"
    ),
}


@pytest.fixture(scope="module")
def gateway() -> Iterator[Any]:
    from rollwire.engine import EmbeddedEngine, EngineConfig
    from rollwire.gateway import serve_in_thread

    with (
        EmbeddedEngine(EngineConfig(scripted=math_script)) as engine,
        serve_in_thread(backends=[(engine.url, "vllm")]) as gw,
    ):
        yield gw


@pytest.fixture(autouse=True)
def _aws_region(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")


def _run(gateway: Any, app: Any) -> list[Any]:
    with (
        ServerThread(app) as server,
        RolloutClient(gateway, runner=f"http:{server.url}", group_size=2, deadline=120) as client,
    ):
        groups = client.run(TASKS)
    return [r for g in groups for r in g.rollouts]


def _check(rollouts: list[Any]) -> None:
    assert [r.status for r in rollouts] == ["completed"] * 4, [r.error for r in rollouts]
    assert [r.reward for r in rollouts] == [1.0, 1.0, 0.0, 0.0]
    for r in rollouts:
        assert len(r.calls) == 2  # the calculator call, then the answer
        assert '"calculator"' in json.dumps(r.calls[0].response)
        assert "#### 395" in json.dumps(r.calls[1].response)
        assert r.calls[1].completion_ids.size > 0 and r.calls[1].logprobs.size > 0


@pytest.mark.parametrize(
    ("name", "changes"),
    [("gen1_rl_app.py", GEN1), ("gen2_http_app.py", GEN2), ("sagemaker_app.py", SAGEMAKER_ALL)],
    ids=["toolkit-gen1", "toolkit-gen2", "sagemaker"],
)
def test_guide_agent_runs_with_only_its_import_changed(
    tmp_path: Path, gateway: Any, name: str, changes: dict[str, str]
) -> None:
    module = load_agent(with_import(tmp_path, name, changes), name)
    _check(_run(gateway, module.app))


def test_gen1_answers_like_the_toolkit_and_fails_when_the_model_is_unreachable(
    tmp_path: Path, recorder: CompleteRecorder
) -> None:
    module = load_agent(with_import(tmp_path, "gen1_rl_app.py", GEN1), "gen1_rl_app.py")
    payload = recorder.payload("g1", prompt="What is 1 + 1?", answer="2")
    with ServerThread(module.app) as server:
        answer = httpx.post(
            f"{server.url}/invocations", json=payload, headers={SESSION_HEADER: "g1-runtime"}
        ).json()
        record = recorder.wait_for("g1")[0]
    assert answer == {
        "status": "processing",
        "s3_bucket": "rollwire",
        "result_key": "tok-g1/t/g1-runtime.json",
    }
    assert record["status"] == "failed" and "Connection" in record["error"]


def test_gen2_answers_a_start_envelope_with_its_invocation_state(
    tmp_path: Path, recorder: CompleteRecorder
) -> None:
    module = load_agent(with_import(tmp_path, "gen2_http_app.py", GEN2), "gen2_http_app.py")
    payload = recorder.payload("g2", prompt="What is 1 + 1?", answer="2")
    payload["_agentcore_runtime"] = {"version": 1, "operation": "start", "invocation_id": "inv1"}
    with ServerThread(module.app) as server:
        answer = httpx.post(f"{server.url}/invocations", json=payload).json()
        recorder.wait_for("g2")
    assert answer == {"version": 1, "invocation_id": "inv1", "status": "in_progress"}


def test_gen2_production_invocations_follow_the_start_get_protocol() -> None:
    import threading
    import time

    from rollwire.compat.agentcore_rl_toolkit import AgentCoreRuntimeApp

    app = AgentCoreRuntimeApp()
    release = threading.Event()

    @app.entrypoint
    def handler(payload: dict[str, Any], context: Any) -> dict[str, Any]:
        if payload.get("wait"):
            release.wait(60)
        if payload.get("boom"):
            raise ValueError("bad task")
        return {"echo": payload["q"], "model": context.config.get("model_id")}

    def call(body: dict[str, Any]) -> Any:
        return httpx.post(f"{server.url}/invocations", json=body, timeout=20).json()

    def envelope(op: str, iid: str, **kw: Any) -> dict[str, Any]:
        return {"version": 1, "operation": op, "invocation_id": iid, **kw}

    with ServerThread(app) as server:
        assert call({"q": 1}) == {"echo": 1, "model": None}  # no envelope: as BedrockAgentCoreApp
        done = call(
            {"q": 2, "_config": {"model_id": "m"}, "_agentcore_runtime": envelope("start", "a1")}
        )
        assert done == {
            "version": 1,
            "invocation_id": "a1",
            "status": "completed",
            "result": {"echo": 2, "model": "m"},
        }
        started = call(
            {"q": 3, "wait": True, "_agentcore_runtime": envelope("start", "b2", background=True)}
        )
        assert started["status"] == "in_progress"
        assert call({"_agentcore_runtime": envelope("get", "b2")})["status"] == "in_progress"
        release.set()
        give_up = time.monotonic() + 60
        while time.monotonic() < give_up:
            state = call({"_agentcore_runtime": envelope("get", "b2")})
            if state["status"] != "in_progress":
                break
            threading.Event().wait(0.02)
        assert state["status"] == "completed" and state["result"]["echo"] == 3
        failed = call({"q": 4, "boom": True, "_agentcore_runtime": envelope("start", "c3")})
        assert failed["status"] == "completed" and failed["error"] == "bad task"
        assert call({"_agentcore_runtime": envelope("get", "zz")})["status"] == "not_found"
        again = call({"q": 9, "_agentcore_runtime": envelope("start", "a1")})  # not run twice
        assert again["result"] == {"echo": 2, "model": "m"}
