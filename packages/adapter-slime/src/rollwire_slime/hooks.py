"""slime hooks, loaded by path: ``generate`` (one rollout per slime sample) and ``generate_rollout``
(a whole rollout batch), both running rollwire agents through a rollwire gateway that is backed by
slime's own SGLang router.

The plumbing is thin on purpose: :class:`rollwire.trainer.client.RolloutClient` does sessions, payloads,
runners, deadlines and retries; the Sample building is the pure :func:`rollout_to_sample_dicts`.
Configuration comes from ``args.rollwire_*`` attributes, else ``ROLLWIRE_*`` environment
variables (see :class:`HookConfig` and the package README).
"""

from __future__ import annotations

import asyncio
import atexit
import importlib
import json
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rollwire.data.credit import StepCredit, parse_credit
from rollwire.data.protocol import CaptureMode, Rollout
from rollwire.data.trajectory import BuildMode, TrajectoryBuilder
from rollwire.metrics_sinks.step_logger import metrics_spec
from rollwire_slime.groups import apply_dynamic_filter, refuse_group_reading_paths
from rollwire_slime.samples import (
    METADATA_KEY,
    RoutingShape,
    batch_routing_shape,
    import_sample_class,
    rollout_sample_dicts,
)
from rollwire_slime.sampling import slime_sampling
from rollwire_slime.stamp import current_rollout_id, slime_stamp, stamp_setting

__all__ = [
    "HookConfig",
    "apply_dynamic_filter",
    "args_routing_shape",
    "generate",
    "generate_rollout",
    "rollout_to_sample_dicts",
    "slime_sampling",
    "slime_task",
]


def _setting(args: Any, name: str, environ: Mapping[str, str], default: Any = None) -> Any:
    value = getattr(args, f"rollwire_{name}", None)
    if value is not None:
        return value
    return environ.get(f"ROLLWIRE_{name.upper()}", default)


@dataclass
class HookConfig:
    """What the slime hooks need to know, from ``args.rollwire_<name>`` or ``$ROLLWIRE_<NAME>``.

    ``agent``: the agent as ``module:attr`` (a RolloutApp or handler; required for the local and
    ray runners) or the object itself. ``runner``: a runner spec (``local``, ``http:URL[,URL]``,
    ``ray[:ADDRESS]``, ``agentcore:ARN``). ``gateway_url`` + ``admin_key``: use a running gateway;
    unset, an in-process gateway is started once per process over slime's router
    (``http://{sglang_router_ip}:{sglang_router_port}``, kind ``sglang``), with
    ``gateway_options`` (JSON) passed to its config. ``metrics``: a metrics sink
    (``tensorboard:DIR``, ``mlflow:URI_OR_DIR``, ``wandb:DIR``) that ``generate_rollout`` logs each
    rollout step's statistics to (at slime's ``rollout_id``); unset, nothing is logged.
    ``step_credit``: ``broadcast``, ``discounted`` or ``discounted:GAMMA`` makes step rewards the
    samples' rewards (:mod:`rollwire_slime.versions`); unset, they are not used.
    """

    agent: Any = None
    runner: str = "local"
    gateway_url: Any = None
    admin_key: str | None = None
    capture: CaptureMode = "tokens"
    mode: BuildMode = "merge"
    deadline: float = 600.0
    failure_reward: float = 0.0
    concurrency: int = 256
    gateway_options: dict[str, Any] = field(default_factory=dict)
    router_url: str | None = None
    tokenizer_path: str | None = None
    #: slime replays routing (``--use-rollout-routing-replay``): sessions ask for routed experts
    routed_experts: bool = False
    metrics: str | None = None
    step_credit: StepCredit | None = None
    #: stamp the gateway with SGLang's weight version at each rollout id (:mod:`.stamp`)
    stamp_version: bool = True

    @classmethod
    def from_args(cls, args: Any, environ: Mapping[str, str] | None = None) -> HookConfig:
        """Resolve the settings; ``args.rollwire_*`` wins over ``$ROLLWIRE_*``."""
        env = os.environ if environ is None else environ
        options = _setting(args, "gateway_options", env, {})
        if isinstance(options, str):
            options = json.loads(options) if options.strip() else {}
        ip = getattr(args, "sglang_router_ip", None)
        port = getattr(args, "sglang_router_port", None)
        capture = str(_setting(args, "capture", env, "tokens"))
        if capture not in ("tokens", "passthrough"):
            raise ValueError(f"rollwire capture must be 'tokens' or 'passthrough', got {capture!r}")
        mode = str(_setting(args, "mode", env, "merge"))
        if mode not in ("merge", "per_call"):
            raise ValueError(f"rollwire mode must be 'merge' or 'per_call', got {mode!r}")
        return cls(
            agent=_setting(args, "agent", env),
            runner=str(_setting(args, "runner", env, "local")),
            gateway_url=_setting(args, "gateway_url", env),
            admin_key=_setting(args, "admin_key", env),
            capture=capture,  # type: ignore[arg-type]
            mode=mode,  # type: ignore[arg-type]
            deadline=float(_setting(args, "deadline", env, 600.0)),
            failure_reward=float(_setting(args, "failure_reward", env, 0.0)),
            concurrency=int(_setting(args, "concurrency", env, 256)),
            gateway_options=dict(options),
            router_url=f"http://{ip}:{port}" if ip and port else None,
            tokenizer_path=getattr(args, "hf_checkpoint", None),
            routed_experts=bool(getattr(args, "use_rollout_routing_replay", False)),
            metrics=metrics_spec(_setting(args, "metrics", env)),
            step_credit=parse_credit(_setting(args, "step_credit", env)),
            stamp_version=stamp_setting(_setting(args, "stamp_version", env, True)),
        )


