"""Drop-in for ``bedrock_agentcore``'s app: ``from rollwire.compat.bedrock_agentcore import
BedrockAgentCoreApp`` instead of ``from bedrock_agentcore import BedrockAgentCoreApp`` (or
``bedrock_agentcore.runtime``).

The app is a :class:`~rollwire.agent.app.RolloutApp` with ``BedrockAgentCoreApp``'s constructor
(``debug``, ``lifespan``, ``middleware``) and ``run(port, host)``. An entrypoint decorated with
SageMaker's ``@sagemaker_rft_handler`` (the real one from ``sagemaker-train``, or
:func:`rollwire.compat.sagemaker.sagemaker_rft_handler`) is called in a rollout with SageMaker's
request, ``{instance, metadata: {job_arn, trajectory_id, endpoint, region}, inferenceParams,
model_name, model_endpoint}`` (the row's keys stay at the top level too, as SageMaker's docs read
``payload["prompt"]``); ``metadata.endpoint + "/v1"`` is the session's OpenAI base URL. Its
``{"reward": float | [float, ...]}`` becomes the reward; ``{"status": "error"}`` or an exception
fails the rollout with reward 0.0.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from rollwire.agent.app import InvocationContext, PingStatus, RolloutApp
from rollwire.agent.context import PAYLOAD_KEY
from rollwire.compat._results import reward_of
from rollwire.compat.sagemaker import MARKER
from rollwire.data.foreign import ListReward, sagemaker_request

__all__ = ["BedrockAgentCoreApp", "PingStatus", "RequestContext", "is_sagemaker_handler"]

#: AgentCore's name for the handler's context.
RequestContext = InvocationContext
PayloadView = Literal["auto", "row", "sagemaker"]


def is_sagemaker_handler(fn: Callable[..., Any]) -> bool:
    """True for a function wrapped by SageMaker's ``sagemaker_rft_handler`` (or rollwire's)."""
    if getattr(fn, MARKER, False):
        return True
    code = getattr(fn, "__code__", None)
    filename = getattr(code, "co_filename", "").replace(os.sep, "/")
    return filename.endswith("sagemaker/train/rft/decorators.py")


class BedrockAgentCoreApp(RolloutApp):
    """``BedrockAgentCoreApp`` that runs RL rollouts; see the module docstring.

    ``payload_view``: ``"auto"`` gives SageMaker's request to ``@sagemaker_rft_handler``
    entrypoints and the payload itself to others; ``"row"`` / ``"sagemaker"`` force one.
    """

    def __init__(
        self,
        debug: bool = False,
        lifespan: Any = None,
        middleware: Sequence[Any] | None = None,
        *,
        payload_view: PayloadView = "auto",
        list_reward: ListReward = "last",
        region: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(debug=debug, lifespan=lifespan, middleware=middleware, **kwargs)
        if payload_view not in ("auto", "row", "sagemaker"):
            raise ValueError(f"payload_view must be auto, row or sagemaker, got {payload_view!r}")
        self.payload_view: PayloadView = payload_view
        self.list_reward: ListReward = list_reward
        self.region = region or os.environ.get("AWS_REGION") or "us-west-2"
        self.handlers: dict[str, Callable[..., Any]] = {}

    def rollout_entrypoint(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Register the entrypoint (``@app.entrypoint``), as ``BedrockAgentCoreApp`` does."""
        super().rollout_entrypoint(fn)
        self.handlers["main"] = fn
        return fn

    entrypoint = rollout_entrypoint

    @property
    def sagemaker(self) -> bool:
        """Whether rollouts call the handler with SageMaker's request."""
        if self.payload_view == "auto":
            return self._handler is not None and is_sagemaker_handler(self._handler)
        return self.payload_view == "sagemaker"

    def view_payload(self, payload: Mapping[str, Any], ctx: InvocationContext) -> Any:
        """SageMaker's request for SageMaker handlers, else the payload as it is."""
        if not self.sagemaker:
            return payload
        return sagemaker_request(payload, payload[PAYLOAD_KEY], region=self.region)

    def read_result(self, result: Any) -> tuple[float, dict[str, float]]:
        """``{"reward": ...}`` or a bare number; SageMaker's ``status: "error"`` fails."""
        return reward_of(result, keys=("reward", "rewards"), list_reward=self.list_reward)

    def run(self, port: int = 8080, host: str | None = None, **uvicorn_kwargs: Any) -> None:  # type: ignore[override]
        """Serve on ``port`` (AgentCore's signature: port first; all interfaces in a container,
        loopback otherwise, as ``BedrockAgentCoreApp`` chooses)."""
        if host is None:
            in_container = os.path.exists("/.dockerenv") or os.environ.get("DOCKER_CONTAINER")
            host = "0.0.0.0" if in_container else "127.0.0.1"
        super().run(host=host, port=port, **uvicorn_kwargs)
