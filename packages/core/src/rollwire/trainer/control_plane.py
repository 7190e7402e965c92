"""The control plane as a run uses it: the routes it calls over one aiohttp pool, and the retry
rule for an unreachable gateway (transport errors, 5xx and 429 are ridden out for up to
``gateway_timeout`` seconds; past that the run is aborted with :class:`GatewayUnavailable`)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from rollwire.data.protocol import Group, Rollout
from rollwire.trainer.gateway_client import SessionHandle, SessionInfo

__all__ = ["ControlPlane", "GatewayError", "GatewayUnavailable", "transient"]


class GatewayUnavailable(RuntimeError):
    """The gateway stayed unreachable longer than ``gateway_timeout``: the run was aborted.

    ``groups`` holds the groups that were complete before the abort (in task order for ``run``).
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.groups: list[Group] = []


class ControlPlane:
    """The four control-plane routes a run needs, over one aiohttp pool sized for ``concurrency``
    long-polls (httpx's pool scans every queued request per assignment, quadratic at 1,000
    rollouts in flight). Answers are the models of :mod:`rollwire.trainer.gateway_client`."""

    def __init__(self, url: str, admin_key: str, concurrency: int) -> None:
        self.url = url
        self._headers = {"authorization": f"Bearer {admin_key}"}
        self._limit = 2 * concurrency + 16
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                connector=aiohttp.TCPConnector(limit=self._limit),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
            )
        return self._session

    async def _req(self, method: str, path: str, timeout: float = 60.0, **kw: Any) -> bytes:
        async with self._http().request(
            method, self.url + path, timeout=aiohttp.ClientTimeout(total=timeout), **kw
        ) as resp:
            body = await resp.read()
            if resp.status >= 400:
                text = body.decode("utf-8", "replace")[:500]
                raise GatewayError(resp.status, f"HTTP {resp.status}: {text}")
            return body

    async def create_session(self, **fields: Any) -> SessionHandle:
        body = {k: v for k, v in fields.items() if v is not None}
        return SessionHandle.model_validate_json(
            await self._req("POST", "/api/sessions", json=body)
        )

    async def session(self, session_id: str) -> SessionInfo:
        return SessionInfo.model_validate_json(
            await self._req("GET", f"/api/sessions/{session_id}")
        )

    async def wait(self, session_id: str, timeout: float = 30.0) -> SessionInfo:
        raw = await self._req(
            "GET",
            f"/api/sessions/{session_id}/wait",
            timeout=timeout + 30.0,
            params={"timeout": str(timeout)},
        )
        return SessionInfo.model_validate_json(raw)

    async def rollout(self, session_id: str) -> Rollout:
        return Rollout.from_json(await self._req("GET", f"/api/sessions/{session_id}/rollout"))

    async def complete(self, session_id: str, **fields: Any) -> None:
        body = {k: v for k, v in fields.items() if v is not None}
        await self._req("POST", f"/api/sessions/{session_id}/complete", json=body)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class GatewayError(RuntimeError):
    """A control-plane answer that is an error, with its HTTP status (0 when there was none)."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code


def transient(exc: BaseException) -> bool:
    if isinstance(exc, (aiohttp.ClientConnectionError, ConnectionError, asyncio.TimeoutError)):
        return True
    status = getattr(exc, "status_code", None)
    if status is None:
        response = getattr(exc, "response", None)
        status = getattr(response, "status_code", None)
    return isinstance(status, int) and (status >= 500 or status == 429)
