"""``RollwireAgentLoop``: a verl agent loop that runs each dataset row as one rollwire rollout.

verl instantiates the loop once per sample (``hydra.utils.instantiate``) and awaits
``run(sampling_params, **row)``. The loop creates a gateway session for the row, hands the row plus
``_rollwire`` (DESIGN §7) to the agent through a runner, waits for the terminal record, fetches the
captured rollout and turns its rows into ``AgentLoopOutput``s — one, or a list when the rollout
forked (verl's v1 trainer accepts a list; see ``multi_row``).

The gateway's backends are verl's own inference servers (``LLMServerManager.get_addresses()``):
either an external gateway (``gateway_url``) that the driver registered them on, or an in-process
gateway this process starts over ``backends``. Gateway, runner and clients are expensive and verl
builds a loop per sample, so they live in a per-process cache keyed by the loop's settings.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

from rollwire.context import PAYLOAD_KEY
from rollwire.protocol import TERMINAL_STATUSES, Rollout, Row
from rollwire.trajectory import BuildMode, TrajectoryBuilder

__all__ = [
    "AGENT_NAME",
    "LoopSettings",
    "RolloutFailedError",
    "RollwireAgentLoop",
    "aclose_resources",
    "rows_to_agent_loop_outputs",
    "session_sampling",
]

#: The name the loop is registered under (``@register`` and ``agent_loop.yaml``).
AGENT_NAME = "rollwire_agent"

FailurePolicy = Literal["zero", "raise"]
MultiRow = Literal["list", "last"]

# verl passes these with every sample; they are bookkeeping, not part of the agent's task.
# (``session_id`` is verl v1's index among the n samples of a prompt; it goes to session metadata.)
_VERL_INTERNAL_KEYS = frozenset(
    {"agent_name", "__num_turns__", "__rollout_n__", "__do_sample__", "session_id"}
)


class RolloutFailedError(RuntimeError):
    """A rollout ended failed/timeout/cancelled and the loop was configured with ``on_failure="raise"``."""


def _row_output(
    row: Row,
    *,
    reward: float,
    trainable: bool,
    metrics: AgentLoopMetrics,
    extra: dict[str, Any],
) -> AgentLoopOutput:
    mask = row.loss_mask.astype(np.int64) if trainable else np.zeros(row.loss_mask.shape, np.int64)
    logprobs = row.logprobs if trainable else np.zeros(row.logprobs.shape, np.float32)
    experts = None
    if row.routed_experts is not None:
        experts = np.ascontiguousarray(row.routed_experts, dtype=np.int16)
    return AgentLoopOutput(
        prompt_ids=row.prompt_ids.tolist(),
        response_ids=row.response_ids.tolist(),
        response_mask=mask.tolist(),
        response_logprobs=logprobs.astype(np.float64).tolist(),
        routed_experts=experts,
        reward_score=reward,
        num_turns=row.num_turns,
        metrics=metrics,
        extra_fields=extra,
    )


def rows_to_agent_loop_outputs(
    rollout: Rollout,
    rows: Sequence[Row],
    *,
    on_failure: FailurePolicy = "zero",
    failure_reward: float = 0.0,
    multi_row: MultiRow = "list",
    fallback_prompt_ids: Sequence[int] | None = None,
    reward_extra_keys: Sequence[str] | None = None,
) -> AgentLoopOutput | list[AgentLoopOutput]:
    """verl agent-loop output(s) of a finished rollout and its rows. Pure: no I/O.

    One row → one ``AgentLoopOutput``; a forked rollout → a list (``multi_row="list"``, for
    verl's v1 trainer) or its last row (``"last"``, for the legacy ``AgentLoopWorker``, which
    takes one output per sample). Every output carries the rollout reward; the final one carries
    ``extra_fields["reward_extra_info"]`` (the rollout's metrics). A failed rollout gets
    ``failure_reward`` and an all-zero mask (``on_failure="zero"``), or raises
    :class:`RolloutFailedError` (``"raise"``). A failed rollout with no usable call becomes one
    output of ``fallback_prompt_ids`` and an empty response.
    """
    if on_failure not in ("zero", "raise"):
        raise ValueError(f"on_failure must be 'zero' or 'raise', got {on_failure!r}")
    if multi_row not in ("list", "last"):
        raise ValueError(f"multi_row must be 'list' or 'last', got {multi_row!r}")
    failed = rollout.status != "completed"
    if failed and on_failure == "raise":
        raise RolloutFailedError(
            f"rollout {rollout.rollout_id} ended {rollout.status}: {rollout.error or 'no error text'}"
        )
    if not failed and rollout.reward is None:
        raise ValueError(f"rollout {rollout.rollout_id} is completed but has no reward")
    reward = float(failure_reward) if failed else float(rollout.reward)  # type: ignore[arg-type]
    keys = list(reward_extra_keys) if reward_extra_keys is not None else sorted(rollout.metrics)
    reward_extra_info: dict[str, Any] = {k: float(rollout.metrics.get(k, 0.0)) for k in keys}
    latency = sum(c.latency_ms for c in rollout.calls) / 1000.0
    metrics = AgentLoopMetrics(generate_sequences=latency)

    def extra(row_index: int, final: bool, fork: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rollout_id": rollout.rollout_id,
            "row_index": row_index,
            "rollwire_status": rollout.status,
            "fork": fork,
        }
        if final:
            out["reward_extra_info"] = dict(reward_extra_info)
        return out

    if not rows:
        if not failed:
            raise ValueError(
                f"rollout {rollout.rollout_id} completed with no usable model call: nothing to train"
            )
        prompt = list(fallback_prompt_ids or [0])
        return AgentLoopOutput(
            prompt_ids=[int(t) for t in prompt],
            response_ids=[],
            response_mask=[],
            response_logprobs=[],
            reward_score=reward,
            num_turns=0,
            metrics=metrics,
            extra_fields=extra(0, True, None),
        )
    chosen = list(rows) if multi_row == "list" else [rows[-1]]
    outputs = [
        _row_output(
            row,
            reward=reward,
            trainable=not failed,
            metrics=metrics,
            extra=extra(row.row_index, i == len(chosen) - 1, row.fork.kind if row.fork else None),
        )
        for i, row in enumerate(chosen)
    ]
    return outputs if len(outputs) > 1 else outputs[0]


# -- settings and per-process resources ---------------------------------------------------------


@dataclass(frozen=True)
class LoopSettings:
    """How the loop reaches the gateway and the agent. YAML keys of the registry entry, else
    ``ROLLWIRE_*`` environment variables (names in the README), else these defaults."""

    gateway_url: str | None = None
    admin_key: str | None = None
    backends: tuple[str, ...] = ()
    backend_kind: str = "vllm"
    runner: str = "local"
    agent: str | None = None
    mode: BuildMode = "merge"
    capture: str = "passthrough"
    model: str = "policy"
    deadline: float = 600.0
    deadline_grace: float = 15.0
    on_failure: FailurePolicy = "zero"
    failure_reward: float = 0.0
    multi_row: MultiRow = "list"
    reward_extra_keys: tuple[str, ...] | None = None
    session_options: tuple[tuple[str, Any], ...] = field(default_factory=tuple)

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> LoopSettings:
        """Settings from the YAML entry's keys, falling back to the environment."""

        def pick(key: str, default: Any = None) -> Any:
            if options.get(key) is not None:
                return options[key]
            return os.environ.get(f"ROLLWIRE_{key.upper()}", default)

        backends = pick("backends", ())
        if isinstance(backends, str):
            backends = [b for b in backends.split(",") if b.strip()]
        extra_keys = pick("reward_extra_keys")
        if isinstance(extra_keys, str):
            extra_keys = [k for k in extra_keys.split(",") if k.strip()]
        return cls(
            gateway_url=pick("gateway_url"),
            admin_key=pick("admin_key"),
            backends=tuple(_http_url(str(b).strip()) for b in backends),
            backend_kind=str(pick("backend_kind", "vllm")),
            runner=str(pick("runner", "local")),
            agent=pick("agent"),
            mode=pick("mode", "merge"),
            capture=str(pick("capture", "passthrough")),
            model=str(pick("model", "policy")),
            deadline=float(pick("deadline", 600.0)),
            deadline_grace=float(pick("deadline_grace", 15.0)),
            on_failure=pick("on_failure", "zero"),
            failure_reward=float(pick("failure_reward", 0.0)),
            multi_row=pick("multi_row", "list"),
            reward_extra_keys=tuple(extra_keys) if extra_keys is not None else None,
            session_options=tuple(sorted(dict(options.get("session_options") or {}).items())),
        )


def _http_url(address: str) -> str:
    # verl reports its servers as "ip:port"; the gateway wants a URL.
    return address if "://" in address else f"http://{address}"


def _import_object(spec: str) -> Any:
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"expected 'package.module:attribute', got {spec!r}")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class _Resources:
    """What all loops of one process with the same settings share: gateway, runner, clients."""

    def __init__(self, settings: LoopSettings) -> None:
        self.settings = settings
        self.gateway: Any = None
        if settings.gateway_url:
            if not settings.admin_key:
                raise ValueError(
                    f"the gateway at {settings.gateway_url} needs its admin key: set admin_key "
                    "in the agent-loop YAML or ROLLWIRE_ADMIN_KEY"
                )
            self.url, self.admin_key = settings.gateway_url.rstrip("/"), settings.admin_key
        else:
            from rollwire.gateway import serve_in_thread

            self.gateway = serve_in_thread(
                backends=[(b, settings.backend_kind) for b in settings.backends]
            )
            self.url, self.admin_key = self.gateway.url, self.gateway.admin_key
        self.runner = self._make_runner()
        self._clients: dict[int, Any] = {}

    def _make_runner(self) -> Any:
        from rollwire.runners import make_runner

        spec = self.settings.runner
        if ":" in spec and spec.split(":", 1)[0] not in ("local", "http", "ray", "agentcore"):
            obj = _import_object(spec)  # a Runner object or a factory of one
            return obj() if callable(obj) and not hasattr(obj, "invoke") else obj
        app = None
        if spec == "local":
            if not self.settings.agent:
                raise ValueError(
                    "the local runner needs the agent: set agent: 'package.module:app' (a "
                    "RolloutApp or handler) in the agent-loop YAML or ROLLWIRE_AGENT"
                )
            app = _import_object(self.settings.agent)
        return make_runner(spec, app=app, app_path=self.settings.agent)

    def client(self) -> Any:
        """The gateway client of the running event loop (httpx clients are per loop)."""
        from rollwire.gateway_client import AsyncGatewayClient

        key = id(asyncio.get_running_loop())
        gw = self._clients.get(key)
        if gw is None:
            gw = AsyncGatewayClient(self.url, self.admin_key)
            self._clients[key] = gw
        return gw

    async def aclose(self) -> None:
        """Close the runner and clients, and stop the in-process gateway if this started one."""
        await self.runner.aclose()
        for gw in self._clients.values():
            await gw.aclose()
        self._clients.clear()
        if self.gateway is not None:
            self.gateway.stop()


