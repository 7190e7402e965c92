"""The same guide agents, unchanged, under the real packages' apps: the toolkit's gen-2
``AgentCoreRuntimeApp``, and SageMaker's ``@sagemaker_rft_handler`` under the real
``BedrockAgentCoreApp`` (its feedback posts reach the gateway's SageMaker routes). The SageMaker
agent also runs with only its app's import changed and SageMaker's decorator left in place.

``sagemaker-train`` is heavy (MLflow & co.), so it is kept out of the workspace: ``.ci/run``
installs it (no dependencies) into ``.venv-sagemaker``, which only the agent processes of these
tests put on their ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollwire.agent.app import SESSION_HEADER
from rollwire.data.foreign import runtime_config, sagemaker_request
from rollwire.trainer.client import RolloutClient
from rollwire.trainer.gateway_client import GatewayClient

from .dropin import AGENTS, FAKE_AWS, TASKS, AgentProcess, math_script, with_import

pytest.importorskip("agentcore_rl_toolkit", reason="the toolkit needs Python 3.11+")

SAGEMAKER_SITE = Path(__file__).resolve().parents[2] / ".venv-sagemaker"


@pytest.fixture(scope="module")
def gateway() -> Iterator[Any]:
    from rollwire.engine import EmbeddedEngine, EngineConfig
    from rollwire.gateway import serve_in_thread

    with (
        EmbeddedEngine(EngineConfig(scripted=math_script)) as engine,
        serve_in_thread(backends=[(engine.url, "vllm")]) as gw,
    ):
        yield gw


@pytest.fixture
def sagemaker_env() -> dict[str, str]:
    if not (SAGEMAKER_SITE / "sagemaker" / "train" / "rft").is_dir():
        if os.environ.get("ROLLWIRE_REQUIRE_SAGEMAKER"):
            pytest.fail(f"sagemaker-train is not installed in {SAGEMAKER_SITE} (see .ci/run)")
        pytest.skip(
            f"needs sagemaker-train in {SAGEMAKER_SITE}: install it with the `uv pip install "
            "--target .venv-sagemaker` line of .ci/run"
        )
    path = os.pathsep.join(p for p in (str(SAGEMAKER_SITE), os.environ.get("PYTHONPATH")) if p)
    return {**FAKE_AWS, "PYTHONPATH": path}


def _rollwire_view(handle: Any, task: dict[str, Any]) -> dict[str, Any]:
    return {
        "session_id": handle.session_id,
        "base_url": handle.base_url,
        "api_key": handle.token,
        "model": "policy",
        "sampling": {"temperature": 1.0, "max_tokens": 256},
        "group_id": "g",
        "task_id": task["id"],
    }


def test_gen2_agent_unchanged_under_the_real_runtime_app(gateway: Any) -> None:
    task = TASKS[0]
    with (
        AgentProcess(AGENTS, "gen2_http_app:app", FAKE_AWS) as agent,
        GatewayClient(gateway.url, gateway.admin_key) as control,
    ):
        handle = control.create_session(group_id="g", task_id=task["id"])
        body = {
            **task,
            "_config": runtime_config(_rollwire_view(handle, task)),
            # the real app keeps finished invocations on disk: a fresh id, or it answers from there
            "_agentcore_runtime": {
                "version": 1,
                "operation": "start",
                "invocation_id": uuid.uuid4().hex,
            },
        }
        headers = {SESSION_HEADER: handle.session_id}
        answer = httpx.post(
            f"{agent.url}/invocations", json=body, headers=headers, timeout=120
        ).json()
        calls = control.calls(handle.session_id)
    assert answer["status"] == "completed" and answer["result"] == {"reward": 1.0}, answer
    assert len(calls) == 2


def test_sagemaker_agent_unchanged_under_the_real_app_reports_to_the_gateway(
    gateway: Any, sagemaker_env: dict[str, str]
) -> None:
    task = TASKS[0]
    with (
        AgentProcess(AGENTS, "sagemaker_app:app", sagemaker_env) as agent,
        GatewayClient(gateway.url, gateway.admin_key) as control,
    ):
        handle = control.create_session(group_id="g", task_id=task["id"])
        request = sagemaker_request(task, _rollwire_view(handle, task))
        answer = httpx.post(f"{agent.url}/invocations", json=request, timeout=120).json()
        rollout = control.rollout(handle.session_id)
    assert answer == {"reward": 1.0}
    # the real decorator posted /complete-rollout and /update-reward to {endpoint}
    assert rollout.status == "completed" and rollout.reward == 1.0
    assert len(rollout.calls) == 2


def test_sagemaker_agent_with_only_its_app_import_changed_keeps_sagemakers_decorator(
    tmp_path: Path, gateway: Any, sagemaker_env: dict[str, str]
) -> None:
    folder = with_import(
        tmp_path,
        "sagemaker_app.py",
        {
            "from bedrock_agentcore import BedrockAgentCoreApp": (
                "from rollwire.compat.bedrock_agentcore import BedrockAgentCoreApp"
            )
        },
    )
    with (
        AgentProcess(folder, "sagemaker_app:app", sagemaker_env) as agent,
        RolloutClient(gateway, runner=f"http:{agent.url}", group_size=2, deadline=120) as client,
    ):
        groups = client.run(TASKS)
    rollouts = [r for g in groups for r in g.rollouts]
    assert [r.status for r in rollouts] == ["completed"] * 4, [r.error for r in rollouts]
    assert [r.reward for r in rollouts] == [1.0, 1.0, 0.0, 0.0]
    assert all(len(r.calls) == 2 for r in rollouts)


CUSTOM = "sagemaker_custom_agent.py"
CUSTOM_COMPAT = {
    "from sagemaker.core.token_generator import generate_token": (
        "from rollwire.compat.sagemaker import generate_token"
    ),
    "from sagemaker.train.rft import sagemaker_rft_handler": (
        "from rollwire.compat.sagemaker import sagemaker_rft_handler"
    ),
    "from sagemaker.train.rft.headers import make_inference_headers": (
        "from rollwire.compat.sagemaker import make_inference_headers"
    ),
}


def _run_custom(gateway: Any, folder: Path, env: dict[str, str]) -> list[Any]:
    from rollwire.trainer.runners.sagemaker import SageMakerRunner

    with AgentProcess(folder, "sagemaker_custom_agent:app", env, ready="/health") as agent:
        runner = SageMakerRunner(agent.url)
        with RolloutClient(
            gateway, runner=runner, group_size=2, deadline=120, sampling={"max_tokens": 64}
        ) as client:
            groups = client.run(TASKS)
    return [r for g in groups for r in g.rollouts]


def _check_custom(rollouts: list[Any]) -> None:
    assert [r.status for r in rollouts] == ["completed"] * 4, [r.error for r in rollouts]
    assert [r.reward for r in rollouts] == [1.0, 1.0, 0.0, 0.0]
    assert all(len(r.calls) == 1 for r in rollouts)


def test_sagemaker_runner_drives_the_custom_agent_with_sagemakers_decorator(
    gateway: Any, sagemaker_env: dict[str, str]
) -> None:
    _check_custom(_run_custom(gateway, AGENTS, sagemaker_env))


def test_sagemaker_runner_drives_the_custom_agent_on_rollwires_stand_in(
    tmp_path: Path, gateway: Any
) -> None:
    folder = with_import(tmp_path, CUSTOM, CUSTOM_COMPAT)
    _check_custom(_run_custom(gateway, folder, FAKE_AWS))
