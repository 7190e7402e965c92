"""Amazon Bedrock AgentCore Runtime runner: boto3 ``invoke_agent_runtime`` on a deployed agent.

Install with ``pip install "rollwire[agentcore]"``; boto3 is imported when the runner is built.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson

from rollwire.trainer.runners.base import RateLimiter, RunnerError

__all__ = ["AgentCoreRunner", "runtime_session_id"]

log = logging.getLogger(__name__)

#: AgentCore refuses ``runtimeSessionId`` values shorter than this.
MIN_SESSION_ID_LEN = 33
_RETRYABLE_CODES = {
    "ThrottlingException",
    "ServiceQuotaExceededException",
    "InternalServerException",
    "ServiceUnavailableException",
    "RuntimeClientError",
}


def runtime_session_id(session_id: str) -> str:
    """A ``runtimeSessionId`` AgentCore accepts (≥ 33 chars), stable for a rollwire session id."""
    if len(session_id) >= MIN_SESSION_ID_LEN:
        return session_id
    pad = hashlib.sha256(session_id.encode()).hexdigest()[
        : MIN_SESSION_ID_LEN - 1 - len(session_id)
    ]
    return f"{session_id}-{pad}"


class AgentCoreRunner:
    """Invokes an AgentCore agent runtime (a container running a RolloutApp) per rollout.

    ``tps`` caps ``invoke_agent_runtime`` calls per second (AgentCore's per-account quota);
    ``endpoint_url`` points boto3 elsewhere (a VPC endpoint, or a local stand-in in tests). After a
    rollout is terminal, :meth:`release` stops its runtime session so the microVM is freed.
    """

    def __init__(
        self,
        agent_runtime_arn: str,
        region: str | None = None,
        *,
        endpoint_url: str | None = None,
        qualifier: str = "DEFAULT",
        tps: float | None = 25.0,
        max_workers: int = 64,
        stop_sessions: bool = True,
        client: Any = None,
    ) -> None:
        if client is None:
            try:
                import boto3
                from botocore.config import Config
            except ImportError as exc:
                raise ImportError(
                    'the AgentCore runner needs boto3; install it with: pip install "rollwire[agentcore]"'
                ) from exc
            config = Config(
                retries={"max_attempts": 1}, max_pool_connections=max_workers, read_timeout=120
            )
            client = boto3.client(
                "bedrock-agentcore", region_name=region, endpoint_url=endpoint_url, config=config
            )
        self.arn = agent_runtime_arn
        self.qualifier = qualifier
        self.stop_sessions = stop_sessions
        self._client = client
        self._limiter = RateLimiter(tps)
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="agentcore")
        self._invoked: dict[str, str] = {}

    def _call(self, method: str, **kwargs: Any) -> Any:
        return getattr(self._client, method)(**kwargs)

    async def _run(self, method: str, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: self._call(method, **kwargs))

    async def invoke(self, payload: Mapping[str, Any], session_id: str) -> None:
        """``invoke_agent_runtime`` with the payload as JSON bytes; raises RunnerError on failure."""
        from botocore.exceptions import BotoCoreError, ClientError

        rsid = runtime_session_id(session_id)
        await self._limiter.acquire()
        try:
            resp = await self._run(
                "invoke_agent_runtime",
                agentRuntimeArn=self.arn,
                runtimeSessionId=rsid,
                payload=orjson.dumps(dict(payload)),
                qualifier=self.qualifier,
                contentType="application/json",
                accept="application/json",
            )
            body = resp.get("response")
            if body is not None and hasattr(body, "read"):
                await asyncio.get_running_loop().run_in_executor(self._pool, body.read)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            retryable = code in _RETRYABLE_CODES or status >= 500 or status == 429
            raise RunnerError(
                f"invoke_agent_runtime({self.arn}) failed: {code}: {exc}", retryable=retryable
            ) from exc
        except BotoCoreError as exc:
            raise RunnerError(f"could not reach AgentCore for {self.arn}: {exc}") from exc
        status = int(resp.get("statusCode") or 200)
        if status >= 300:
            raise RunnerError(
                f"agent runtime {self.arn} answered {status}",
                retryable=status >= 500 or status == 429,
            )
        self._invoked[session_id] = rsid

    async def release(self, session_id: str) -> None:
        """Stop the session's runtime (frees its microVM); errors are logged, never raised."""
        rsid = self._invoked.pop(session_id, None)
        if rsid is None or not self.stop_sessions:
            return
        try:
            await self._run(
                "stop_runtime_session",
                agentRuntimeArn=self.arn,
                runtimeSessionId=rsid,
                qualifier=self.qualifier,
            )
        except Exception as exc:  # freeing is best effort: the runtime idles out by itself
            log.info("stop_runtime_session(%s) failed: %s", rsid, exc)

    async def aclose(self) -> None:
        """Stop sessions still open and release the thread pool."""
        for sid in list(self._invoked):
            await self.release(sid)
        self._pool.shutdown(wait=False)
