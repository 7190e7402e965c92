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

A per-turn reward list is kept (``step_reward/<i>`` metrics, and element ``i`` on the ``i``-th
trainable call as ``ModelCall.step_reward`` when the rollout is assembled); its last element is
the rollout's reward unless ``list_reward="sum"`` or ``"mean"``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.responses import JSONResponse

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


def _state(invocation_id: str, status: str) -> dict[str, Any]:
    return {"version": 1, "invocation_id": invocation_id, "status": status}


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

    Rollouts always run in the background and their results go to the terminal record. Other
    invocations follow the toolkit's start/get protocol (``background=True``: also without an
    envelope), with their states kept in memory; ``state_dir`` is accepted and not used.
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
        # production invocations under the start/get protocol (rollouts report to the gateway)
        self._states: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._executions: set[asyncio.Task[None]] = set()

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

    @staticmethod
    def _runtime_context(payload: Any, ctx: InvocationContext) -> RuntimeContext:
        config = payload.get(RUNTIME_CONFIG_KEY) if isinstance(payload, Mapping) else None
        return RuntimeContext(
            session_id=ctx.session_id,
            headers=ctx.headers,
            request=ctx.request,
            config=dict(config) if isinstance(config, Mapping) else {},
        )

    async def production_call(self, payload: Any, ctx: InvocationContext) -> Any:
        """Outside a rollout, the toolkit's start/get protocol: ``start`` runs the handler (in
        the background with ``background: true``) and answers its state; ``get`` answers the
        state of an invocation started here (``not_found`` otherwise). Results live in memory."""
        envelope = payload.get(RUNTIME_ENVELOPE_KEY) if isinstance(payload, Mapping) else None
        if not isinstance(envelope, Mapping) and not self.background:
            return await self._call_handler(
                payload, self._runtime_context(payload, ctx), offload=True
            )
        if isinstance(envelope, Mapping):
            operation = envelope.get("operation")
            iid = str(envelope.get("invocation_id") or "")
            background = bool(envelope.get("background", False))
        else:
            operation, iid, background = "start", uuid.uuid4().hex, True
        if operation not in ("start", "get") or not iid:
            return JSONResponse(
                {
                    "error": "_agentcore_runtime needs operation 'start' or 'get' and an invocation_id"
                },
                status_code=400,
            )
        known = self._states.get(iid)
        if operation == "get" or known is not None:
            return known or _state(iid, "not_found")
        self._states[iid] = _state(iid, "in_progress")
        while len(self._states) > 10_000:
            self._states.popitem(last=False)
        view = {k: v for k, v in payload.items() if k != RUNTIME_ENVELOPE_KEY}
        run = asyncio.ensure_future(self._execute(iid, view, ctx))
        self._executions.add(run)
        run.add_done_callback(self._executions.discard)
        if background:
            return self._states[iid]
        await asyncio.shield(run)
        return self._states[iid]

    async def _execute(self, iid: str, payload: dict[str, Any], ctx: InvocationContext) -> None:
        hctx = self._runtime_context(payload, ctx)
        done = _state(iid, "completed")
        try:
            done["result"] = await self._call_handler(payload, hctx, offload=True)
        except Exception as exc:  # the toolkit's record of a failed invocation
            done["error"] = str(exc)
        self._states[iid] = done

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
