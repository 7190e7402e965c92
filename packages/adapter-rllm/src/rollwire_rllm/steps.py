"""rLLM's trainer step as the gateway's policy version (issue 24.5), for :class:`RollwireAgentFlow`.

rLLM pushes its own weights, and tells the flow nothing: ``AgentFlowEngine`` calls
``flow.arun(task, config)`` with rLLM's ``AgentConfig`` (no step). What it does know is the step:
the trainer calls ``engine.set_training_step(global_step, mode, epoch)`` before each batch
(``UnifiedTrainer._train_batch_async``), and the engine keeps it as ``engine.current_step``. So
the flow follows the engine that runs it — found once, on its first ``arun``, among the callers
(``AgentFlowEngine._run_flow_only`` → ``run_agent_flow`` → ``arun``), or given with
``flow.attach(engine)`` — and each ``arun`` compares the engine's step with the last one it
stamped (an attribute read; the gateway is called once per step per process):

- ``follow="step"`` (rLLM's on-policy loop, the default): step ``S`` rolls out on the weights
  rLLM's verl backend pushed at the end of step ``S - 1`` (``on_batch_end``:
  ``checkpoint_manager.update_weights(global_step)``; ``on_train_start`` pushed the loaded step),
  so the version is ``S - 1`` (at least 0). A validation at step ``S`` runs after that step's push
  and is labelled one behind (it is not trained); the label is never ahead of the weights.
- ``follow="weight_version"`` (``rllm.async_training.enable``): the fully-async loop calls
  ``set_training_step`` once per epoch and counts syncs instead
  (``UnifiedTrainer._perform_weight_sync``: ``weight_version = coordinator.weight_version + 1``,
  then ``gateway.aset_weight_version(v)``), and its staleness is
  ``coordinator.weight_version - Step.weight_version``. The flow follows those calls on the
  engine's rLLM gateway (wrapped once, per instance; the version rLLM set before the flow was
  found is read once from it) and stamps ``v`` at the next ``arun``.

``follow=None`` stamps nothing.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Literal

from rollwire.trainer.step_stamp import StepStamp, stamp_client

__all__ = ["Follow", "StepFollower", "hosting_engine"]

log = logging.getLogger("rollwire.rllm")

Follow = Literal["step", "weight_version"]
_MARK = "_rollwire_followers"


def hosting_engine(depth: int = 16) -> Any:
    """The rLLM engine whose coroutine awaits the caller (an object with ``set_training_step``
    and ``current_step`` bound as ``self`` in a frame up the await chain), or None."""
    frame = sys._getframe(1)
    for _ in range(depth):
        frame = frame.f_back  # type: ignore[assignment]
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if callable(getattr(owner, "set_training_step", None)) and hasattr(owner, "current_step"):
            return owner
    return None


class StepFollower:
    """What :class:`RollwireAgentFlow` knows of rLLM's steps, and its stamps of the gateway."""

    def __init__(self, follow: Follow | None = "step") -> None:
        if follow not in ("step", "weight_version", None):
            raise ValueError(f"follow must be 'step', 'weight_version' or None, got {follow!r}")
        self.follow = follow
        self.engine: Any = None
        self.weight_version: int | None = None
        self.stamp = StepStamp()

    def attach(self, engine: Any) -> None:
        """Follow ``engine`` (rLLM's ``AgentFlowEngine``; a ``UnifiedTrainer`` gives its
        ``agent_workflow_engine``). Safe to call twice."""
        engine = getattr(engine, "agent_workflow_engine", None) or engine
        self.engine = engine
        if self.follow == "weight_version":
            self._wrap_gateway(getattr(engine, "gateway", None))

    def version(self) -> int | None:
        """The version the followed trainer serves now, or None when unknown."""
        if self.follow == "weight_version":
            return self.weight_version
        step = getattr(self.engine, "current_step", None)
        return max(int(step) - 1, 0) if type(step) is int else None

    async def before_rollout(self, gateway: Any) -> bool:
        """At each ``arun``: stamp the followed version on ``gateway`` if it is new; whether the
        gateway's version moved. Finds the hosting engine on the first call."""
        if self.follow is None:
            return False
        if self.engine is None:  # a walk of a few frames: cheap enough to retry per rollout
            engine = hosting_engine()
            if engine is not None:
                self.attach(engine)
                await self._read_weight_version()
        version = self.version()
        if version is None or not self.stamp.is_new(version):
            return False
        return await self.stamp_now(gateway, version)

    async def stamp_now(self, gateway: Any, version: int) -> bool:
        """Stamp ``version`` (label ``str(version)``, rLLM's int) on ``gateway``."""
        client = stamp_client(gateway)
        if client is None:
            return False
        try:
            return await self.stamp.astamp(client, version)
        finally:
            await client.aclose()

    def _wrap_gateway(self, manager: Any) -> None:
        """Hear rLLM's ``(a)set_weight_version`` on its gateway manager (per instance, once)."""
        if manager is None or self in getattr(manager, _MARK, ()):
            return
        sync_set = getattr(manager, "set_weight_version", None)
        async_set = getattr(manager, "aset_weight_version", None)
        if sync_set is None or async_set is None:
            log.warning("rollwire: rLLM's gateway %r announces no weight versions", manager)
            return
        follower = self

        def set_weight_version(weight_version: int) -> Any:
            out = sync_set(weight_version)
            follower.weight_version = int(weight_version)
            return out

        async def aset_weight_version(weight_version: int) -> Any:
            out = await async_set(weight_version)
            follower.weight_version = int(weight_version)
            return out

        manager.set_weight_version = set_weight_version
        manager.aset_weight_version = aset_weight_version
        setattr(manager, _MARK, (*getattr(manager, _MARK, ()), self))

    async def _read_weight_version(self) -> None:
        """The version rLLM set before this flow was found (``fit_async`` sets it first)."""
        if self.follow != "weight_version" or self.weight_version is not None:
            return
        client = getattr(getattr(self.engine, "gateway", None), "async_client", None)
        try:
            got = await client.get_weight_version() if client is not None else None
        except Exception as exc:  # rLLM's gateway unreachable: wait for the next sync
            log.debug("could not read rLLM's weight version: %r", exc)
            return
        if type(got) is int:
            self.weight_version = got
