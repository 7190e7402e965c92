"""Reads agentcore-rl-toolkit results from the user's own S3 bucket.

An unmodified gen-1 container saves its result to ``s3://{bucket}/{exp_id}/{input_id}/
{session}.json``. :class:`S3ResultRunner` wraps the runner that delivers the invocation (HTTP,
AgentCore), gives the agent ``_rollout`` with that bucket (``exp_id`` is the session token, so
the key prefix names the session), polls the prefix and posts what it finds to the session's
``complete_url``: the same terminal record as if the agent had reported to rollwire.
``pip install "rollwire[agentcore]"`` (boto3).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Mapping
from typing import Any

import aiohttp

from rollwire.data.foreign import TOOLKIT_KEY, read_s3_result, toolkit_rollout
from rollwire.trainer.runners.base import Runner

__all__ = ["S3ResultRunner"]

log = logging.getLogger(__name__)


class S3ResultRunner:
    """Delivers through ``inner`` and reads each rollout's result from ``bucket``.

    ``s3`` is a boto3 S3 client (default: ``boto3.client("s3", endpoint_url=endpoint_url)``).
    ``poll_interval`` seconds between listings of a session's prefix. Results that are not
    JSON, or hold no reward, fail the rollout with the reason.
    """

    def __init__(
        self,
        inner: Runner,
        bucket: str,
        *,
        s3: Any = None,
        endpoint_url: str | None = None,
        poll_interval: float = 1.0,
        post_timeout: float = 30.0,
    ) -> None:
        if s3 is None:
            try:
                import boto3
            except ImportError as exc:
                raise ImportError(
                    "S3ResultRunner needs boto3: pip install 'rollwire[agentcore]'"
                ) from exc
            s3 = boto3.client("s3", endpoint_url=endpoint_url)
        self.inner = inner
        self.bucket = bucket
        self.s3 = s3
        self.poll_interval = poll_interval
        self.post_timeout = post_timeout
        self._polls: dict[str, asyncio.Task[None]] = {}
        self._http: aiohttp.ClientSession | None = None

    async def invoke(self, payload: Mapping[str, Any], session_id: str) -> None:
        """Deliver with ``_rollout.s3_bucket`` set to the bucket, then watch for the result."""
        rollwire = payload["_rollwire"]
        rollout = dict(payload.get(TOOLKIT_KEY) or toolkit_rollout(rollwire))
        rollout["s3_bucket"] = self.bucket
        await self.inner.invoke({**payload, TOOLKIT_KEY: rollout}, session_id)
        prefix = f"{rollout['exp_id']}/{rollout['input_id']}/"
        if session_id not in self._polls:
            poll = self._poll(prefix, rollwire["complete_url"], rollwire["api_key"], session_id)
            self._polls[session_id] = asyncio.create_task(poll, name=f"s3-poll-{session_id}")

    async def _poll(self, prefix: str, complete_url: str, token: str, sid: str) -> None:
        last_error = ""
        while True:
            try:
                found = await self._find(prefix)
                if found is not None:
                    key, raw = found
                    await self._report(complete_url, token, self._record(raw, key), sid)
                    return
            except Exception as exc:  # S3 or the gateway briefly down: keep watching
                if str(exc) != last_error:
                    log.warning("rollout %s: reading s3://%s/%s: %s", sid, self.bucket, prefix, exc)
                    last_error = str(exc)
            await asyncio.sleep(self.poll_interval)

    async def _find(self, prefix: str) -> tuple[str, bytes] | None:
        listing = await asyncio.to_thread(
            self.s3.list_objects_v2, Bucket=self.bucket, Prefix=prefix
        )
        keys = [o["Key"] for o in listing.get("Contents", []) if o["Key"].endswith(".json")]
        if not keys:
            return None
        obj = await asyncio.to_thread(self.s3.get_object, Bucket=self.bucket, Key=keys[0])
        return keys[0], await asyncio.to_thread(obj["Body"].read)

    @staticmethod
    def _record(raw: bytes, key: str) -> dict[str, Any]:
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("the result is not a JSON object")
            result = read_s3_result(body)
        except ValueError as exc:
            return {"status": "failed", "reward": 0.0, "error": f"s3 result {key}: {exc}"}
        record: dict[str, Any] = {
            "status": result.status,
            "reward": 0.0 if result.reward is None else result.reward,
            "metrics": result.metrics,
        }
        if result.error:
            record["error"] = result.error
        return record

    async def _report(self, url: str, token: str, record: dict[str, Any], sid: str) -> None:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.post_timeout)
            )
        async with self._http.post(
            url, json=record, headers={"Authorization": f"Bearer {token}"}
        ) as resp:
            if resp.status >= 300 and resp.status != 409:  # 409: a record was there first
                log.warning(
                    "rollout %s: the gateway refused the S3 result (HTTP %s): %s",
                    sid,
                    resp.status,
                    (await resp.text())[:200],
                )

    async def release(self, session_id: str) -> None:
        """Stop watching a terminal rollout (and let the inner runner free it)."""
        task = self._polls.pop(session_id, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        release = getattr(self.inner, "release", None)
        if release is not None:
            await release(session_id)

    async def aclose(self) -> None:
        """Stop every watch, close the HTTP pool and the inner runner."""
        for sid in list(self._polls):
            await self.release(sid)
        if self._http is not None:
            await self._http.close()
            self._http = None
        await self.inner.aclose()
