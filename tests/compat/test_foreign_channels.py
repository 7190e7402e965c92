"""Result channels for unmodified containers: agentcore-rl-toolkit's S3 result ``PUT`` and
SageMaker's ``/complete-rollout`` + ``/update-reward``, each ending in the session's terminal
record on the gateway; and the real toolkit app, served with uvicorn, driven by rollwire."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from rollwire.trainer.client import RolloutClient
from rollwire.trainer.gateway_client import GatewayClient

from .dropin import AGENTS, FAKE_AWS, TASKS, AgentProcess, math_script


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
def control(gateway: Any) -> Iterator[GatewayClient]:
    with GatewayClient(gateway.url, gateway.admin_key) as client:
        yield client


def _session(control: GatewayClient) -> Any:
    return control.create_session(group_id="g", task_id="t")


def test_sagemaker_feedback_completes_the_session_with_per_turn_rewards(
    gateway: Any, control: GatewayClient
) -> None:
    handle = _session(control)
    endpoint = f"{gateway.url}/s/{handle.token}"
    ids = {"JobArn": "arn:aws:sagemaker:us-west-2:0:job/x", "TrajectoryId": handle.session_id}
    r1 = httpx.post(f"{endpoint}/complete-rollout", json={**ids, "Status": "ready"}, timeout=30)
    assert r1.status_code == 200, r1.text
    r2 = httpx.post(
        f"{endpoint}/update-reward", json={**ids, "Rewards": [0.2, 0.5, 1.0]}, timeout=30
    )
    assert r2.status_code == 200, r2.text
    rollout = control.rollout(handle.session_id)
    assert rollout.status == "completed" and rollout.reward == 1.0
    steps = {"step_reward/0": 0.2, "step_reward/1": 0.5, "step_reward/2": 1.0}
    assert rollout.metrics == {**steps, "step_rewards_dropped": 3.0}  # no calls to carry them


def test_sagemaker_failed_status_fails_the_session_and_ids_are_checked(
    gateway: Any, control: GatewayClient
) -> None:
    handle = _session(control)
    endpoint = f"{gateway.url}/s/{handle.token}"
    other = httpx.post(
        f"{endpoint}/update-reward", json={"TrajectoryId": "other", "Rewards": 1}, timeout=30
    )
    assert other.status_code == 400 and "not this session" in other.text
    forged = httpx.post(
        f"{gateway.url}/s/forged.1.x/complete-rollout", json={"Status": "ready"}, timeout=30
    )
    assert forged.status_code == 401
    ids = {"TrajectoryId": handle.session_id}
    httpx.post(f"{endpoint}/complete-rollout", json={**ids, "Status": "failed"}, timeout=30)
    httpx.post(f"{endpoint}/update-reward", json={**ids, "Rewards": [0.0]}, timeout=30)
    rollout = control.rollout(handle.session_id)
    assert rollout.status == "failed" and rollout.reward == 0.0 and "failed" in rollout.error


@pytest.mark.parametrize(
    ("result", "status", "reward"),
    [
        ({"rewards": [0.0, 1.0], "status_code": 200, "stop_reason": "end_turn"}, "completed", 1.0),
        ({"rewards": 0.5}, "completed", 0.5),
        ({"status_code": 500, "stop_reason": "boom", "traceback": "..."}, "failed", 0.0),
        ({"status_code": 200, "answer": "no reward"}, "failed", 0.0),
    ],
)
def test_s3_put_of_a_toolkit_result_is_the_sessions_record(
    gateway: Any, control: GatewayClient, result: dict[str, Any], status: str, reward: float
) -> None:
    boto3 = pytest.importorskip("boto3")
    from botocore.config import Config

    handle = _session(control)
    s3 = boto3.client(
        "s3",
        endpoint_url=gateway.url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-west-2",
        config=Config(retries={"max_attempts": 1}),
    )
    key = f"{handle.token}/t/{handle.session_id}.json"
    answer = s3.put_object(Bucket="rollwire", Key=key, Body=json.dumps(result))
    assert answer["ResponseMetadata"]["HTTPStatusCode"] == 200 and answer["ETag"]
    rollout = control.rollout(handle.session_id)
    assert (rollout.status, rollout.reward) == (status, reward), rollout.error
    if status == "failed":
        assert rollout.error


def test_s3_put_needs_the_session_token_in_the_key(gateway: Any) -> None:
    resp = httpx.put(
        f"{gateway.url}/bucket/not-a-token/t/s.json", content=b'{"rewards": 1}', timeout=30
    )
    assert resp.status_code == 401 and "session token" in resp.text


def test_unmodified_toolkit_container_reports_through_the_gateways_s3_route(
    gateway: Any,
) -> None:
    pytest.importorskip("agentcore_rl_toolkit", reason="the toolkit needs Python 3.11+")
    env = {**FAKE_AWS, "AWS_ENDPOINT_URL_S3": gateway.url}
    with (
        AgentProcess(AGENTS, "gen1_rl_app:app", env) as agent,
        RolloutClient(
            gateway,
            runner=f"http:{agent.url}",
            group_size=2,
            deadline=120,
            payload_format="agentcore-rl-toolkit",
        ) as client,
    ):
        groups = client.run(TASKS)
    rollouts = [r for g in groups for r in g.rollouts]
    assert [r.status for r in rollouts] == ["completed"] * 4, [r.error for r in rollouts]
    assert [r.reward for r in rollouts] == [1.0, 1.0, 0.0, 0.0]
    assert all(len(r.calls) == 2 for r in rollouts)


@pytest.fixture
def moto_s3() -> Iterator[str]:
    pytest.importorskip("moto")
    from moto.server import ThreadedMotoServer

    from rollwire.agent.serving import free_port

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def test_unmodified_toolkit_container_via_a_real_s3_bucket_and_the_polling_runner(
    gateway: Any, moto_s3: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("agentcore_rl_toolkit", reason="the toolkit needs Python 3.11+")
    import boto3

    from rollwire.trainer.runners import HttpRunner
    from rollwire.trainer.runners.s3 import S3ResultRunner

    for k, v in FAKE_AWS.items():
        monkeypatch.setenv(k, v)
    s3 = boto3.client("s3", endpoint_url=moto_s3)
    s3.create_bucket(
        Bucket="rl-results", CreateBucketConfiguration={"LocationConstraint": "us-west-2"}
    )
    env = {**FAKE_AWS, "AWS_ENDPOINT_URL_S3": moto_s3}
    with AgentProcess(AGENTS, "gen1_rl_app:app", env) as agent:
        runner = S3ResultRunner(HttpRunner([agent.url]), "rl-results", s3=s3, poll_interval=0.2)
        with RolloutClient(
            gateway,
            runner=runner,
            group_size=2,
            deadline=120,
            payload_format="agentcore-rl-toolkit",
        ) as client:
            groups = client.run(TASKS)
    rollouts = [r for g in groups for r in g.rollouts]
    assert [r.status for r in rollouts] == ["completed"] * 4, [r.error for r in rollouts]
    assert [r.reward for r in rollouts] == [1.0, 1.0, 0.0, 0.0]
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="rl-results")["Contents"]]
    assert len(keys) == 4 and all(k.endswith(".json") for k in keys)  # the results stayed in S3
    saved = json.loads(s3.get_object(Bucket="rl-results", Key=keys[0])["Body"].read())
    assert saved["status_code"] == 200 and saved["rewards"] in (0.0, 1.0)
