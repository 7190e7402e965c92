"""``RollwireAgentLoop``: a verl agent loop that runs each dataset row as one rollwire rollout.

verl instantiates the loop once per sample (``hydra.utils.instantiate``) and awaits
``run(sampling_params, **row)``. The loop creates a gateway session for the row, hands the row plus
``_rollwire`` (DESIGN §7) to the agent through a runner, waits for the terminal record, fetches the
captured rollout and turns its rows into ``AgentLoopOutput``s — one, or a list when the rollout
forked (verl's v1 trainer accepts a list; see ``multi_row``).

The gateway's backends are verl's own inference servers: an external gateway (``gateway_url``)
that the driver registered them on, an in-process gateway this process starts over ``backends``,
or — with neither set — an in-process gateway over the addresses discovered at run time from the
``server_manager`` verl hands the loop (:func:`discover_server_addresses`; Ray picks the ports, so
they cannot be configured in advance). Gateway, runner and clients are expensive and verl builds a
loop per sample, so they live in a per-process cache keyed by the loop's settings.

Each output follows verl's own loops: at most ``rollout.response_length`` response tokens (the
first ones; mask, log-probs and routing cut with them — :func:`rollwire_verl.layout.cut_row`), at
most ``rollout.prompt_length`` prompt tokens (the last ones), ``num_turns`` counted as verl counts
it, and ``extra_fields["min_global_steps"/"max_global_steps"]`` set (verl's v1 trainer turns them
into ``int`` arrays for its staleness metrics).

Policy versions: verl pushes its own weights (``update_weights(global_steps)`` at the end of each
step), so step ``S`` rolls out on version ``S - 1`` (:func:`~rollwire_verl.outputs.served_step`).
verl's v1 trainer hands ``global_steps`` to every loop (``AgentLoopWorkerTQ._run_prompt``); the
first rollout of a new step in a process stamps that version on the gateway before its session
(:class:`~rollwire.trainer.step_stamp.StepStamp`: once per step per process, never backwards,
never fatal), so its calls and every export carry it. ``stamp_version: false`` turns it off.
verl's legacy ``AgentLoopWorker`` keeps the step in ``meta_info``: there nothing is stamped.

With ``metrics`` set (YAML key or ``ROLLWIRE_METRICS``), each process's rollouts are logged to that
sink per trainer step: they carry verl's ``global_steps``, and a step's rollouts are logged as one
step (at ``global_steps``) when the first rollout of another step arrives, or at exit; without
``global_steps``, every ``metrics_every`` rollouts make a step.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
import uuid
from collections.abc import Mapping
from typing import Any

import numpy as np
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register

from rollwire.agent.context import PAYLOAD_KEY
from rollwire.data.protocol import TERMINAL_STATUSES, Rollout
from rollwire.data.trajectory import TrajectoryBuilder
from rollwire.trainer.gateway_client import GatewayAPIError
from rollwire_verl.outputs import (
    RolloutFailedError,
    RoutingShape,
    rows_to_agent_loop_outputs,
    served_step,
)
from rollwire_verl.resources import (
    _Resources,
    _resources,
    aclose_resources,
    discover_server_addresses,
)
from rollwire_verl.settings import LoopSettings, _thaw, served_model_name, session_sampling

logger = logging.getLogger(__name__)

__all__ = [
    "AGENT_NAME",
    "LoopSettings",
    "RolloutFailedError",
    "RollwireAgentLoop",
    "aclose_resources",
    "discover_server_addresses",
    "rows_to_agent_loop_outputs",
    "served_model_name",
    "session_sampling",
]

#: The name the loop is registered under (``@register`` and ``agent_loop.yaml``).
AGENT_NAME = "rollwire_agent"


# verl passes these with every sample; they are bookkeeping, not part of the agent's task.
# (``session_id`` is verl v1's index among the n samples of a prompt; it goes to session metadata.)
_VERL_INTERNAL_KEYS = frozenset(
    {"agent_name", "__num_turns__", "__rollout_n__", "__do_sample__", "session_id"}
)


def _plain(value: Any) -> Any:
    """JSON-able form of a dataset field (verl hands NumPy arrays and scalars)."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@register(AGENT_NAME)
