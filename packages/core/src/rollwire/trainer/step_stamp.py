"""Stamping a gateway with a trainer's step as its policy version, for trainers that push their
own weights (verl, slime, rLLM: their adapters call :meth:`StepStamp.astamp` from the hook the
trainer already runs after each of its weight syncs).

A stamp sets the served policy version (``POST /api/policy_version``, label and ordinal ``seq`` =
the step) and where the trainer is (``POST /api/trainer_version``, the same step), so every call
the gateway records afterwards carries that version, and ``max_staleness`` is measured in steps.

- **Idempotent**: many workers see the same step. Only a newer step moves the gateway (or the same
  step with another label: a re-sync within one step); an older or repeated one is ignored, not an
  error. The check reads the gateway first (``GET /api/trainer_version``), so a worker that sees
  a step late never moves the version back.
- **Cheap**: a process stamps each step once, whatever the number of rollouts; coroutines that
  meet a new step together wait for one stamp (so their calls carry it) instead of each sending it.
- **Never fatal**: a gateway that cannot be reached or refuses is logged (once per step) and the
  run goes on with the versions it had; a gateway object without a control-plane URL is skipped.

The read-then-write is not atomic across processes: two workers that read before either writes,
with different steps, could leave the older one. Workers see a new step at about the same time,
a full step after the previous one, so that needs a worker a whole step late at its first rollout.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

__all__ = ["StampTarget", "StepStamp", "stamp_client"]

log = logging.getLogger("rollwire.trainer")


class StampTarget(Protocol):
    """The three control-plane routes a stamp uses (:class:`~rollwire.trainer.gateway_client.AsyncGatewayClient`
    has them)."""

    async def staleness(self) -> dict[str, Any]: ...

    async def set_policy_version(self, version: str, *, seq: int | None = None) -> str: ...

    async def set_trainer_version(
        self, seq: int | None, version: str | None = None
    ) -> dict[str, Any]: ...


def stamp_client(gateway: Any) -> Any:
    """An :class:`~rollwire.trainer.gateway_client.AsyncGatewayClient` for ``gateway`` (a URL string
    is not enough: it needs ``url`` and ``admin_key``), or None when it has no control-plane URL."""
    from rollwire.trainer.gateway_client import AsyncGatewayClient

    url, key = getattr(gateway, "url", None), getattr(gateway, "admin_key", None)
    if not isinstance(url, str) or not url:
        return None
    return AsyncGatewayClient(url, key if isinstance(key, str) else None)


class StepStamp:
    """One process's stamps of one gateway (see the module docstring).

    ``step`` / ``version``: the newest step this process stamped or tried to (a failed stamp is
    not retried for the same step: once per step). ``moved``: how many stamps moved the gateway.
    """

    def __init__(self) -> None:
        self.step: int | None = None
        self.version: str | None = None
        self.moved = 0
        self.failed = 0
        self._locks: dict[int, asyncio.Lock] = {}  # per event loop: a lock is bound to its loop

    def is_new(self, step: int, version: str | None = None) -> bool:
        """Whether stamping ``step`` (labelled ``version``, default ``str(step)``) could move
        anything this process knows of: False for an older step, or the same step and label."""
        if self.step is None:
            return True
        label = str(step) if version is None else version
        return step > self.step or (step == self.step and label != self.version)

    async def astamp(
        self, client: StampTarget | None, step: int, version: str | None = None
    ) -> bool:
        """Stamp ``step`` (label ``version``, default ``str(step)``) on the gateway ``client``
        talks to, unless it is not new; whether the gateway's policy version moved."""
        if type(step) is not int or step < 0:
            raise ValueError(f"a trainer step to stamp must be a whole number >= 0, got {step!r}")
        label = str(step) if version is None else str(version)
        if client is None or not self.is_new(step, label):
            return False
        async with self._lock():
            if not self.is_new(step, label):
                return False  # another coroutine of this process stamped it meanwhile
            try:
                moved = await _apply(client, step, label)
            except Exception as exc:  # the run goes on with the versions it had
                self.failed += 1
                log.warning(
                    "rollwire: could not stamp policy version %r (step %d) on the gateway: %s; "
                    "calls keep the version the gateway had",
                    label,
                    step,
                    exc,
                )
                moved = False
            self.step, self.version = step, label
            self.moved += int(moved)
            return moved

    def _lock(self) -> asyncio.Lock:
        key = id(asyncio.get_running_loop())
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock


async def _apply(client: StampTarget, step: int, label: str) -> bool:
    """Read where the gateway is; move the served version (then the trainer's ordinal) forward."""
    state = await client.staleness()
    seq, current = state.get("policy_seq"), state.get("policy_version")
    seq = seq if type(seq) is int else 0
    moved = current is None or step > seq or (step == seq and label != current)
    if moved:
        # the served version first: the lag never reads positive in between
        await client.set_policy_version(label, seq=step)
    trainer = state.get("trainer_seq")
    if type(trainer) is not int or step > trainer:
        await client.set_trainer_version(step, label)
    return moved
