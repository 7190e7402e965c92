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
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import importlib
import inspect
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

from rollwire.agent.context import PAYLOAD_KEY
from rollwire.data.protocol import TERMINAL_STATUSES, Rollout, Row
from rollwire.data.trajectory import BuildMode, TrajectoryBuilder
from rollwire.trainer.gateway_client import GatewayAPIError
from rollwire_verl.layout import cut_row, verl_num_turns

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
    max_prompt_length: int | None,
    max_response_length: int | None,
) -> AgentLoopOutput:
    cut = cut_row(row, max_prompt_length=max_prompt_length, max_response_length=max_response_length)
    mask = cut.mask.astype(np.int64) if trainable else np.zeros(cut.mask.shape, np.int64)
    logprobs = cut.logprobs if trainable else np.zeros(cut.logprobs.shape, np.float32)
    experts = None
    if cut.experts is not None:
        experts = np.ascontiguousarray(cut.experts, dtype=np.int16)
    if cut.truncated:
        extra["rollwire_truncated"] = True
    return AgentLoopOutput(
        prompt_ids=cut.prompt.tolist(),
        response_ids=cut.response.tolist(),
        response_mask=mask.tolist(),
        response_logprobs=logprobs.astype(np.float64).tolist(),
        routed_experts=experts,
        reward_score=reward,
        num_turns=verl_num_turns(row),
        metrics=metrics,
        extra_fields=extra,
    )


def _weight_versions(
    rollout: Rollout, row: Row | None, global_steps: int | None
) -> tuple[int | None, int | None]:
    """``(min, max)`` weight version a row was sampled with, as verl's v1 trainer wants them.

    The calls' ``policy_version`` when every call of the row has an integer one; otherwise the
    version verl's sync trainer serves during step ``global_steps``: ``global_steps - 1`` (it
    pushes weights with ``update_weights(global_steps)`` at the end of each step, and version 0
    before the first), which is what its own loops report.
    """
    ids = set(row.call_ids) if row is not None else None
    versions: list[int] = []
    for call in rollout.calls:
        if ids is not None and call.call_id not in ids:
            continue
        try:
            versions.append(int(str(call.policy_version)))
        except ValueError:
            versions = []
            break
    if versions:
        return min(versions), max(versions)
    if global_steps is None:
        return None, None
    step = max(int(global_steps) - 1, 0)
    return step, step