# -- pure parts --------------------------------------------------------------------------------


def _get(sample: Any, name: str, default: Any = None) -> Any:
    if isinstance(sample, Mapping):
        return sample.get(name, default)
    return getattr(sample, name, default)


def slime_task(sample: Any) -> dict[str, Any]:
    """The rollwire task (payload row) for a slime sample: its metadata, ``prompt``, ``answer``."""
    meta = _get(sample, "metadata") or {}
    task = {k: v for k, v in meta.items() if k != METADATA_KEY} if isinstance(meta, Mapping) else {}
    task["prompt"] = _get(sample, "prompt", "")
    label = _get(sample, "label")
    if label is not None:
        task.setdefault("answer", label)
        task["label"] = label
    task["slime_index"] = _get(sample, "index")
    task["slime_group_index"] = _get(sample, "group_index")
    return task


def args_routing_shape(args: Any) -> RoutingShape | None:
    """``(num_layers, moe_router_topk)`` when slime replays routing (``--use-rollout-routing-replay``).

    The shape a placeholder's dummy routing needs when the hook cannot see the rest of the batch.
    """
    if not getattr(args, "use_rollout_routing_replay", False):
        return None
    layers, top_k = getattr(args, "num_layers", None), getattr(args, "moe_router_topk", None)
    if not layers or not top_k:
        raise ValueError(
            "--use-rollout-routing-replay is set but args.num_layers / args.moe_router_topk are "
            f"not ({layers!r}, {top_k!r}): rollwire needs them to shape placeholder routing"
        )
    return int(layers), int(top_k)


