"""The runner interface: how the trainer hands a rollout payload to an agent."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

__all__ = ["RateLimiter", "Runner", "RunnerError"]


class RunnerError(RuntimeError):
    """The runner could not deliver the invocation: an infrastructure error, not a failed rollout.

    ``retryable`` is False when retrying cannot help (the agent refused the payload as invalid).
    """

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class RateLimiter:
    """At most ``rate`` acquisitions per second, spaced evenly (a leaky bucket); None = unlimited."""

    def __init__(self, rate: float | None) -> None:
        if rate is not None and rate <= 0:
            raise ValueError(f"rate must be positive (per second) or None, got {rate}")
        self.rate = rate
        self._next = 0.0
        self._lock: asyncio.Lock | None = None

    async def acquire(self) -> None:
        """Wait for the next free slot."""
        if self.rate is None:
            return
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            loop = asyncio.get_running_loop()
            now = loop.time()
            wait = self._next - now
            self._next = max(now, self._next) + 1.0 / self.rate
        if wait > 0:
            await asyncio.sleep(wait)


@runtime_checkable
class Runner(Protocol):
    """Delivers rollout payloads to agents. ``invoke`` returns once the agent accepted the rollout
    (it runs on in the background and reports to the gateway); it raises :class:`RunnerError` when
    the agent could not be reached. Optional: ``release(session_id)`` frees per-session resources
    once a rollout is terminal; ``drain(session_ids)`` ends a run for a runner the client does not
    own (it is called instead of ``aclose``) with the ids of that run's sessions. A runner may be
    shared by concurrent runs, on several event loops: ``drain`` must wait for, and free, only
    what belongs to those sessions, and never close a pool another run still uses. (A ``drain()``
    that takes no argument is still called, without the ids.)"""

    async def invoke(self, payload: Mapping[str, Any], session_id: str) -> None:
        """Start the rollout in ``payload`` for ``session_id``."""
        ...

    async def aclose(self) -> None:
        """Release connections, workers and background rollouts."""
        ...