_RESOURCES: dict[LoopSettings, _Resources] = {}
_RESOURCES_LOCK = threading.Lock()


async def aclose_resources() -> None:
    """Release what the loops of this process share (runners, clients, in-process gateways)."""
    with _RESOURCES_LOCK:
        items = list(_RESOURCES.values())
        _RESOURCES.clear()
    for res in items:
        await res.aclose()


def _resources(settings: LoopSettings) -> _Resources:
    with _RESOURCES_LOCK:
        res = _RESOURCES.get(settings)
        if res is None:
            res = _Resources(settings)
            _RESOURCES[settings] = res
        return res


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


def session_sampling(sampling_params: Mapping[str, Any]) -> dict[str, Any]:
    """verl's sampling parameters as the session's OpenAI-style ``sampling``."""
    out: dict[str, Any] = {}
    for key in ("temperature", "top_p", "max_tokens", "seed"):
        if sampling_params.get(key) is not None:
            out[key] = sampling_params[key]
    top_k = sampling_params.get("top_k")
    if top_k is not None and int(top_k) > 0:
        out["top_k"] = int(top_k)
    rep = sampling_params.get("repetition_penalty")
    if rep is not None and float(rep) != 1.0:
        out["repetition_penalty"] = float(rep)
    return out


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

    def _fallback_prompt_ids(self, row: Mapping[str, Any]) -> list[int]:
        messages = row.get("raw_prompt")
        tok = self.tokenizer
        if messages is not None and hasattr(tok, "apply_chat_template"):
            try:
                ids = tok.apply_chat_template(
                    _plain(messages), add_generation_prompt=True, tokenize=True
                )
                if isinstance(ids, Mapping):
                    ids = ids["input_ids"]
                return [int(t) for t in ids][-int(self.rollout_config.prompt_length) :]
            except Exception:  # the fallback prompt is only for a row with no usable call
                pass
        pad = getattr(tok, "pad_token_id", None)
        return [int(pad) if pad is not None else 0]

    async def run(
        self, sampling_params: dict[str, Any], **kwargs: Any
    ) -> AgentLoopOutput | list[AgentLoopOutput]:
        """Run the row in ``kwargs`` as one rollout and return its output(s)."""
        s = self.settings
        res = _resources(s)
        gw = res.client()
        task = {k: _plain(v) for k, v in kwargs.items() if k not in _VERL_INTERNAL_KEYS}
        group_id = str(task.get("uid") or task.get("index") or uuid.uuid4().hex)
        task_id = str(task.get("index", group_id))
        sampling = session_sampling(sampling_params)
        handle = await gw.create_session(
            group_id=group_id,
            task_id=task_id,
            metadata={"verl_sample": _plain(kwargs.get("session_id"))},
            sampling=sampling,
            capture=s.capture,
            ttl=int(s.deadline + s.deadline_grace + 300),
            **dict(s.session_options),
        )
        sid = handle.session_id
        deadline_at = time.time() + s.deadline
        payload = dict(task)
        payload[PAYLOAD_KEY] = {
            "version": 1,
            "session_id": sid,
            "base_url": handle.base_url,
            "api_key": handle.token,
            "model": s.model,
            "sampling": sampling,
            "complete_url": handle.complete_url,
            "deadline": deadline_at,
            "group_id": group_id,
            "task_id": task_id,
        }
        try:
            await res.runner.invoke(payload, sid)
        except Exception as exc:
            await _complete_quietly(
                gw, sid, "failed", f"the runner could not start the agent: {exc}"
            )
        await _wait_terminal(gw, sid, deadline_at + s.deadline_grace)
        rollout: Rollout = await gw.rollout(sid)
        rows = TrajectoryBuilder(s.mode).build(rollout)
        return rows_to_agent_loop_outputs(
            rollout,
            rows,
            on_failure=s.on_failure,
            failure_reward=s.failure_reward,
            multi_row=s.multi_row,
            fallback_prompt_ids=self._fallback_prompt_ids(kwargs),
            reward_extra_keys=s.reward_extra_keys,
        )


async def _complete_quietly(gw: Any, sid: str, status: str, error: str) -> None:
    try:
        await gw.complete(sid, reward=None, status=status, error=error)
    except Exception:  # 409: the agent's own terminal record came first, which is fine
        pass


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
