"""How the verl agent loop reaches the gateway and the agent: :class:`LoopSettings`, the model
name verl's servers answer to, and verl's sampling parameters as a session's ``sampling``."""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rollwire.data.credit import parse_credit
from rollwire.data.trajectory import BuildMode
from rollwire.metrics_sinks.step_logger import metrics_every, metrics_spec
from rollwire_verl.outputs import FailurePolicy, MultiRow

__all__ = ["LoopSettings", "served_model_name", "session_sampling"]


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
    #: ``(layers, top_k)`` of the backend's routing; None = from verl's config when it replays
    routed_experts_shape: tuple[int, int] | None = None
    #: extra session fields, frozen (:func:`_freeze`) so the settings stay hashable
    session_options: Any = ("__map__",)
    #: metrics sink (``tensorboard:DIR``, ``mlflow:URI_OR_DIR``, ``wandb:DIR``); None: no logging
    metrics: str | None = None
    #: rollouts per logged step when verl hands no ``global_steps``
    metrics_every: int = 64
    #: step credit (``broadcast``, ``discounted``, ``discounted:GAMMA``); None: step rewards unused
    step_credit: str | None = None
    #: stamp the gateway's policy version with the weights verl serves during ``global_steps``
    stamp_version: bool = True

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
        shape = pick("routed_experts_shape")
        if isinstance(shape, str):
            shape = [p for p in shape.replace("x", ",").split(",") if p.strip()]
        return cls(
            routed_experts_shape=(int(shape[0]), int(shape[1])) if shape else None,
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
            metrics=metrics_spec(None if pick("metrics") is None else str(pick("metrics"))),
            metrics_every=metrics_every(pick("metrics_every")),
            step_credit=None if pick("step_credit") is None else str(pick("step_credit")),
            stamp_version=_flag("stamp_version", pick("stamp_version", True)),
        )

    def validate(self) -> None:
        """Refuse, at the loop's start, settings verl would fail on mid-training."""
        if self.multi_row == "last" and self.reward_extra_keys is None:
            raise ValueError(
                "multi_row: last (verl's legacy AgentLoopWorker) needs reward_extra_keys: the "
                "worker reads the metric names from the first output and raises KeyError on any "
                "rollout whose metrics differ (a failed rollout has none). Set "
                "reward_extra_keys: [key, ...] in the agent-loop YAML or "
                "ROLLWIRE_REWARD_EXTRA_KEYS=key1,key2"
            )
        parse_credit(self.step_credit)  # a bad spec fails here, not at the first rollout
        if self.routed_experts_shape is not None and min(self.routed_experts_shape) < 1:
            raise ValueError(
                f"routed_experts_shape must be [layers, top_k] > 0, got {self.routed_experts_shape}"
            )


def _flag(name: str, value: Any) -> bool:
    """A YAML boolean, or an environment variable's ``1``/``true``/``yes`` (``0``/``false``/``no``)."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            raise ValueError(
                f"{name} must be true or false, got {value!r} (YAML key {name} or "
                f"ROLLWIRE_{name.upper()})"
            )
        return text in ("1", "true", "yes", "on")
    return bool(value)


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