def rows_to_agent_loop_outputs(
    rollout: Rollout,
    rows: Sequence[Row],
    *,
    on_failure: FailurePolicy = "zero",
    failure_reward: float = 0.0,
    multi_row: MultiRow = "list",
    fallback_prompt_ids: Sequence[int] | Callable[[], Sequence[int]] | None = None,
    reward_extra_keys: Sequence[str] | None = None,
    global_steps: int | None = None,
    max_prompt_length: int | None = None,
    max_response_length: int | None = None,
    fallback_token_id: int = 0,
) -> AgentLoopOutput | list[AgentLoopOutput]:
    """verl agent-loop output(s) of a finished rollout and its rows. Pure: no I/O.

    One row → one ``AgentLoopOutput``; a forked rollout → a list (``multi_row="list"``, for
    verl's v1 trainer) or its last row (``"last"``, for the legacy ``AgentLoopWorker``, which
    takes one output per sample). Every output carries the rollout reward; the final one carries
    ``extra_fields["reward_extra_info"]`` (the rollout's metrics). A failed rollout gets
    ``failure_reward`` and an all-zero mask (``on_failure="zero"``), or raises
    :class:`RolloutFailedError` (``"raise"``). A failed rollout with no usable call becomes one
    output of ``fallback_prompt_ids`` (a list, or a callable evaluated only then) and a one-token
    masked response of ``fallback_token_id`` (verl's v1 ``as_dict`` writes the reward at index -1
    of the response, so it cannot be empty).

    Outputs are cut like verl's loops cut theirs (:func:`rollwire_verl.layout.cut_row`): the last
    ``max_prompt_length`` prompt tokens, the first ``max_response_length`` response tokens (mask,
    log-probs and routing with them; ``extra_fields["rollwire_truncated"]`` marks the cut).
    Every output carries ``extra_fields["min_global_steps"/"max_global_steps"]``, from the calls'
    integer ``policy_version`` or else ``global_steps - 1`` (see :func:`_weight_versions`).
    ``num_turns`` is verl's count (:func:`rollwire_verl.layout.verl_num_turns`).
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

    def extra(row: Row | None, final: bool) -> dict[str, Any]:
        lo, hi = _weight_versions(rollout, row, global_steps)
        out: dict[str, Any] = {
            "rollout_id": rollout.rollout_id,
            "row_index": row.row_index if row is not None else 0,
            "rollwire_status": rollout.status,
            "fork": row.fork.kind if row is not None and row.fork else None,
            "min_global_steps": lo,
            "max_global_steps": hi,
        }
        if final:
            out["reward_extra_info"] = dict(reward_extra_info)
        return out

    if not rows:
        if not failed:
            raise ValueError(
                f"rollout {rollout.rollout_id} completed with no usable model call: nothing to train"
            )
        fallback = fallback_prompt_ids() if callable(fallback_prompt_ids) else fallback_prompt_ids
        prompt = [int(t) for t in (fallback or [fallback_token_id])]
        if max_prompt_length is not None:
            prompt = prompt[-max_prompt_length:]
        return AgentLoopOutput(
            prompt_ids=prompt,
            response_ids=[int(fallback_token_id)],
            response_mask=[0],
            response_logprobs=[0.0],
            reward_score=reward,
            num_turns=1,
            metrics=metrics,
            extra_fields=extra(None, True),
        )
    chosen = list(rows) if multi_row == "list" else [rows[-1]]
    outputs = [
        _row_output(
            row,
            reward=reward,
            trainable=not failed,
            metrics=metrics,
            extra=extra(row, i == len(chosen) - 1),
            max_prompt_length=max_prompt_length,
            max_response_length=max_response_length,
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
    #: model name the agent is told; None = what verl's server serves (:func:`served_model_name`)
    model: str | None = None
    deadline: float = 600.0
    deadline_grace: float = 15.0
    on_failure: FailurePolicy = "zero"
    failure_reward: float = 0.0
    multi_row: MultiRow = "list"
    reward_extra_keys: tuple[str, ...] | None = None
    #: extra session fields, frozen (:func:`_freeze`) so the settings stay hashable
    session_options: Any = ("__map__",)

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
            model=None if pick("model") is None else str(pick("model")),
            deadline=float(pick("deadline", 600.0)),
            deadline_grace=float(pick("deadline_grace", 15.0)),
            on_failure=pick("on_failure", "zero"),
            failure_reward=float(pick("failure_reward", 0.0)),
            multi_row=pick("multi_row", "list"),
            reward_extra_keys=tuple(extra_keys) if extra_keys is not None else None,
            session_options=_freeze(options.get("session_options") or {}),
        )


def _freeze(value: Any) -> Any:
    """A hashable form of YAML/OmegaConf options (settings are a cache key): mappings become
    sorted ``(key, value)`` tuples marked by a leading ``"__map__"``, lists become tuples."""
    if isinstance(value, Mapping) or hasattr(value, "items"):
        return ("__map__", *sorted((str(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)) or (
        hasattr(value, "__iter__") and not isinstance(value, (str, bytes))
    ):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    """Inverse of :func:`_freeze`: plain dicts and lists (JSON-able)."""
    if isinstance(value, tuple) and value[:1] == ("__map__",):
        return {k: _thaw(v) for k, v in value[1:]}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


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


def served_model_name(trainer_config: Any) -> str:
    """The model name verl's inference servers answer to, from the trainer config.

    verl 0.9.1 starts vLLM/SGLang with the model's *local* path (``HFModelConfig.local_path =
    copy_to_local(model.path, use_shm=model.use_shm)``) and sets ``served_model_name`` only with
    ``rollout.prometheus.enable`` and ``rollout.prometheus.served_model_name`` (keeping the part
    after the last ``/``); a request for any other name is a 404.
    """
    ref = trainer_config.actor_rollout_ref
    prometheus = ref.rollout.get("prometheus") or {}
    if prometheus.get("enable") and prometheus.get("served_model_name"):
        return str(prometheus["served_model_name"]).split("/")[-1]
    model = ref.get("model") or {}
    path = model.get("path")
    if not path:
        raise ValueError(
            "cannot tell the model name verl's servers use: actor_rollout_ref.model.path is "
            "not set; set model in the agent-loop YAML or ROLLWIRE_MODEL"
        )
    return _local_model_path(str(path), bool(model.get("use_shm", False)))


@functools.lru_cache(maxsize=8)
def _local_model_path(path: str, use_shm: bool) -> str:
    from verl.utils.fs import is_non_local

    if not use_shm and not is_non_local(path):
        return path  # copy_to_local returns a local path (or a Hub id) unchanged
    from verl.utils.fs import copy_to_local

    # the same cached copy the worker's HFModelConfig made when it started
    return str(copy_to_local(path, use_shm=use_shm))


async def discover_server_addresses(server_manager: Any) -> tuple[str, ...]:
    """Addresses (``ip:port``) of verl's inference servers, from what verl hands the loop.

    verl 0.9.1 passes an ``LLMServerClient``, whose ``_load_balancer`` (a Ray actor) lists the
    servers by address (``get_all_servers``: the router is built from
    ``LLMServerManager.server_addresses``). An ``LLMServerManager`` itself (``server_addresses``
    / ``get_addresses()``) is accepted too.
    """
    addresses: Any = getattr(server_manager, "server_addresses", None)
    if addresses is None and callable(getattr(server_manager, "get_addresses", None)):
        addresses = server_manager.get_addresses()
    if addresses is None:
        balancer = getattr(server_manager, "_load_balancer", None) or getattr(
            server_manager, "global_load_balancer", None
        )
        if balancer is not None:
            ref = balancer.get_all_servers.remote()
            if inspect.isawaitable(ref):
                addresses = await ref
            else:  # pragma: no cover - a Ray ObjectRef is awaitable in Ray >= 2
                import ray

                addresses = ray.get(ref)
    if inspect.isawaitable(addresses):
        addresses = await addresses
    if not addresses:
        raise ValueError(
            "no gateway configured and no inference servers found on verl's server manager "
            f"({type(server_manager).__name__}): set gateway_url/admin_key or backends in the "
            "agent-loop YAML (or ROLLWIRE_GATEWAY_URL / ROLLWIRE_BACKENDS)"
        )
    return tuple(sorted(_http_url(str(a)) for a in addresses))


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
        from rollwire.trainer.runners import make_runner

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
        from rollwire.trainer.gateway_client import AsyncGatewayClient

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


def session_sampling(
    sampling_params: Mapping[str, Any], *, response_length: int | None = None
) -> dict[str, Any]:
    """verl's sampling parameters as the session's OpenAI-style ``sampling``.

    ``max_tokens`` defaults to ``response_length`` (verl's ``rollout.response_length``): no call
    may sample more than a row can hold.
    """
    out: dict[str, Any] = {}
    if response_length is not None and sampling_params.get("max_tokens") is None:
        out["max_tokens"] = int(response_length)
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

    async def run(
        self, sampling_params: dict[str, Any], **kwargs: Any
    ) -> AgentLoopOutput | list[AgentLoopOutput]:
        """Run the row in ``kwargs`` as one rollout and return its output(s)."""
        s = self.settings
        res = await self._shared()
        gw = res.client()
        task = {k: _plain(v) for k, v in kwargs.items() if k not in _VERL_INTERNAL_KEYS}
        group_id = str(task.get("uid") or task.get("index") or uuid.uuid4().hex)
        task_id = str(task.get("index", group_id))
        prompt_length = int(self.rollout_config.prompt_length)
        response_length = int(self.rollout_config.response_length)
        sampling = session_sampling(sampling_params, response_length=response_length)
        options = _thaw(s.session_options)
        # max_tokens: the smaller of the agent's and response_length (not a forced value)
        options["sampling_policy"] = {
            "max_tokens": "min",
            **dict(options.get("sampling_policy") or {}),
        }
        handle = await gw.create_session(
            group_id=group_id,
            task_id=task_id,
            metadata={"verl_sample": _plain(kwargs.get("session_id"))},
            sampling=sampling,
            capture=s.capture,
            ttl=int(s.deadline + s.deadline_grace + 300),
            **options,
        )
        sid = handle.session_id
        deadline_at = time.time() + s.deadline
        payload = dict(task)
        payload[PAYLOAD_KEY] = {
            "version": 1,
            "session_id": sid,
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
            await res.runner.invoke(payload, sid)
        except Exception as exc:
            await _complete_quietly(
                gw, sid, "failed", f"the runner could not start the agent: {exc}"
            )
        await _wait_terminal(gw, sid, deadline_at + s.deadline_grace)
        rollout: Rollout = await gw.rollout(sid)
        rows = TrajectoryBuilder(s.mode).build(rollout)
        global_steps = kwargs.get("global_steps")
        return rows_to_agent_loop_outputs(
            rollout,
            rows,
            on_failure=s.on_failure,
            failure_reward=s.failure_reward,
            multi_row=s.multi_row,
            fallback_prompt_ids=lambda: self._fallback_prompt_ids(kwargs),
            reward_extra_keys=s.reward_extra_keys,
            global_steps=None if global_steps is None else int(_plain(global_steps)),
            max_prompt_length=prompt_length,
            max_response_length=response_length,
            fallback_token_id=self._pad_token_id(),
        )


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
