"""The AgentCore Runtime invocation protocol: the session header, the handler's ``context``, the
``/ping`` statuses and server-sent-event framing of streamed (generator) results.

``POST /invocations`` with ``X-Amzn-Bedrock-AgentCore-Runtime-Session-Id``; ``GET /ping``
answers ``{"status": "Healthy" | "HealthyBusy", "time_of_last_update"}``; a generator's events
are streamed as ``data: {json}\\n\\n``, and an exception mid-stream becomes a last
``{"error", "error_type"}`` event, as ``BedrockAgentCoreApp`` does.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from rollwire.agent.context import RolloutContext

__all__ = [
    "DEBUG_ACTION_KEY",
    "SESSION_HEADER",
    "InvocationContext",
    "PingStatus",
    "sse",
    "sse_async",
    "sse_sync",
]

log = logging.getLogger("rollwire.agent.app")

#: AgentCore Runtime's session header.
SESSION_HEADER = "X-Amzn-Bedrock-AgentCore-Runtime-Session-Id"
#: The payload key of ``BedrockAgentCoreApp``'s debug actions (served with ``debug=True``).
DEBUG_ACTION_KEY = "_agent_core_app_action"


class PingStatus(str, enum.Enum):
    """``/ping`` statuses (the values of ``bedrock_agentcore.runtime.PingStatus``)."""

    HEALTHY = "Healthy"
    HEALTHY_BUSY = "HealthyBusy"


@dataclass
class InvocationContext:
    """What a handler may take as its second argument (AgentCore's ``RequestContext`` shape:
    ``session_id``, ``request_headers``, ``request``), plus the rollout's context in a rollout."""

    session_id: str | None
    headers: dict[str, str] = field(default_factory=dict)
    rollout: RolloutContext | None = None
    request: Any = None

    @property
    def request_headers(self) -> dict[str, str]:
        """The request's headers (AgentCore's name for :attr:`headers`)."""
        return self.headers


def sse(event: Any) -> str:
    """One server-sent event, as AgentCore frames a yielded value."""
    return f"data: {json.dumps(event, ensure_ascii=False, default=str)}\n\n"


def _sse_error(exc: Exception) -> str:
    log.exception("streaming invocation failed")
    return sse({"error": f"{type(exc).__name__}: {exc}", "error_type": type(exc).__name__})


async def sse_async(events: Any) -> AsyncIterator[str]:
    """An async generator's events as server-sent events."""
    async with contextlib.aclosing(events):
        try:
            async for event in events:
                yield sse(event)
        except Exception as exc:
            yield _sse_error(exc)


def sse_sync(events: Any) -> Iterator[str]:
    """A generator's events as server-sent events (iterated on Starlette's thread pool)."""
    with contextlib.closing(events):
        try:
            for event in events:
                yield sse(event)
        except Exception as exc:
            yield _sse_error(exc)
