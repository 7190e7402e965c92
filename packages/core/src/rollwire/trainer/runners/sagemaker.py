"""SageMaker's rollout-server contract on the trainer side: ``POST {url}/rollout`` with SageMaker's
request (``{instance, metadata, inferenceParams, ...}``) and ``GET {url}/health``.

The agent (SageMaker's ``@sagemaker_rft_handler``, or any server that follows the contract)
calls the model at ``metadata.endpoint + "/v1"`` and reports to ``{endpoint}/complete-rollout``
and ``/update-reward``: rollwire gives it ``endpoint = {gateway}/s/{token}``, so both land on the
session (see :mod:`rollwire.gateway.control.foreign_results`).
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp

from rollwire.data.foreign import sagemaker_request
from rollwire.trainer.runners.base import RunnerError

__all__ = ["SageMakerRunner"]


class SageMakerRunner:
    """Delivers rollouts to SageMaker-style rollout servers at ``urls`` (a session is pinned to
    one, by a hash of its id). ``/health`` is checked once per server before its first rollout;
    a server that is not healthy, or that refuses the request, raises :class:`RunnerError`."""

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        region: str = "us-west-2",
        timeout: float = 120.0,
    ) -> None:
        parts = urls.split(",") if isinstance(urls, str) else list(urls)
        self.urls = [u.strip().rstrip("/") for u in parts if u.strip()]
        if not self.urls:
            raise ValueError("SageMakerRunner needs at least one rollout server URL")
        self.region = region
        self.timeout = timeout
        self._healthy: set[str] = set()
        self._http: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        return self._http

    async def _check_health(self, url: str) -> None:
        if url in self._healthy:
            return
        try:
            async with self._client().get(f"{url}/health") as resp:
                if resp.status != 200:
                    raise RunnerError(f"{url}/health answered HTTP {resp.status}")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise RunnerError(f"{url}/health: {type(exc).__name__}: {exc}") from exc
        self._healthy.add(url)

    async def invoke(self, payload: Mapping[str, Any], session_id: str) -> None:
        """``POST /rollout`` with the task as SageMaker's ``instance``."""
        url = self.urls[zlib.crc32(session_id.encode()) % len(self.urls)]
        await self._check_health(url)
        body = sagemaker_request(payload, payload["_rollwire"], region=self.region)
        try:
            async with self._client().post(f"{url}/rollout", json=body) as resp:
                text = await resp.text()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            self._healthy.discard(url)
            raise RunnerError(f"{url}/rollout: {type(exc).__name__}: {exc}") from exc
        if resp.status >= 300:
            retryable = resp.status >= 500 or resp.status == 429
            raise RunnerError(
                f"{url}/rollout answered HTTP {resp.status}: {text[:300]}", retryable=retryable
            )

    async def aclose(self) -> None:
        """Close the HTTP pool."""
        if self._http is not None:
            await self._http.close()
            self._http = None
