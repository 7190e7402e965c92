"""HTTP runner: ``POST /invocations`` on a pool of AgentCore-contract agents, round-robin."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp

from rollwire.app import SESSION_HEADER
from rollwire.runners.base import RunnerError

__all__ = ["HttpRunner"]


class HttpRunner:
    """Invokes ``{url}/invocations`` with the AgentCore session header; any RolloutApp serves it.

    Transport errors, 5xx and 429 raise a retryable :class:`RunnerError`; another 4xx means the
    agent refused the payload and raises a non-retryable one with the agent's message.
    """

    def __init__(
        self, urls: str | Sequence[str], *, timeout: float = 30.0, max_connections: int = 256
    ) -> None:
        pool = [urls] if isinstance(urls, str) else list(urls)
        urls_ = [u.strip().rstrip("/") for part in pool for u in part.split(",") if u.strip()]
        self.urls = [u if "://" in u else f"http://{u}" for u in urls_]
        if not self.urls:
            raise ValueError("HttpRunner needs at least one agent URL, e.g. http://127.0.0.1:8080")
        self._next = itertools.cycle(self.urls)
        self.timeout = timeout
        self.max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                connector=aiohttp.TCPConnector(limit=self.max_connections),
            )
        return self._session

    async def invoke(self, payload: Mapping[str, Any], session_id: str) -> None:
        """POST the payload to the next agent in the pool."""
        url = next(self._next)
        try:
            async with self._http().post(
                f"{url}/invocations", json=dict(payload), headers={SESSION_HEADER: session_id}
            ) as resp:
                status, text = resp.status, await resp.text()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise RunnerError(
                f"could not reach the agent at {url}: {type(exc).__name__}: {exc}"
            ) from exc
        if status >= 300:
            raise RunnerError(
                f"agent at {url}/invocations answered HTTP {status}: {text[:300]}",
                retryable=status >= 500 or status in (408, 429),
            )

    async def drain(self) -> None:
        """Close the connection pool (it is bound to the run's event loop)."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self.drain()
