"""A NeMo Gym environment as a rollwire task: ``rollwire.envs.hubs.nemo_gym:app``.

A task is a NeMo Gym dataset row (``responses_create_params`` and the fields its resources
server's ``verify`` reads) plus the agent server to run it on::

    {"agent_url": "http://127.0.0.1:11002",
     "responses_create_params": {"input": [...], "tools": [...]}, "box": "C", "code": 482}

One rollout is one ``POST {agent_url}/run`` with the row, as NeMo Gym's own rollout collection
sends it: the agent seeds its resources server's session, calls its model server and the tools
until it is done, and returns ``verify``'s answer. Its ``reward`` is the rollout's reward; the
other numbers of the answer are metrics. The model server the agent is configured with is rollwire
(:class:`~rollwire.envs.hubs.nemo_gym_model.SessionModelServer`, started in this process at
``ROLLWIRE_NEMO_GYM_MODEL``, default ``127.0.0.1:11010``): the row's
``responses_create_params.metadata`` carries the rollout's session id, and each model call is
forwarded to that session, so rollwire captures every call of the episode. NeMo Gym's own episode
(the session its servers keep in a cookie for one ``/run``) is this one rollout session. Needs no
NeMo Gym package here: everything is HTTP.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import httpx

from rollwire.agent.app import RolloutApp
from rollwire.agent.context import rollout_context
from rollwire.envs.hubs.episode import episode_result, number_metrics, task_field
from rollwire.envs.hubs.nemo_gym_model import SessionModelServer

__all__ = ["MODEL_ENV", "app", "model_server", "play", "run_request", "verify_result"]

#: ``host:port`` of the model server that the NeMo Gym config names for the policy
MODEL_ENV = "ROLLWIRE_NEMO_GYM_MODEL"
DEFAULT_MODEL_ADDRESS = "127.0.0.1:11010"
#: task keys that are rollwire's, not the row's
_OWN_KEYS = ("agent_url", "task_id")

app = RolloutApp(failure_reward=0.0)
model_server = SessionModelServer()


def _model_address() -> tuple[str, int]:
    raw = os.environ.get(MODEL_ENV) or DEFAULT_MODEL_ADDRESS
    host, sep, port = raw.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{MODEL_ENV} must be host:port (the policy's model server), got {raw!r}")
    return host, int(port)


def run_request(task: dict[str, Any], metadata: dict[str, str]) -> dict[str, Any]:
    """The ``/run`` body of ``task``: the row without rollwire's keys, ``metadata`` added to its
    ``responses_create_params``."""
    row = {k: v for k, v in task.items() if not k.startswith("_") and k not in _OWN_KEYS}
    params = row.get("responses_create_params")
    if not isinstance(params, dict):
        raise ValueError(
            "a NeMo Gym task needs 'responses_create_params' (an object with 'input'), as in "
            f"NeMo Gym's dataset rows; got {params!r}"
        )
    row["responses_create_params"] = {
        **params,
        "metadata": {**(params.get("metadata") or {}), **metadata},
    }
    return row


def verify_result(answer: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """``/run``'s answer (``verify``'s) as the terminal record: its ``reward``, and as metrics
    the numbers ``verify`` added to the row, and the tool calls of the response."""
    if "reward" not in answer:
        raise RuntimeError(f"the agent's /run answer has no 'reward': {sorted(answer)}")
    skip = {"reward", "responses_create_params", "response", *row}
    metrics = number_metrics({k: v for k, v in answer.items() if k not in skip})
    response = answer.get("response") or {}
    outputs = response.get("output") or [] if isinstance(response, dict) else []
    metrics["tool_calls"] = float(sum(1 for o in outputs if o.get("type") == "function_call"))
    return episode_result(float(answer["reward"]), metrics)


@app.rollout_entrypoint
async def play(payload: dict[str, Any]) -> dict[str, Any]:
    """One NeMo Gym ``/run``: ``{"reward", "metrics": {"tool_calls", ...verify's numbers}}``."""
    ctx = rollout_context(payload)
    if ctx is None:
        raise ValueError("a NeMo Gym task runs as a rollout: the payload has no '_rollwire'")
    agent_url = str(task_field(payload, "agent_url", "ROLLWIRE_NEMO_GYM_AGENT_URL")).rstrip("/")
    await asyncio.to_thread(model_server.start, *_model_address())
    with model_server.session(ctx) as metadata:
        body = run_request(payload, metadata)
        async with httpx.AsyncClient(timeout=ctx.call_timeout()) as client:
            answer = await client.post(f"{agent_url}/run", json=body)
    if answer.status_code != 200:
        raise RuntimeError(
            f"the NeMo Gym agent at {agent_url} answered /run with {answer.status_code}: "
            f"{answer.text[:500]}"
        )
    return verify_result(answer.json(), body)
