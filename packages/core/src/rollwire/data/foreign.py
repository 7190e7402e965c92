"""Other frameworks' payloads and results: the views their agents read, and their results read
as rollwire terminal records (pure, no I/O).

agentcore-rl-toolkit's gen-1 apps return ``{"rewards": float | [float, ...]}`` (saved to S3 with
``status_code`` 200, or 500 plus ``stop_reason`` on an exception); its gen-2 apps and
``BedrockAgentCoreApp`` agents return ``{"reward": ...}``; SageMaker's ``sagemaker_rft_handler``
reports ``Rewards`` as a float or a per-turn list, and ``{"status": "error"}`` as a failure. A
per-turn list is kept: each element becomes the metric ``step_reward/<i>`` and, by default, the
last one is the rollout's reward (``list_reward="sum"`` or ``"mean"`` to change that). When the
rollout is assembled, ``rollwire.data.rewards.attach_step_rewards`` gives element ``i`` to the
``i``-th trainable call of the session as ``ModelCall.step_reward``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "PAYLOAD_FORMATS",
    "REWARD_KEYS",
    "RUNTIME_CONFIG_KEY",
    "RUNTIME_ENVELOPE_KEY",
    "S3_BUCKET",
    "STEP_REWARDS_DROPPED",
    "STEP_REWARD_METRIC",
    "TOOLKIT_KEY",
    "ForeignResult",
    "ListReward",
    "PayloadFormat",
    "foreign_payload",
    "read_result",
    "read_s3_result",
    "reduce_rewards",
    "result_key",
    "runtime_config",
    "sagemaker_endpoint",
    "sagemaker_request",
    "step_metrics",
    "step_rewards_of",
    "toolkit_rollout",
]

#: Where the frameworks put the reward: gen-2, AgentCore and SageMaker say ``reward``, gen-1 says
#: ``rewards``.
REWARD_KEYS = ("reward", "rewards")
ListReward = Literal["last", "sum", "mean"]


@dataclass(frozen=True)
class ForeignResult:
    """A result read as a terminal record: ``completed`` with a reward, or ``failed``."""

    status: Literal["completed", "failed"]
    reward: float | None
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    step_rewards: tuple[float, ...] = ()


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number, got {type(value).__name__}: {value!r}")
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"{what} must be finite, got {out}")
    return out


def reduce_rewards(value: Any, list_reward: ListReward = "last") -> tuple[float, tuple[float, ...]]:
    """A reward given as a number or a per-turn list: ``(rollout reward, step rewards)``."""
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        steps = tuple(_number(v, f"reward[{i}]") for i, v in enumerate(value))
        if not steps:
            raise ValueError("the per-turn reward list is empty: there is no reward to train on")
        if list_reward == "sum":
            return math.fsum(steps), steps
        if list_reward == "mean":
            return math.fsum(steps) / len(steps), steps
        return steps[-1], steps
    return _number(value, "reward"), ()


def _metrics(raw: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    if isinstance(raw, Mapping):
        for k, v in raw.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue  # non-numeric metrics are dropped, as rollwire does for its own results
            if math.isfinite(float(v)):
                out[str(k)] = float(v)
    return out


def read_result(
    result: Any,
    *,
    keys: Sequence[str] = REWARD_KEYS,
    list_reward: ListReward = "last",
) -> ForeignResult:
    """Read a handler's return value; raises ``ValueError`` saying what is missing or wrong.

    ``{"status": "error", "error": ...}`` (SageMaker's convention) is a failed rollout; a bare
    number is the reward itself.
    """
    if not isinstance(result, Mapping):
        reward, steps = reduce_rewards(result, list_reward)
        return ForeignResult("completed", reward, step_metrics(steps), step_rewards=steps)
    if result.get("status") == "error":
        message = result.get("error") or result.get("message") or "unknown error"
        return ForeignResult("failed", None, error=f"the agent reported an error: {message}")
    key = next((k for k in keys if k in result), None)
    if key is None:
        raise ValueError(
            f"the result has no reward: expected one of {list(keys)}, got keys {sorted(result)}"
        )
    reward, steps = reduce_rewards(result[key], list_reward)
    metrics = {**_metrics(result.get("metrics")), **step_metrics(steps)}
    return ForeignResult("completed", reward, metrics, step_rewards=steps)


#: A per-turn list's element ``i`` is the rollout metric ``step_reward/<i>``; how many elements
#: had no trainable call to go to is ``step_rewards_dropped``.
STEP_REWARD_METRIC = "step_reward/"
STEP_REWARDS_DROPPED = "step_rewards_dropped"


def step_metrics(steps: Sequence[float]) -> dict[str, float]:
    """A per-turn reward list as the rollout's ``step_reward/<i>`` metrics."""
    return {f"{STEP_REWARD_METRIC}{i}": v for i, v in enumerate(steps)}


def step_rewards_of(metrics: Mapping[str, float]) -> dict[int, float]:
    """The ``step_reward/<i>`` metrics of a rollout, by turn (other metrics are ignored)."""
    out: dict[int, float] = {}
    for key, value in metrics.items():
        tail = key[len(STEP_REWARD_METRIC) :] if key.startswith(STEP_REWARD_METRIC) else ""
        if tail.isdigit():
            out[int(tail)] = float(value)
    return out


def read_s3_result(body: Mapping[str, Any], *, list_reward: ListReward = "last") -> ForeignResult:
    """The JSON an agentcore-rl-toolkit gen-1 app saves to S3, as a terminal record.

    ``status_code`` 200 (or absent) with ``rewards``: completed; anything else, or an error
    result (``stop_reason`` and ``traceback``), is a failed rollout with the toolkit's reason.
    """
    code = body.get("status_code", 200)
    if code != 200:
        reason = body.get("stop_reason") or "no stop_reason"
        return ForeignResult(
            "failed", None, error=f"the agent failed (status_code {code}): {reason}"
        )
    return read_result(body, list_reward=list_reward)


# -- payload views: the keys each framework's agents read ------------------------------------------

#: agentcore-rl-toolkit gen-1's payload key, gen-2's trainer settings, gen-2's protocol envelope.
TOOLKIT_KEY = "_rollout"
RUNTIME_CONFIG_KEY = "_config"
RUNTIME_ENVELOPE_KEY = "_agentcore_runtime"
#: The bucket name rollwire gives gen-1 agents; the gateway's S3 route takes any bucket.
S3_BUCKET = "rollwire"
#: SageMaker's sampling parameters (``inferenceParams``), in the SDK's snake_case.
SAGEMAKER_PARAMS = ("temperature", "max_tokens", "top_p")
_JOB_ARN_PREFIX = "arn:aws:sagemaker:"


def toolkit_rollout(rollwire: Mapping[str, Any]) -> dict[str, Any]:
    """gen-1's ``_rollout`` for a ``_rollwire`` dict.

    ``exp_id`` is the session token, so the result key the app writes
    (``{exp_id}/{input_id}/{session_id}.json``) proves which session it belongs to.
    """
    return {
        "exp_id": str(rollwire["api_key"]),
        "input_id": str(rollwire.get("task_id") or rollwire["session_id"]),
        "s3_bucket": S3_BUCKET,
        "base_url": rollwire["base_url"],
        "model_id": rollwire.get("model") or "policy",
        "sampling_params": dict(rollwire.get("sampling") or {}),
        "api_key": rollwire["api_key"],
    }


def result_key(rollout: Mapping[str, Any], session_id: str) -> str:
    """Where gen-1 saves a rollout's result: ``{exp_id}/{input_id}/{session_id}.json``."""
    return f"{rollout['exp_id']}/{rollout['input_id']}/{session_id}.json"


def runtime_config(rollwire: Mapping[str, Any]) -> dict[str, Any]:
    """gen-2's ``_config``: where the policy is, under the toolkit's names."""
    return {
        "base_url": rollwire["base_url"],
        "model_id": rollwire.get("model") or "policy",
        "api_key": rollwire["api_key"],
        "sampling_params": dict(rollwire.get("sampling") or {}),
    }


def sagemaker_endpoint(base_url: str) -> str:
    """SageMaker's ``metadata.endpoint`` for a session: its agents call ``endpoint + "/v1"``."""
    return base_url[: -len("/v1")] if base_url.endswith("/v1") else base_url


def sagemaker_request(
    task: Mapping[str, Any], rollwire: Mapping[str, Any], *, region: str = "us-west-2"
) -> dict[str, Any]:
    """SageMaker's rollout request for a task: ``{instance, metadata, inferenceParams, ...}``.

    ``metadata.endpoint`` is the session's own gateway prefix, so ``endpoint + "/v1"`` is its
    OpenAI base URL and ``/complete-rollout`` / ``/update-reward`` under it reach its record;
    ``trajectory_id`` is the session id (the ``X-Amzn-SageMaker-Trajectory-Id`` of its calls).
    The task's own keys stay at the top level too, for agents that read ``payload["prompt"]``.
    """
    instance = {k: v for k, v in task.items() if not str(k).startswith("_")}
    group = rollwire.get("group_id") or "run"
    sampling = rollwire.get("sampling") or {}
    return {
        **instance,
        "instance": instance,
        "metadata": {
            "job_arn": f"{_JOB_ARN_PREFIX}{region}:000000000000:job/rollwire/{group}",
            "trajectory_id": str(rollwire["session_id"]),
            "endpoint": sagemaker_endpoint(str(rollwire["base_url"])),
            "region": region,
        },
        "inferenceParams": {k: sampling[k] for k in SAGEMAKER_PARAMS if k in sampling},
        "model_name": rollwire.get("model") or "policy",
        "model_endpoint": str(rollwire["base_url"]),
    }


PayloadFormat = Literal["rollwire", "agentcore-rl-toolkit", "agentcore-runtime"]
PAYLOAD_FORMATS: tuple[str, ...] = ("rollwire", "agentcore-rl-toolkit", "agentcore-runtime")


def foreign_payload(payload: Mapping[str, Any], payload_format: str) -> dict[str, Any]:
    """A rollout payload (row + ``_rollwire``) with the keys an unmodified agent of another
    toolkit reads: gen-1's ``_rollout``, or gen-2's ``_config`` and a background start envelope.
    ``"rollwire"`` adds nothing."""
    if payload_format not in PAYLOAD_FORMATS:
        raise ValueError(
            f"payload_format must be one of {list(PAYLOAD_FORMATS)}, got {payload_format!r}"
        )
    out = dict(payload)
    rollwire = payload["_rollwire"]
    if payload_format == "agentcore-rl-toolkit":
        out[TOOLKIT_KEY] = toolkit_rollout(rollwire)
    elif payload_format == "agentcore-runtime":
        out[RUNTIME_CONFIG_KEY] = runtime_config(rollwire)
        out[RUNTIME_ENVELOPE_KEY] = {
            "version": 1,
            "operation": "start",
            "invocation_id": str(rollwire["session_id"]),
            "background": True,
        }
    return out
