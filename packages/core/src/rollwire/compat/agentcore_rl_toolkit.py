"""Drop-in for ``agentcore_rl_toolkit``: ``from rollwire.compat.agentcore_rl_toolkit import
AgentCoreRLApp, AgentCoreRuntimeApp`` instead of ``from agentcore_rl_toolkit import ...``.

- **gen-1** ``AgentCoreRLApp`` + ``@app.rollout_entrypoint``: the handler reads
  ``payload["_rollout"] = {exp_id, input_id, s3_bucket, base_url, model_id, sampling_params,
  api_key}`` and returns ``{"rewards": float | [float, ...]}``; the invocation answers
  ``{"status": "processing", "s3_bucket", "result_key"}`` at once, as the toolkit does. Nothing is
  written to S3: the reward goes to the rollout's terminal record.
- **gen-2** ``AgentCoreRuntimeApp`` + ``@app.entrypoint``: the handler reads
  ``payload["_config"] = {base_url, model_id, api_key, sampling_params}`` (also as
  ``context.config``) and returns ``{"reward": ...}`` (``rewards`` is accepted too, as the
  toolkit's README still says); an ``_agentcore_runtime`` start envelope is answered with the
  invocation's ``in_progress`` state.

A per-turn reward list is kept (``step_reward/<i>`` metrics); its last element is the rollout's
reward unless ``list_reward="sum"`` or ``"mean"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rollwire.agent.app import InvocationContext, RolloutApp
from rollwire.agent.context import PAYLOAD_KEY
from rollwire.agent.handlers import InvalidReward
from rollwire.compat._results import reward_of
from rollwire.data.foreign import (
    RUNTIME_CONFIG_KEY,
    RUNTIME_ENVELOPE_KEY,
    TOOLKIT_KEY,
    ListReward,
    result_key,
    runtime_config,
    toolkit_rollout,
)

__all__ = ["AgentCoreRLApp", "AgentCoreRuntimeApp", "RewardFunction", "RuntimeContext"]


class RewardFunction:
    """The toolkit's reward-function base: subclasses implement ``__call__(**kwargs)`` and
    return a float or a per-turn list of floats."""

    def __call__(self, **kwargs: Any) -> float | list[float]:
        raise NotImplementedError(f"{type(self).__name__} must implement __call__(**kwargs)")


class AgentCoreRLApp(RolloutApp):
    """gen-1 ``AgentCoreRLApp``: ``@app.rollout_entrypoint`` handlers read ``_rollout``."""

    def __init__(self, *, list_reward: ListReward = "last", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.list_reward: ListReward = list_reward

    def _rollout_of(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        given = payload.get(TOOLKIT_KEY)  # a trainer that already speaks the toolkit's payload
        return dict(given) if isinstance(given, Mapping) else toolkit_rollout(payload[PAYLOAD_KEY])

    def view_payload(self, payload: Mapping[str, Any], ctx: InvocationContext) -> Any:
        """The payload with the toolkit's ``_rollout`` (``_rollwire`` stays, unread)."""
        return {**payload, TOOLKIT_KEY: self._rollout_of(payload)}

    def read_result(self, result: Any) -> tuple[float, dict[str, float]]:
        """``{"rewards": ...}`` (or ``reward``); the toolkit requires a dict."""
        if not isinstance(result, Mapping):
            raise InvalidReward(
                f"Return value must be a dict when S3 save is configured, got {type(result).__name__}"
            )
        return reward_of(result, keys=("rewards", "reward"), list_reward=self.list_reward)

    def rollout_answer(self, payload: Mapping[str, Any], ctx: InvocationContext) -> Any:
        """The toolkit's answer: where it would save the result."""
        rollout = self._rollout_of(payload)
        assert ctx.rollout is not None
        key = result_key(rollout, ctx.session_id or ctx.rollout.session_id)
        return {"status": "processing", "s3_bucket": rollout["s3_bucket"], "result_key": key}


@dataclass
class RuntimeContext(InvocationContext):
    """gen-2's handler context: AgentCore's fields plus ``config`` (the trainer's ``_config``)."""

    config: dict[str, Any] = field(default_factory=dict)


class AgentCoreRuntimeApp(RolloutApp):
    """gen-2 ``AgentCoreRuntimeApp``: ``@app.entrypoint`` handlers read ``_config``.

    ``background`` and ``state_dir`` are accepted for the toolkit's signature; rollouts always run
    in the background and their results go to the terminal record, not to files.
    """

    def __init__(
        self,
        *,
        background: bool = False,
        state_dir: Any = None,
        list_reward: ListReward = "last",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.background = background
        self.list_reward: ListReward = list_reward

    def _config_of(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        given = payload.get(RUNTIME_CONFIG_KEY)
        if isinstance(given, Mapping):
            return dict(given)
        return runtime_config(payload[PAYLOAD_KEY])

    def view_payload(self, payload: Mapping[str, Any], ctx: InvocationContext) -> Any:
        """The row with gen-2's ``_config``; the protocol envelope is not the handler's."""
        view = {k: v for k, v in payload.items() if k != RUNTIME_ENVELOPE_KEY}
        view[RUNTIME_CONFIG_KEY] = self._config_of(payload)
        return view

    def view_context(self, payload: Mapping[str, Any], ctx: InvocationContext) -> Any:
        """``context.config`` is the same ``_config``."""
        return RuntimeContext(
            session_id=ctx.session_id,
            headers=ctx.headers,
            rollout=ctx.rollout,
            request=ctx.request,
            config=self._config_of(payload),
        )

    def read_result(self, result: Any) -> tuple[float, dict[str, float]]:
        """``{"reward": ...}`` (or the README's ``rewards``)."""
        return reward_of(result, keys=("reward", "rewards"), list_reward=self.list_reward)

    def rollout_answer(self, payload: Mapping[str, Any], ctx: InvocationContext) -> Any:
        """With a start envelope, the invocation's ``in_progress`` state; else ``accepted``."""
        envelope = payload.get(RUNTIME_ENVELOPE_KEY)
        if isinstance(envelope, Mapping) and envelope.get("invocation_id"):
            return {
                "version": 1,
                "invocation_id": str(envelope["invocation_id"]),
                "status": "in_progress",
            }
        return super().rollout_answer(payload, ctx)