def rollout_to_sample_dicts(
    rollout: Rollout,
    sample: Any,
    *,
    mode: BuildMode = "merge",
    failure_reward: float = 0.0,
    native: bool = False,
    routing_shape: RoutingShape | None = None,
    rows: Any = None,
    replay: bool = False,
    step_credit: StepCredit | None = None,
) -> list[dict[str, Any]]:
    """The slime sample dicts for ``rollout``, which ran for the slime ``sample``.

    The rows keep the sample's ``group_index``, ``index``, ``prompt``, ``label`` and metadata
    (rollwire's ids added under ``metadata["rollwire"]``) and share ``rollout_id = index`` — the
    contract of slime's fan-out rollouts. ``routing_shape``: ``(layers, top_k)`` when the batch
    has routing (placeholders and rows without it get a dummy one; see
    :mod:`rollwire_slime.samples`); with ``replay`` (slime replays routing) a row whose routing
    is such a stand-in trains nothing. ``native``: routed experts as an int32 ndarray, for
    ``Sample.from_dict`` (nested lists otherwise).
    """
    index = _get(sample, "index")
    index = int(index) if index is not None else 0
    group_index = _get(sample, "group_index")
    meta = _get(sample, "metadata") or {}
    out = rollout_sample_dicts(
        rollout,
        group_index=int(group_index) if group_index is not None else 0,
        rollout_index=index,
        index_start=index,
        shared_index=True,
        mode=mode,
        failure_reward=failure_reward,
        metadata=dict(meta) if isinstance(meta, Mapping) else None,
        native=native,
        routing_shape=routing_shape,
        mask_missing_routing=replay,
        rows=rows,
        step_credit=step_credit,
    )
    for row in out:
        row["prompt"] = _get(sample, "prompt", row["prompt"])
        row["label"] = _get(sample, "label", row["label"])
        for key in (
            "multimodal_inputs",
            "multimodal_train_inputs",
            "generate_function_path",
            "train_metadata",
        ):
            row[key] = _get(sample, key, row[key])
    return out


# -- process state -----------------------------------------------------------------------------
# slime loads hooks by path and calls them as plain functions, so there is no object to hold the
# gateway between calls; one per router URL lives here for the process (slime's own
# GenerateState is a singleton for the same reason). The local runner is shared for the same
# reason: closing it would cancel other rollouts of the same agent app.

_LOCK = threading.Lock()
_GATEWAYS: dict[tuple[str, str], Any] = {}
_LOCAL_RUNNERS: dict[int, Any] = {}


def _stop_gateways() -> None:
    with _LOCK:
        gateways = list(_GATEWAYS.values())
        _GATEWAYS.clear()
    for gw in gateways:
        gw.stop()


atexit.register(_stop_gateways)


def _gateway(cfg: HookConfig) -> Any:
    if cfg.gateway_url is not None and not isinstance(cfg.gateway_url, str):
        return cfg.gateway_url  # a running gateway object (tests, notebooks)
    if cfg.gateway_url:
        if not cfg.admin_key:
            raise ValueError(
                f"the rollwire gateway at {cfg.gateway_url} needs its admin key: set "
                "ROLLWIRE_ADMIN_KEY (or args.rollwire_admin_key)"
            )
        return _External(cfg.gateway_url, cfg.admin_key)
    if cfg.router_url is None:
        raise ValueError(
            "no rollwire gateway: set ROLLWIRE_GATEWAY_URL, or run under slime so that "
            "args.sglang_router_ip/sglang_router_port name the router to serve from"
        )
    key = (cfg.router_url, json.dumps(cfg.gateway_options, sort_keys=True, default=str))
    with _LOCK:
        gw = _GATEWAYS.get(key)
        if gw is None:
            from rollwire.gateway import serve_in_thread

            if cfg.capture == "tokens" and cfg.tokenizer_path:
                # the gateway renders chat templates itself in tokens mode; slime's checkpoint
                # folder has the tokenizer (the router may not advertise one)
                os.environ.setdefault("ROLLWIRE_TOKENIZER", str(cfg.tokenizer_path))
            gw = serve_in_thread(backends=[(cfg.router_url, "sglang")], **cfg.gateway_options)
            _GATEWAYS[key] = gw
    return gw


@dataclass
class _External:
    url: str
    admin_key: str


def _agent(cfg: HookConfig) -> Any:
    agent = cfg.agent
    if isinstance(agent, str):
        module, sep, attr = agent.partition(":")
        if not sep:
            raise ValueError(f"rollwire agent must be 'module:attr', got {agent!r}")
        agent = getattr(importlib.import_module(module), attr)
    return agent


def _runner(cfg: HookConfig) -> tuple[Any, Any, str | None]:
    """``(runner, app, app_path)`` for RolloutClient; a local runner is shared per agent."""
    kind = cfg.runner.partition(":")[0]
    app_path = cfg.agent if isinstance(cfg.agent, str) else None
    if kind != "local":
        return cfg.runner, None, app_path
    if cfg.agent is None:
        raise ValueError(
            "the local runner needs the agent: set ROLLWIRE_AGENT=module:app (a RolloutApp or "
            "handler), or ROLLWIRE_RUNNER=http:URL for agents served elsewhere"
        )
    agent = _agent(cfg)
    with _LOCK:
        runner = _LOCAL_RUNNERS.get(id(agent))
        if runner is None:
            from rollwire.trainer.runners import LocalRunner

            runner = LocalRunner(agent, failure_reward=cfg.failure_reward)
            _LOCAL_RUNNERS[id(agent)] = runner
    return runner, None, None


