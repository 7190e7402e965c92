"""Drop-in for ``sagemaker.train.rft`` (SageMaker multi-turn RL), for agents without
``sagemaker-train`` installed: ``sagemaker_rft_handler``, the rollout context, the inference
headers, ``wrap_model`` for Strands and ``RolloutFeedbackClient``.

As SageMaker's, the decorator reports the handler's result to ``{metadata.endpoint}``
(``/complete-rollout`` and ``/update-reward``, the gateway's SageMaker routes under rollwire), so
an agent served on its own (``POST /rollout``) needs nothing else. Under
:class:`rollwire.compat.bedrock_agentcore.BedrockAgentCoreApp` the app also posts the same record
(the gateway keeps the first; an identical second one is accepted).
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import Any

__all__ = [
    "MARKER",
    "RolloutFeedbackClient",
    "clear_rollout_context",
    "generate_token",
    "get_inference_headers",
    "get_inference_params",
    "get_rollout_context",
    "make_inference_headers",
    "sagemaker_rft_handler",
    "set_rollout_context",
    "wrap_model",
]

log = logging.getLogger(__name__)

#: Set on a handler decorated by this module's ``sagemaker_rft_handler``.
MARKER = "__rollwire_sagemaker__"
JOB_ARN_HEADER = "X-Amzn-SageMaker-Job-Arn"
TRAJECTORY_HEADER = "X-Amzn-SageMaker-Trajectory-Id"

_metadata: ContextVar[dict[str, Any] | None] = ContextVar("rollwire_sm_metadata", default=None)
_params: ContextVar[dict[str, Any] | None] = ContextVar("rollwire_sm_params", default=None)


def set_rollout_context(
    metadata: Mapping[str, Any], inference_params: Mapping[str, Any] | None = None
) -> None:
    """Store the rollout's metadata and sampling parameters for this thread / task."""
    _metadata.set(dict(metadata))
    _params.set(dict(inference_params) if inference_params else None)


def clear_rollout_context() -> None:
    """Forget the rollout context."""
    _metadata.set(None)
    _params.set(None)


def get_rollout_context() -> dict[str, Any] | None:
    """The metadata set by :func:`set_rollout_context`, or None."""
    return _metadata.get()


def get_inference_params() -> dict[str, Any] | None:
    """The sampling parameters set by :func:`set_rollout_context`, or None."""
    return _params.get()


def make_inference_headers(metadata: Mapping[str, Any]) -> dict[str, str]:
    """``X-Amzn-SageMaker-Job-Arn`` and ``X-Amzn-SageMaker-Trajectory-Id`` for a model call."""
    job = metadata.get("job_arn") or metadata.get("jobArn")
    trajectory = (
        metadata.get("trajectory_id") or metadata.get("trajectoryId") or metadata.get("rolloutId")
    )
    headers: dict[str, str] = {}
    if job:
        headers[JOB_ARN_HEADER] = str(job)
    if trajectory:
        headers[TRAJECTORY_HEADER] = str(trajectory)
    return headers


def get_inference_headers() -> dict[str, str]:
    """The inference headers of the current rollout context (empty outside a rollout)."""
    metadata = _metadata.get()
    return make_inference_headers(metadata) if metadata else {}


def generate_token(region: str | None = None) -> str:
    """A bearer token for the model endpoint. rollwire's gateway identifies the session by the
    endpoint it gave the agent, so any token is accepted; this one needs no AWS credentials."""
    return "rollwire-session"


def _feedback(payload: Mapping[str, Any]) -> RolloutFeedbackClient | None:
    try:
        return RolloutFeedbackClient(payload.get("metadata") or {})
    except ValueError:
        return None  # no endpoint or trajectory: nothing to report to


def _report(feedback: RolloutFeedbackClient | None, result: Any) -> None:
    """Report a handler's result as SageMaker's decorator does (never raises)."""
    if feedback is None or not isinstance(result, Mapping):
        return
    try:
        if result.get("status") == "error":
            feedback.report_error(str(result.get("error") or "unknown error"))
        elif result.get("reward") is not None:
            feedback.report_complete(result["reward"])
        else:
            feedback.complete_rollout()
    except Exception as exc:  # the reward is also the handler's return value: not fatal
        log.warning("could not report the rollout's result to %s: %s", feedback.endpoint, exc)


def _report_error(feedback: RolloutFeedbackClient | None, exc: Exception) -> None:
    if feedback is None:
        return
    try:
        feedback.report_error(f"{type(exc).__name__}: {exc}")
    except Exception as post_exc:
        log.warning("could not report the rollout's failure to %s: %s", feedback.endpoint, post_exc)


