"""``RollwireAgentFlow``: an rLLM AgentFlow whose model calls go through rollwire's gateway.

rLLM's ``AgentFlow`` protocol is ``run(task, config) -> Episode`` (sync) with an optional async
``arun``, which rLLM's ``run_agent_flow`` prefers inside an event loop. Both are here. The agent is
any rollwire agent (a :class:`rollwire.agent.app.RolloutApp` or handler, or agents behind a runner); the
Episode is built from the calls rollwire captured, so its token ids are exactly the sampled ones.

The flow replaces rLLM's model gateway: ``config.base_url`` is rLLM's per-session URL
(``gateway.get_session_url(uid)``), not an inference server, so it is never used; rollwire's
gateway must be given (``gateway=``) or built over the real inference servers (``backends=``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from rollwire.data.protocol import CaptureMode, Rollout
from rollwire.data.trajectory import BuildMode, TokenizerLike
from rollwire.metrics_sinks import step_logger
from rollwire_rllm.episodes import (
    INFO_KEY,
    episode_from_dict,
    import_rllm,
    rollout_episode_dict,
)
from rollwire_rllm.routing import RoutingFormat
from rollwire_rllm.steps import Follow, StepFollower

__all__ = ["RollwireAgentFlow", "rllm_task"]


def rllm_task(task: Any) -> dict[str, Any]:
    """The rollwire task (payload row) for an rLLM task: a dict as is, or a ``Task``'s fields."""
    if isinstance(task, Mapping):
        return dict(task)
    instruction = getattr(task, "instruction", None)
    if instruction is not None:
        out = dict(getattr(task, "metadata", None) or {})
        out["prompt"] = instruction
        task_id = getattr(task, "id", None)
        if task_id is not None:
            out["task_id"] = str(task_id)
        return out
    data = getattr(task, "data", None)  # rLLM's eval Task(data, spec)
    if isinstance(data, Mapping):
        return dict(data)
    return {"prompt": task}


def _episode_id(task_id: str, config: Any) -> tuple[str, int]:
    uid = getattr(config, "session_uid", None)
    meta = getattr(config, "metadata", None) or {}
    idx = meta.get("rollout_idx", 0) if isinstance(meta, Mapping) else 0
    if isinstance(uid, str) and ":" in uid:
        head, _, tail = uid.rpartition(":")
        if tail.isdigit():
            return head, int(tail)
    return task_id, int(idx)