def _client(cfg: HookConfig, group_size: int, sampling: Mapping[str, Any]) -> Any:
    from rollwire.trainer.client import RolloutClient

    runner, app, app_path = _runner(cfg)
    return RolloutClient(
        _gateway(cfg),
        runner=runner,
        app=app,
        app_path=app_path,
        group_size=group_size,
        sampling=sampling,
        capture=cfg.capture,
        concurrency=cfg.concurrency,
        deadline=cfg.deadline,
        failure_reward=cfg.failure_reward,
        # streamed passthrough calls are then asked non-streamed, so routing is captured
        session_options={"routed_experts": True} if cfg.routed_experts else None,
    )


async def _stamp(cfg: HookConfig, rollout_id: int | None, evaluation: bool = False) -> None:
    if cfg.stamp_version and rollout_id is not None:
        gateway = _gateway(cfg)
        await slime_stamp(gateway).after_sync(gateway, cfg.router_url, rollout_id, evaluation)


# -- the hooks ---------------------------------------------------------------------------------


async def generate(
    args: Any, sample: Any, sampling_params: dict[str, Any], evaluation: bool = False
) -> Any:
    """``--custom-generate-function-path rollwire_slime.generate``: one rollwire rollout per sample.

    Returns the rollout's rows as ``list[Sample]`` sharing ``rollout_id`` (slime's fan-out form;
    one element when nothing forked, a placeholder when no call was usable), always a list so
    slime's flattening sees one depth. The reward comes from the agent, so slime's reward model
    is not called. Refuses ``--dynamic-sampling-filter-path`` and ``--partial-rollout`` (see
    :func:`rollwire_slime.groups.refuse_group_reading_paths`) outside evaluation.
    """
    if not evaluation:
        refuse_group_reading_paths(args)
    cfg = HookConfig.from_args(args)
    sample_cls = import_sample_class()
    await _stamp(cfg, current_rollout_id(), evaluation)
    client = _client(cfg, 1, slime_sampling(sampling_params))
    (group,) = await client.arun([slime_task(sample)])
    (rollout,) = group.rollouts
    dicts = rollout_to_sample_dicts(
        rollout,
        sample,
        mode=cfg.mode,
        failure_reward=cfg.failure_reward,
        native=True,
        routing_shape=args_routing_shape(args),
        replay=bool(getattr(args, "use_rollout_routing_replay", False)),
        step_credit=cfg.step_credit,
    )
    return [sample_cls.from_dict(d) for d in dicts]


def _default_sampling(args: Any) -> dict[str, Any]:
    return slime_sampling(
        {
            "temperature": getattr(args, "rollout_temperature", None),
            "top_p": getattr(args, "rollout_top_p", None),
            "top_k": getattr(args, "rollout_top_k", None),
            "max_new_tokens": getattr(args, "rollout_max_response_len", None),
            "stop": getattr(args, "rollout_stop", None),
            "stop_token_ids": getattr(args, "rollout_stop_token_ids", None),
        }
    )


