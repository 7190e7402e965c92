"""HTTP runner: ``POST /invocations`` on a pool of AgentCore-contract agents, one agent per session."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import aiohttp

from rollwire.agent.app import SESSION_HEADER
from rollwire.trainer.runners.base import RunnerError

__all__ = ["HttpRunner"]


class HttpRunner:
    """Invokes ``{url}/invocations`` with the AgentCore session header; any RolloutApp serves it.

    A session is pinned to one agent (a hash of its id spreads sessions over the pool), and its
    retries go to that agent too: when an answer is lost after the agent took the invocation (a
    read timeout, a load balancer's 502), the agent acknowledges the repeat instead of a second
    agent running the same session. Only a refused connection, where nothing was delivered, moves
    the session to the next agent. Transport errors, 5xx and 429 raise a retryable
    :class:`RunnerError`; another 4xx means the agent refused the payload (not retryable).

    One runner may serve concurrent runs on several event loops: each loop has its own connection
    pool, and a run's :meth:`drain` closes its loop's pool only when no invocation uses it.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        timeout: float = 30.0,
        max_connections: int = 256,
        grace: float = 5.0,
    ) -> None:
        pool = [urls] if isinstance(urls, str) else list(urls)
        urls_ = [u.strip().rstrip("/") for part in pool for u in part.split(",") if u.strip()]
        self.urls = [u if "://" in u else f"http://{u}" for u in urls_]
        if not self.urls:
            raise ValueError("HttpRunner needs at least one agent URL, e.g. http://127.0.0.1:8080")
        self._moved: dict[str, int] = {}  # sessions moved on from agents that refused connections
        self.timeout = timeout
        self.grace = grace  # a try never outlives the rollout's deadline + this
        self.max_connections = max_connections
        self._lock = threading.Lock()
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
        self._in_flight: dict[asyncio.AbstractEventLoop, int] = {}

    def _http(self, loop: asyncio.AbstractEventLoop) -> aiohttp.ClientSession:
        """The pool of ``loop`` (the running one): an aiohttp session is bound to its loop."""
        with self._lock:
            session = self._sessions.get(loop)
            if session is None or session.closed:
                for gone in [lp for lp in self._sessions if lp.is_closed()]:
                    del self._sessions[gone]
                session = aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=self.timeout),
                    connector=aiohttp.TCPConnector(limit=self.max_connections),
                )
                self._sessions[loop] = session
            return session

    def url_for(self, session_id: str) -> str:
        """The agent this session is pinned to."""
        digest = hashlib.sha256(session_id.encode()).digest()
        index = int.from_bytes(digest[:8], "big") + self._moved.get(session_id, 0)
        return self.urls[index % len(self.urls)]

    async def invoke(self, payload: Mapping[str, Any], session_id: str) -> None:
        """POST the payload to the session's agent."""
        url = self.url_for(session_id)
        loop = asyncio.get_running_loop()
        with self._lock:
            self._in_flight[loop] = self._in_flight.get(loop, 0) + 1
        try:
            async with self._http(loop).post(
                f"{url}/invocations",
                json=dict(payload),
                headers={SESSION_HEADER: session_id},
                timeout=aiohttp.ClientTimeout(total=self.try_timeout(payload)),
            ) as resp:
                status, text = resp.status, await resp.text()
        except aiohttp.ClientConnectorError as exc:  # not connected: nothing was delivered
            self._moved[session_id] = self._moved.get(session_id, 0) + 1
            raise RunnerError(
                f"could not connect to the agent at {url}: {type(exc).__name__}: {exc}"
            ) from exc
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise RunnerError(
                f"could not reach the agent at {url}: {type(exc).__name__}: {exc}"
            ) from exc
        finally:
            with self._lock:
                left = self._in_flight.pop(loop) - 1
                if left:
                    self._in_flight[loop] = left
        if status >= 300:
            raise RunnerError(
                f"agent at {url}/invocations answered HTTP {status}: {text[:300]}",
                retryable=status >= 500 or status in (408, 429),
            )

    def try_timeout(self, payload: Mapping[str, Any], now: float | None = None) -> float:
        """Seconds one POST may take: ``timeout``, but never past the rollout's deadline +
        ``grace`` (a hung agent must not hold the trainer's failed record back)."""
        meta = payload.get("_rollwire")
        deadline = meta.get("deadline") if isinstance(meta, Mapping) else None
        if not isinstance(deadline, (int, float)) or isinstance(deadline, bool):
            return self.timeout
        left = float(deadline) + self.grace - (time.time() if now is None else now)
        return max(0.5, min(self.timeout, left))

    async def release(self, session_id: str) -> None:
        """Forget the session's pinning once it is terminal."""
        self._moved.pop(session_id, None)

    async def drain(self, session_ids: Iterable[str] | None = None) -> None:
        """After a run: close this event loop's pool unless another run's invocation uses it."""
        loop = asyncio.get_running_loop()
        with self._lock:
            session = None if self._in_flight.get(loop) else self._sessions.pop(loop, None)
        if session is not None:
            await session.close()

    async def aclose(self) -> None:
        """Close the connection pools, each on its own event loop."""
        loop = asyncio.get_running_loop()
        with self._lock:
            sessions, self._sessions = self._sessions, {}
        for owner, session in sessions.items():
            if owner is loop:
                await session.close()
            elif owner.is_running() and not owner.is_closed():
                with contextlib.suppress(Exception):  # that loop stopped meanwhile
                    done = asyncio.run_coroutine_threadsafe(session.close(), owner)
                    await asyncio.wait_for(asyncio.wrap_future(done), 5.0)
