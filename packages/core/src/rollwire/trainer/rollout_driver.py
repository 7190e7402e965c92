"""One rollout's life on the trainer side: create its session, build its payload, deliver it
(retrying only what the runner could not deliver), wait for its terminal record and fetch it.

:class:`RolloutDriver` is the part of :class:`~rollwire.trainer.client.RolloutClient` that works
on one rollout; its settings (deadlines, retries, failure reward, stats) are the client's.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rollwire.agent.context import PAYLOAD_KEY
from rollwire.data.foreign import foreign_payload
from rollwire.data.protocol import TERMINAL_STATUSES, CaptureMode, Rollout
from rollwire.trainer.control_plane import (
    ControlPlane,
    GatewayError,
    GatewayUnavailable,
    transient,
)
from rollwire.trainer.runners.base import RateLimiter, Runner, RunnerError

if TYPE_CHECKING:
    from rollwire.trainer.client import RunStats

__all__ = ["RolloutDriver"]

log = logging.getLogger("rollwire.trainer.client")


class RolloutDriver:
    """Drives single rollouts for a :class:`~rollwire.trainer.client.RolloutClient`."""

    gateway_url: str
    sampling: dict[str, Any]
    capture: CaptureMode
    model: str
    deadline: float
    deadline_grace: float
    infra_retries: int
    retry_backoff: float
    gateway_timeout: float
    failure_reward: float
    session_options: dict[str, Any]
    payload_format: str
    stats: RunStats

    async def _rollout(
        self,
        gw: ControlPlane,
        runner: Runner,
        sem: asyncio.Semaphore,
        limiter: RateLimiter,
        task: dict[str, Any],
        task_id: str,
        group_id: str,
        index: int,
        tick: Callable[[Rollout], None],
        sids: list[str],
        deadline: float | None = None,
    ) -> Rollout:
        deadline = self.deadline if deadline is None else deadline
        async with sem:
            await limiter.acquire()
            # A session the gateway refuses to create (4xx) is a configuration error that every
            # rollout would hit: it ends the run, like a gateway that stays unreachable.
            handle = await self._gateway(
                "create a session",
                lambda: gw.create_session(
                    group_id=group_id,
                    task_id=task_id,
                    # session_options["metadata"] (e.g. an evaluation's mark) joins the index
                    metadata={**self.session_options.get("metadata", {}), "rollout_index": index},
                    sampling=self.sampling,
                    capture=self.capture,
                    ttl=int(deadline + self.deadline_grace + 300),
                    **{k: v for k, v in self.session_options.items() if k != "metadata"},
                ),
            )
            sid = handle.session_id
            sids.append(sid)
            deadline_at = time.time() + deadline
            payload = {k: v for k, v in task.items() if k != PAYLOAD_KEY}
            payload[PAYLOAD_KEY] = {
                "version": 1,
                "session_id": sid,
                "base_url": handle.base_url,
                "api_key": handle.token,
                "model": self.model,
                "sampling": self.sampling,
                "complete_url": handle.complete_url,
                "deadline": deadline_at,
                "group_id": group_id,
                "task_id": task_id,
            }
            payload = foreign_payload(payload, self.payload_format)
            try:
                problem = await self._deliver(gw, runner, payload, sid)
                if problem is not None:
                    self.stats.undeliverable += 1
                    await self._complete(
                        gw, sid, "failed", f"the runner could not reach the agent: {problem}"
                    )
                else:
                    await self._wait(gw, sid, deadline_at)
            except GatewayUnavailable:
                raise
            except Exception as exc:  # this rollout's problem, not the run's
                self.stats.client_errors += 1
                log.warning("rollout %s failed in the client: %s: %s", sid, type(exc).__name__, exc)
                await self._complete(
                    gw, sid, "failed", f"rollout client error: {type(exc).__name__}: {exc}"
                )
            await self._release(runner, sid)
            rollout = await self._fetch(gw, sid)
            if rollout.task is None:
                rollout.task = task
            if rollout.group_id is None:
                rollout.group_id = group_id
            if rollout.task_id is None:
                rollout.task_id = task_id
            tick(rollout)
            return rollout

    async def _deliver(
        self, gw: ControlPlane, runner: Runner, payload: dict[str, Any], sid: str
    ) -> str | None:
        """Invoke with retries of infrastructure errors; the last error text, or None on success.

        Before a retry the session is looked up: an agent that took the earlier invocation after
        all (the answer was lost: a read timeout, a load balancer's 502) has made calls or
        reported, and is not invoked again — one session never runs on two agents.
        """
        delay = self.retry_backoff
        for attempt in range(self.infra_retries + 1):
            if attempt > 0:
                info = await self._gateway("look up the session", lambda: gw.session(sid))
                if info.terminal or info.num_calls > 0:
                    log.info("rollout %s: the agent took the earlier invocation; not retrying", sid)
                    return None
            try:
                await runner.invoke(payload, sid)
                return None
            except RunnerError as exc:
                if not exc.retryable or attempt == self.infra_retries:
                    return str(exc)
                log.info("rollout %s: invocation failed (%s); retrying in %.1fs", sid, exc, delay)
            self.stats.infra_retries += 1
            await asyncio.sleep(delay)
            delay *= 2
        return "unreachable"

    async def _release(self, runner: Runner, sid: str) -> None:
        release = getattr(runner, "release", None)
        if release is None:
            return
        try:
            await release(sid)
        except Exception as exc:  # freeing runner resources is best effort
            log.warning("rollout %s: runner.release failed: %s: %s", sid, type(exc).__name__, exc)

    async def _wait(self, gw: ControlPlane, sid: str, deadline_at: float) -> None:
        give_up = deadline_at + self.deadline_grace
        while True:
            left = give_up - time.time()
            if left <= 0:
                self.stats.client_timeouts += 1
                await self._complete(
                    gw,
                    sid,
                    "timeout",
                    f"no terminal record {self.deadline_grace:.0f}s after the deadline: the agent did not report",
                )
                return
            wait = functools.partial(gw.wait, sid, timeout=max(0.1, min(left, 60.0)))
            info = await self._gateway("wait for the rollout", wait)
            if info.status in TERMINAL_STATUSES:
                return

    async def _complete(self, gw: ControlPlane, sid: str, status: str, error: str) -> None:
        """Record a failure the client saw; a 409 means the agent's record arrived first."""
        try:
            await self._gateway(
                f"record the rollout as {status}",
                lambda: gw.complete(sid, reward=self.failure_reward, status=status, error=error),
            )
        except GatewayUnavailable:
            raise
        except Exception as exc:
            if getattr(exc, "status_code", None) != 409:
                log.warning("rollout %s: could not record %s: %s", sid, status, exc)

    async def _fetch(self, gw: ControlPlane, sid: str) -> Rollout:
        """The rollout from the gateway; a local ``failed`` one when it cannot be read or is not
        terminal (never a running rollout handed to the trainer as if it were done)."""
        try:
            rollout: Rollout = await self._gateway("fetch the rollout", lambda: gw.rollout(sid))
        except GatewayUnavailable:
            raise
        except Exception as exc:
            log.warning("rollout %s: could not fetch it (%s); kept as failed", sid, exc)
            return Rollout(
                rollout_id=sid,
                status="failed",
                reward=self.failure_reward,
                error=f"the rollout could not be fetched from the gateway: {exc}",
            )
        if not rollout.terminal:
            log.warning(
                "rollout %s: the gateway holds no terminal record (status %s); kept as failed",
                sid,
                rollout.status,
            )
            rollout.error = f"no terminal record on the gateway (status was {rollout.status!r})"
            rollout.status = "failed"
            rollout.reward = self.failure_reward
        return rollout

    async def _gateway(self, what: str, fn: Callable[[], Any]) -> Any:
        """A control-plane call, retried with backoff while the gateway is unreachable (transport
        errors, 5xx, 429) for up to ``gateway_timeout`` seconds; then :class:`GatewayUnavailable`.
        Other errors are raised at once, with what was being done."""
        delay = self.retry_backoff
        first_failure: float | None = None
        while True:
            try:
                return await fn()
            except Exception as exc:
                if not transient(exc):
                    raise GatewayError(
                        getattr(exc, "status_code", 0) or 0,
                        f"could not {what} on the gateway {self.gateway_url}: {exc}",
                    ) from exc
                now = time.monotonic()
                first_failure = now if first_failure is None else first_failure
                down = now - first_failure
                if down + delay > self.gateway_timeout:
                    raise GatewayUnavailable(
                        f"aborting the run: the gateway {self.gateway_url} has been unreachable "
                        f"for {down:.0f}s (gateway_timeout={self.gateway_timeout:g}s) while trying "
                        f"to {what}: {type(exc).__name__}: {exc}"
                    ) from exc
                self.stats.gateway_retries += 1
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