class RollwireAgentLoop(AgentLoopBase):
    """verl agent loop that runs one rollwire rollout per dataset row (see the module docstring)."""

    def __init__(
        self,
        trainer_config: Any,
        server_manager: Any,
        tokenizer: Any,
        processor: Any,
        dataset_cls: Any = None,
        data_config: Any = None,
        hf_model_type: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            trainer_config,
            server_manager,
            tokenizer,
            processor,
            dataset_cls,
            data_config,
            hf_model_type=hf_model_type,
        )
        options = {k: v for k, v in kwargs.items() if k not in ("name", "tools")}
        self.settings = LoopSettings.from_options(options)
        self.settings.validate()
        self.model = self.settings.model or served_model_name(self.config)

    async def _shared(self) -> _Resources:
        s = self.settings
        if not s.gateway_url and not s.backends:
            # verl's servers get their ports from Ray at start-up: ask the server manager.
            addresses = await discover_server_addresses(self.server_manager)
            s = dataclasses.replace(s, backends=addresses)
        return _resources(s)

    def _pad_token_id(self) -> int:
        pad = getattr(self.tokenizer, "pad_token_id", None)
        return int(pad) if pad is not None else 0

    def _fallback_prompt_ids(self, row: Mapping[str, Any]) -> list[int]:
        """The row's chat prompt, tokenized: the prompt of a failed rollout with no usable call."""
        messages = row.get("raw_prompt")
        tok = self.tokenizer
        if messages is not None and hasattr(tok, "apply_chat_template"):
            from jinja2 import TemplateError

            try:
                ids = tok.apply_chat_template(
                    _plain(messages), add_generation_prompt=True, tokenize=True
                )
                if isinstance(ids, Mapping):
                    ids = ids["input_ids"]
                return [int(t) for t in ids]
            except (TemplateError, ValueError, TypeError, KeyError) as exc:
                # Only a failed rollout gets here (it trains no token): say so, and go on.
                logger.warning(
                    "rollwire: could not apply the chat template to the prompt of a failed "
                    "rollout (%s: %s); its output gets a one-token prompt",
                    type(exc).__name__,
                    exc,
                )
        return [self._pad_token_id()]

    def routing_shape(self) -> RoutingShape | None:
        """``(layers, top_k)`` when verl's servers return routed experts, else None.

        ``routed_experts_shape`` from the YAML, else — with ``rollout.enable_rollout_routing_replay``
        — the model's ``num_hidden_layers`` / ``num_experts_per_tok`` (what verl's servers shape
        routing with). Outputs without routing then get zeros of that shape.
        """
        if self.settings.routed_experts_shape is not None:
            return self.settings.routed_experts_shape
        if not self.rollout_config.get("enable_rollout_routing_replay", False):
            return None
        path = str((self.config.actor_rollout_ref.get("model") or {}).get("path") or "")
        return _hf_routing_shape(path)

    async def _start(
        self, sampling_params: Mapping[str, Any], kwargs: Mapping[str, Any], step: int | None
    ) -> Any:
        """Create the row's session and hand the agent its payload; the session handle. The first
        rollout of a new ``global_steps`` in this process stamps the gateway first."""
        s = self.settings
        res = await self._shared()
        gw = res.client()
        if s.stamp_version and step is not None:
            await res.stamp.astamp(gw, served_step(step))
        task = {k: _plain(v) for k, v in kwargs.items() if k not in _VERL_INTERNAL_KEYS}
        group_id = str(task.get("uid") or task.get("index") or uuid.uuid4().hex)
        task_id = str(task.get("index", group_id))
        response_length = int(self.rollout_config.response_length)
        sampling = session_sampling(sampling_params, response_length=response_length)
        options = _thaw(s.session_options)
        # max_tokens: the smaller of the agent's and response_length (not a forced value)
        options["sampling_policy"] = {
            "max_tokens": "min",
            **dict(options.get("sampling_policy") or {}),
        }
        if self.routing_shape() is not None:
            # streamed passthrough calls are then asked non-streamed, so routing is captured
            options.setdefault("routed_experts", True)
        handle = await gw.create_session(
            group_id=group_id,
            task_id=task_id,
            metadata={"verl_sample": _plain(kwargs.get("session_id"))},
            sampling=sampling,
            capture=s.capture,
            ttl=int(s.deadline + s.deadline_grace + 300),
            **options,
        )
        deadline_at = time.time() + s.deadline
        payload = dict(task)
        payload[PAYLOAD_KEY] = {
            "version": 1,
            "session_id": handle.session_id,
            "base_url": handle.base_url,
            "api_key": handle.token,
            "model": self.model,
            "sampling": sampling,
            "complete_url": handle.complete_url,
            "deadline": deadline_at,
            "group_id": group_id,
            "task_id": task_id,
        }
        try:
            await res.runner.invoke(payload, handle.session_id)
        except Exception as exc:
            await _complete_quietly(
                gw, handle.session_id, "failed", f"the runner could not start the agent: {exc}"
            )
        await _wait_terminal(gw, handle.session_id, deadline_at + s.deadline_grace)
        return handle

    async def run(
        self, sampling_params: dict[str, Any], **kwargs: Any
    ) -> AgentLoopOutput | list[AgentLoopOutput]:
        """Run the row in ``kwargs`` as one rollout and return its output(s)."""
        s = self.settings
        global_steps = kwargs.get("global_steps")
        step = None if global_steps is None else int(_plain(global_steps))
        handle = await self._start(sampling_params, kwargs, step)
        rollout: Rollout = await (await self._shared()).client().rollout(handle.session_id)
        # the backend's tokenizer classifies forks (template / retokenized / ...), not "other"
        tokenizer = _tokenizer_like(self.tokenizer)
        rows = TrajectoryBuilder(s.mode, tokenizer, s.step_credit).build(rollout)
        if s.metrics:
            from rollwire.metrics_sinks.step_logger import shared_step_logger

            shared_step_logger(s.metrics, every=s.metrics_every).add(rollout, step, rows)
        return rows_to_agent_loop_outputs(
            rollout,
            rows,
            on_failure=s.on_failure,
            failure_reward=s.failure_reward,
            multi_row=s.multi_row,
            fallback_prompt_ids=lambda: self._fallback_prompt_ids(kwargs),
            reward_extra_keys=s.reward_extra_keys,
            global_steps=step,
            max_prompt_length=int(self.rollout_config.prompt_length),
            max_response_length=int(self.rollout_config.response_length),
            fallback_token_id=self._pad_token_id(),
            routing_shape=self.routing_shape(),
        )