async def collect_groups(
    args: Any, groups: list[list[Any]], cfg: HookConfig, step: int | None = None
) -> tuple[list[list[dict[str, Any]]], dict[str, Any]]:
    """Run slime's prompt groups through rollwire; the sample dicts ``[group][sample]`` (a forked
    rollout's rows consecutive) in the order of ``groups``, and rollwire's run statistics as slime
    metrics. With ``cfg.metrics``, the batch's statistics are logged there at ``step``."""
    if not groups:
        return [], {}
    n = len(groups[0])
    if any(len(g) != n for g in groups):
        raise ValueError(
            f"slime groups differ in size ({sorted({len(g) for g in groups})}); expected n_samples_per_prompt each"
        )
    await _stamp(cfg, step)
    client = _client(cfg, n, _default_sampling(args))
    tasks = []
    for position, group in enumerate(groups):
        task = slime_task(group[0])
        task["slime_position"] = position
        tasks.append(task)
    done_groups: list[list[Rollout] | None] = [None] * len(groups)
    async for done in client.stream(tasks):
        done_groups[int((done.task or {})["slime_position"])] = list(done.rollouts)
    missing = [i for i, g in enumerate(done_groups) if g is None]
    if missing:
        raise RuntimeError(f"rollwire returned no rollouts for slime groups {missing}")
    builder = TrajectoryBuilder(cfg.mode, credit=cfg.step_credit)
    built = [[builder.build(r) for r in g or []] for g in done_groups]
    # the routing shape is the batch's: slime stacks one routing tensor per sample
    shape = batch_routing_shape(row for g in built for rows in g for row in rows)
    shape = shape or args_routing_shape(args)
    out: list[list[dict[str, Any]]] = []
    for slime_group, rollouts, group_rows in zip(groups, done_groups, built):
        flat: list[dict[str, Any]] = []
        for r, s, rows in zip(rollouts or [], slime_group, group_rows):
            flat.extend(
                rollout_to_sample_dicts(
                    r,
                    s,
                    failure_reward=cfg.failure_reward,
                    native=True,
                    routing_shape=shape,
                    rows=rows,
                    replay=bool(getattr(args, "use_rollout_routing_replay", False)),
                    step_credit=cfg.step_credit,
                )
            )
        out.append(flat)
    stats = client.stats
    if cfg.metrics:
        from rollwire.metrics_sinks.step_logger import shared_step_logger

        rows_by = {
            r.rollout_id: rows for g, b in zip(done_groups, built) for r, rows in zip(g or [], b)
        }
        rollouts = [r for g in done_groups for r in g or []]
        shared_step_logger(cfg.metrics).log_groups(
            rollouts, step, rows_by_rollout=rows_by, wall_s=stats.wall_s
        )
    metrics = {
        "rollwire/rollouts": stats.rollouts,
        "rollwire/failed": stats.failed,
        "rollwire/undeliverable": stats.undeliverable,
        "rollwire/infra_retries": stats.infra_retries,
        "rollwire/wall_s": stats.wall_s,
    }
    return out, metrics


def _run(coro: Any) -> Any:
    try:
        from slime.utils.async_utils import run as slime_run  # slime's persistent rollout loop
    except ImportError:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(coro)
        raise RuntimeError(
            "generate_rollout is synchronous and was called inside a running event loop"
        ) from None
    return slime_run(coro)


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """``--rollout-function-path rollwire_slime.generate_rollout``: a whole batch via rollwire.

    Takes ``args.rollout_batch_size`` prompt groups from ``data_source.get_samples``, runs each as
    a rollwire group of ``n_samples_per_prompt`` rollouts (``RolloutClient.stream``), and returns
    them as ``[group][sample]`` Samples — flat groups, a forked rollout contributing several that
    share ``rollout_id`` — filtered by ``--dynamic-sampling-filter-path`` when set (a
    ``RolloutFnTrainOutput`` with rollwire's counters as metrics when slime has that type).
    With ``ROLLWIRE_METRICS`` set, the step's statistics are logged there at ``rollout_id``.
    Evaluation is delegated to slime's default rollout, which calls
    ``--custom-generate-function-path`` per sample.
    """
    if evaluation:
        from slime.rollout.sglang_rollout import generate_rollout as slime_generate_rollout

        return slime_generate_rollout(args, rollout_id, data_source, evaluation=True)
    cfg = HookConfig.from_args(args)
    sample_cls = import_sample_class()
    groups = data_source.get_samples(int(getattr(args, "rollout_batch_size", 1)))
    nested, metrics = _run(collect_groups(args, groups, cfg, step=int(rollout_id)))
    samples = [[sample_cls.from_dict(d) for d in g] for g in nested]
    samples = apply_dynamic_filter(args, samples, metrics)
    try:
        from slime.rollout.base_types import RolloutFnTrainOutput
    except ImportError:
        return samples
    return RolloutFnTrainOutput(samples=samples, metrics=metrics)
