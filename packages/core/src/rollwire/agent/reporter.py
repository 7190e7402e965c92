"""The terminal-record reporter: posts a rollout's one record to ``complete_url``.

Posting retries transport errors, 429 and 5xx with bounded backoff (0.2 s doubling to 5 s): at
least ``post_retries`` times and on until a give-up time (``report_grace`` past the deadline), so
a gateway restart does not lose a real reward. A 409 (the gateway already holds a different
record) is final, and so is another 4xx. Each event loop gets its own HTTP pool (an aiohttp
session is bound to the loop it was made on).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp

from rollwire.agent.context import RolloutContext

__all__ = ["ReportState", "Reporter", "RolloutOutcome", "TerminalStatus"]

log = logging.getLogger("rollwire.agent.app")

TerminalStatus = Literal["completed", "failed", "timeout", "cancelled"]


@dataclass(frozen=True)
class RolloutOutcome:
    """The terminal record of one rollout, as posted to ``complete_url``."""

    status: TerminalStatus
    reward: float
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    def body(self) -> dict[str, Any]:
        """The JSON body of ``POST /api/sessions/{id}/complete``."""
        out: dict[str, Any] = {
            "status": self.status,
            "reward": self.reward,
            "metrics": self.metrics,
        }
        if self.error is not None:
            out["error"] = self.error
        return out


@dataclass
class ReportState:
    """Whether the gateway holds a terminal record of this rollout (ours, or one that won)."""

    accepted: bool = False


class Reporter:
    """Posts terminal records with retries, over one HTTP pool per event loop."""

    def __init__(self, *, post_retries: int, post_timeout: float, shutdown_timeout: float) -> None:
        self.post_retries = post_retries
        self.post_timeout = post_timeout
        self.shutdown_timeout = shutdown_timeout
        self.completed = 0
        #: loop time at which a shutdown's record posts give up (None: no shutdown under way)
        self.stop_at: float | None = None
        self.http: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
        self._lock = threading.Lock()

    async def _client(self) -> aiohttp.ClientSession:
        """This event loop's HTTP pool (an aiohttp session is bound to the loop it was made on)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            client = self.http.get(loop)
            if client is None or client.closed:
                for gone in [lp for lp in self.http if lp.is_closed()]:
                    del self.http[gone]  # nothing can close those any more; do not hold them
                client = aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=self.post_timeout),
                    connector=aiohttp.TCPConnector(limit=64),
                )
                self.http[loop] = client
        return client

    async def _post_once(
        self, rc: RolloutContext, body: dict[str, Any], timeout: float
    ) -> tuple[int, str]:
        client = await self._client()
        async with client.post(
            rc.complete_url,
            json=body,
            headers={"Authorization": f"Bearer {rc.api_key}"},
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as resp:
            if resp.status < 300 or resp.status == 409:
                return resp.status, ""
            return resp.status, (await resp.text())[:200]

    async def report(
        self,
        rc: RolloutContext,
        outcome: RolloutOutcome,
        state: ReportState,
        *,
        give_up_at: float | None,
        min_retries: int | None = None,
        max_delay: float = 5.0,
    ) -> bool:
        """Post the terminal record, retrying transport errors, 429 and 5xx with bounded backoff:
        at least ``min_retries`` retries (default ``post_retries``) and on until ``give_up_at``
        (loop time). True once the gateway holds our record; 4xx other than 429 is final."""
        loop = asyncio.get_running_loop()
        retries = self.post_retries if min_retries is None else min_retries
        body = outcome.body()
        delay = 0.2
        last = ""
        attempt = 0
        while True:
            timeout = self.post_timeout
            if give_up_at is not None and attempt >= retries:
                timeout = min(timeout, give_up_at - loop.time())
            if timeout <= 0:
                break
            try:
                status, text = await self._post_once(rc, body, timeout)
                if status < 300:
                    state.accepted = True
                    with self._lock:
                        self.completed += 1
                    return True
                if status == 409:  # already terminal with another record: nothing to add
                    state.accepted = True
                    log.warning(
                        "rollout %s: gateway already holds a different terminal record",
                        rc.session_id,
                    )
                    return False
                last = f"HTTP {status}: {text}"
                if status < 500 and status != 429:
                    break
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            attempt += 1
            past_minimum = attempt > retries
            if past_minimum and (give_up_at is None or loop.time() + delay >= give_up_at):
                break
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_delay)
        log.error(
            "rollout %s: could not post its terminal record (%s) to %s: %s",
            rc.session_id,
            outcome.status,
            rc.complete_url,
            last or "out of time",
        )
        return False

    async def final_report(
        self, rc: RolloutContext, outcome: RolloutOutcome, state: ReportState
    ) -> bool:
        """The record of a cancelled rollout, within the shutdown budget that every such post
        shares (or ``shutdown_timeout`` from now when no shutdown is under way)."""
        loop = asyncio.get_running_loop()
        stop_at = self.stop_at if self.stop_at is not None else loop.time() + self.shutdown_timeout
        return await self.report(
            rc, outcome, state, give_up_at=stop_at, min_retries=0, max_delay=1.0
        )

    async def close_loop_pool(self, in_use: bool = False) -> None:
        """Close this event loop's HTTP pool unless ``in_use`` (a later report opens a new one)."""
        if in_use:
            return
        with self._lock:
            client = self.http.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.close()

    async def close_all(self, timeout: float = 5.0) -> None:
        """Close every loop's HTTP pool, each on its own loop (the owner's close)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            clients, self.http = self.http, {}
        for owner, client in clients.items():
            if owner is loop:
                await client.close()
            elif owner.is_running() and not owner.is_closed():
                with contextlib.suppress(Exception):  # that loop stopped meanwhile: nothing to do
                    done = asyncio.run_coroutine_threadsafe(client.close(), owner)
                    await asyncio.wait_for(asyncio.wrap_future(done), timeout)