class RollwireAgentFlow:
    """Runs one rollwire rollout per ``run``/``arun`` and returns its rLLM ``Episode``.

    ``agent``: a RolloutApp or handler (local runner), or None with ``runner="http:URL"`` etc.
    ``gateway``: a running gateway object or URL (with ``admin_key``); else ``backends``, the
    inference servers (``[(url, kind)]``) an in-process gateway is started over on first use.
    One of the two is required: rLLM's ``config.base_url`` is its own gateway's per-session URL.
    ``sampling``: defaults for every rollout; rLLM's ``config.sampling_params`` (its train or
    validation block) override them per rollout.
    ``native``: return rLLM objects (default: when rLLM is importable) or the dict form.
    ``routing_format``: ``Step.routing_matrices`` for rLLM's verl backend (``"verl"``, default) or
    its Tinker/Fireworks path (``"tinker"``); see :mod:`rollwire_rllm.routing`.
    ``routed_experts``: the model is MoE and trained with routing replay — the gateway then asks
    streamed passthrough calls non-streamed so that every call carries routing.
    ``metrics``: a metrics sink (``tensorboard:DIR``, ``mlflow:URI_OR_DIR``, ``wandb:DIR``; default
    ``$ROLLWIRE_METRICS``, unset: none). rLLM hands a flow one rollout at a time and no trainer
    step, so every ``metrics_every`` training rollouts (default ``$ROLLWIRE_METRICS_EVERY``, else
    64) are logged as one step; :meth:`flush_metrics` logs the rest (``close`` calls it).
    Validation rollouts are not logged.
    ``follow``: stamp the gateway's policy version with rLLM's step (``"step"``, its on-policy
    loop) or the weight version its fully-async loop announces (``"weight_version"``), taken from
    the rLLM engine that runs the flow (:mod:`rollwire_rllm.steps`); None: do not stamp.
    """

    def __init__(
        self,
        agent: Any = None,
        *,
        gateway: Any = None,
        admin_key: str | None = None,
        backends: Sequence[Any] = (),
        runner: str = "local",
        capture: CaptureMode = "passthrough",
        sampling: Mapping[str, Any] | None = None,
        deadline: float = 600.0,
        failure_reward: float = 0.0,
        trajectory_name: str = "agent",
        mode: BuildMode = "merge",
        tokenizer: TokenizerLike | None = None,
        native: bool | None = None,
        gateway_options: Mapping[str, Any] | None = None,
        routing_format: RoutingFormat = "verl",
        routed_experts: bool = False,
        metrics: str | None = None,
        metrics_every: int | None = None,
        follow: Follow | None = "step",
    ) -> None:
        if runner.partition(":")[0] == "local" and agent is None:
            raise ValueError(
                "RollwireAgentFlow with the local runner needs agent=<RolloutApp or handler>"
            )
        if gateway is None and not backends:
            raise ValueError(
                "RollwireAgentFlow needs gateway=<running rollwire gateway or URL> or "
                "backends=[(inference_server_url, kind)]: rLLM's config.base_url is its own "
                "gateway's per-session URL, not an inference server"
            )
        self.agent = agent
        self.gateway = gateway
        self.admin_key = admin_key
        self.backends = list(backends)
        self.runner = runner
        self.capture: CaptureMode = capture
        self.sampling = dict(sampling or {})
        self.deadline = deadline
        self.failure_reward = failure_reward
        self.trajectory_name = trajectory_name
        self.mode: BuildMode = mode
        self.tokenizer = tokenizer
        self.native = native
        self.routing_format: RoutingFormat = routing_format
        self.routed_experts = routed_experts
        self.gateway_options = dict(gateway_options or {})
        self.metrics = step_logger.metrics_spec(metrics)
        self.metrics_every = step_logger.metrics_every(metrics_every)
        self._lock = threading.Lock()
        self._embedded: Any = None
        self._local_runner: Any = None
        self.steps = StepFollower(follow)

    # -- plumbing ---------------------------------------------------------------------------------

    def _gateway(self) -> Any:
        if isinstance(self.gateway, str):
            if not self.admin_key:
                raise ValueError(f"the rollwire gateway at {self.gateway} needs admin_key=...")
            return _Gateway(self.gateway, self.admin_key)
        if self.gateway is not None:
            return self.gateway
        with self._lock:
            if self._embedded is None:
                from rollwire.gateway import serve_in_thread

                self._embedded = serve_in_thread(backends=self.backends, **self.gateway_options)
            return self._embedded

    def sampling_for(self, config: Any) -> dict[str, Any]:
        """The rollout's session sampling: the flow's defaults under ``config.sampling_params``."""
        params = getattr(config, "sampling_params", None)
        return {**self.sampling, **(dict(params) if isinstance(params, Mapping) else {})}

    def _runner(self) -> Any:
        if self.runner.partition(":")[0] != "local":
            return self.runner  # RolloutClient builds and closes it per run
        # one shared local runner: closing it cancels every rollout of the agent app
        with self._lock:
            if self._local_runner is None:
                from rollwire.trainer.runners import LocalRunner

                self._local_runner = LocalRunner(self.agent, failure_reward=self.failure_reward)
            return self._local_runner

    async def _rollout(self, task: dict[str, Any], config: Any) -> Rollout:
        from rollwire.trainer.client import RolloutClient

        client = RolloutClient(
            self._gateway(),
            runner=self._runner(),
            group_size=1,
            sampling=self.sampling_for(config),
            capture=self.capture,
            model=str(getattr(config, "model", None) or "policy"),
            deadline=self.deadline,
            failure_reward=self.failure_reward,
            session_options={"routed_experts": True} if self.routed_experts else None,
        )
        (group,) = await client.arun([task])
        (rollout,) = group.rollouts
        return rollout

    def episode(self, rollout: Rollout, task: Any, config: Any = None) -> Any:
        """The Episode (object or dict, per ``native``) for a finished rollout of ``task``."""
        payload = rllm_task(task)
        task_id, idx = _episode_id(str(payload.get("task_id") or rollout.task_id or "0"), config)
        data = rollout_episode_dict(
            rollout,
            rollout_idx=idx,
            task_id=task_id,
            task=task if isinstance(task, Mapping) else payload,
            tokenizer=self.tokenizer,
            trajectory_name=self.trajectory_name,
            failure_reward=self.failure_reward,
            mode=self.mode,
            routing_format=self.routing_format,
        )
        data["info"][INFO_KEY]["is_validation"] = bool(getattr(config, "is_validation", False))
        native = self.native
        if native is None:
            try:
                import_rllm()
                native = True
            except ImportError:
                native = False
        return episode_from_dict(data) if native else data

    # -- the AgentFlow protocol -------------------------------------------------------------------

    def attach(self, engine: Any) -> None:
        """Follow the steps of ``engine`` (rLLM's ``AgentFlowEngine``, or a ``UnifiedTrainer``):
        what the flow otherwise finds on its first ``arun`` (:mod:`rollwire_rllm.steps`)."""
        self.steps.attach(engine)

    async def arun(self, task: Any, config: Any = None) -> Any:
        """Run the agent on ``task`` through rollwire; the Episode of what the policy sampled.
        The first rollout of a new rLLM step stamps its policy version on the gateway first."""
        await self.steps.before_rollout(self._gateway())
        rollout = await self._rollout(rllm_task(task), config)
        if self.metrics and not getattr(config, "is_validation", False):
            self._metrics_logger().add(rollout)
        return self.episode(rollout, task, config)

    def _metrics_logger(self) -> step_logger.StepLogger:
        assert self.metrics is not None
        return step_logger.shared_step_logger(
            self.metrics, every=self.metrics_every, tokenizer=self.tokenizer
        )

    def flush_metrics(self) -> dict[str, float] | None:
        """Log the training rollouts not yet logged as one step (at a trainer step's end)."""
        return self._metrics_logger().flush() if self.metrics else None

    def run(self, task: Any, config: Any = None) -> Any:
        """Blocking :meth:`arun` (rLLM runs a sync flow in a worker thread, without a loop)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.arun(task, config))
        raise RuntimeError(
            "RollwireAgentFlow.run() was called inside a running event loop; use `await flow.arun(...)`"
        )

    def close(self) -> None:
        """Log the rollouts not yet logged; stop the in-process gateway, if this flow started one."""
        self.flush_metrics()
        with self._lock:
            gw, self._embedded = self._embedded, None
        if gw is not None:
            gw.stop()

    def __enter__(self) -> RollwireAgentFlow:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Gateway:
    def __init__(self, url: str, admin_key: str) -> None:
        self.url = url
        self.admin_key = admin_key