def _tokenizer_like(tokenizer: Any) -> Any:
    """verl's tokenizer when it can decode (what fork classification needs), else None."""
    return tokenizer if callable(getattr(tokenizer, "decode", None)) else None


@functools.lru_cache(maxsize=4)
def _hf_routing_shape(model_path: str) -> RoutingShape:
    """``(num_hidden_layers, num_experts_per_tok)`` of the model's HF config (read once)."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(model_path)
    cfg = getattr(cfg, "text_config", None) or cfg
    layers, top_k = (
        getattr(cfg, "num_hidden_layers", None),
        getattr(cfg, "num_experts_per_tok", None),
    )
    if not layers or not top_k:
        raise ValueError(
            f"rollout.enable_rollout_routing_replay is set but {model_path!r} has no "
            "num_hidden_layers / num_experts_per_tok; set routed_experts_shape: [layers, top_k] "
            "in the agent-loop YAML"
        )
    return int(layers), int(top_k)


async def _complete_quietly(gw: Any, sid: str, status: str, error: str) -> None:
    try:
        await gw.complete(sid, reward=None, status=status, error=error)
    except GatewayAPIError as exc:
        if exc.status_code != 409:
            raise
        # 409: the agent's own terminal record came first, which is fine


async def _wait_terminal(gw: Any, sid: str, give_up_at: float) -> None:
    while True:
        left = give_up_at - time.time()
        if left <= 0:
            await _complete_quietly(
                gw, sid, "timeout", "the agent did not report before its deadline"
            )
            return
        info = await gw.wait(sid, timeout=max(0.1, min(left, 60.0)))
        if info.status in TERMINAL_STATUSES:
            return