def sagemaker_rft_handler(fn: Callable[..., Any]) -> Callable[..., Any]:
    """SageMaker's decorator: set the rollout context (``metadata``, ``inferenceParams``) around
    the handler, then report to ``{metadata.endpoint}``: ``/complete-rollout`` and
    ``/update-reward`` with the returned ``reward``, or a failure (reward 0.0) when the handler
    raises or returns ``{"status": "error"}``. A report that cannot be posted is logged."""

    def enter(payload: Mapping[str, Any]) -> RolloutFeedbackClient | None:
        params = payload.get("inferenceParams") or payload.get("inference_params")
        set_rollout_context(payload.get("metadata") or {}, params)
        return _feedback(payload)

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(payload: dict[str, Any]) -> Any:
            feedback = enter(payload)
            try:
                result = await fn(payload)
            except Exception as exc:
                _report_error(feedback, exc)
                raise
            finally:
                clear_rollout_context()
            _report(feedback, result)
            return result

        setattr(async_wrapper, MARKER, True)
        return async_wrapper

    @functools.wraps(fn)
    def sync_wrapper(payload: dict[str, Any]) -> Any:
        feedback = enter(payload)
        try:
            result = fn(payload)
        except Exception as exc:
            _report_error(feedback, exc)
            raise
        finally:
            clear_rollout_context()
        _report(feedback, result)
        return result

    setattr(sync_wrapper, MARKER, True)
    return sync_wrapper


class RolloutFeedbackClient:
    """Reports a trajectory to ``{metadata.endpoint}``: ``/complete-rollout`` then
    ``/update-reward`` (a float or a per-turn list), as SageMaker's client does."""

    def __init__(self, metadata: Mapping[str, Any], *, timeout: float = 30.0) -> None:
        self.endpoint = str(metadata.get("endpoint") or "").rstrip("/")
        self.job_arn = str(metadata.get("job_arn") or metadata.get("jobArn") or "")
        self.trajectory_id = str(
            metadata.get("trajectory_id") or metadata.get("trajectoryId") or ""
        )
        self.timeout = timeout
        if not self.endpoint or not self.trajectory_id:
            raise ValueError(
                f"metadata needs 'endpoint' and 'trajectory_id' to report a rollout, got {dict(metadata)}"
            )

    def _post(self, path: str, body: dict[str, Any]) -> None:
        import httpx

        resp = httpx.post(f"{self.endpoint}{path}", json=body, timeout=self.timeout)
        if resp.status_code != 200:
            raise RuntimeError(f"{path} answered HTTP {resp.status_code}: {resp.text[:300]}")

    def complete_rollout(self, status: str = "ready") -> None:
        """Mark the trajectory done (``ready``) or ``failed``."""
        self._post(
            "/complete-rollout",
            {"JobArn": self.job_arn, "TrajectoryId": self.trajectory_id, "Status": status},
        )

    def update_reward(self, reward: float | list[float]) -> None:
        """Report the reward: a float or a per-turn list."""
        rewards = [reward] if isinstance(reward, (int, float)) else list(reward)
        self._post(
            "/update-reward",
            {"JobArn": self.job_arn, "TrajectoryId": self.trajectory_id, "Rewards": rewards},
        )

    def report_complete(self, reward: float | list[float]) -> None:
        """``complete_rollout()`` then ``update_reward(reward)``."""
        self.complete_rollout("ready")
        self.update_reward(reward)

    def report_error(self, error: str, reward: float | None = None) -> None:
        """A failed trajectory, with reward 0.0 unless given."""
        log.error("rollout %s failed: %s", self.trajectory_id, error)
        self.complete_rollout("failed")
        self.update_reward(0.0 if reward is None else reward)


class _StrandsModelProxy:
    """A Strands model that adds the rollout's headers and sampling to every ``stream()``."""

    def __init__(self, inner: Any) -> None:
        object.__setattr__(self, "_inner", inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)

    def stream(self, *args: Any, **kwargs: Any) -> Any:
        headers = get_inference_headers()
        client_args = getattr(self._inner, "client_args", None)
        if headers and client_args is not None:
            client_args["default_headers"] = {
                **(client_args.get("default_headers") or {}),
                **headers,
            }
        params = get_inference_params() or {}
        update = {
            snake: params[key]
            for snake, camel in (
                ("temperature", "temperature"),
                ("max_tokens", "maxTokens"),
                ("top_p", "topP"),
            )
            for key in (snake, camel)
            if params.get(key) is not None
        }
        if update:
            merged = {**(self._inner.config.get("params") or {}), **update}
            self._inner.update_config(params=merged)
        return self._inner.stream(*args, **kwargs)


def wrap_model(model: Any) -> Any:
    """Wrap a Strands model so its calls carry the rollout's headers and sampling parameters."""
    return _StrandsModelProxy(model)
