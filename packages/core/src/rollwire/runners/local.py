"""In-process runner: the agent's entrypoint runs as an asyncio task of the trainer's event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from rollwire.app import RolloutApp
from rollwire.runners.base import RunnerError

__all__ = ["LocalRunner"]


class LocalRunner:
    """Calls a :class:`~rollwire.app.RolloutApp` (or a bare handler, wrapped in one) directly.

    The embedded default: no HTTP hop to the agent, but the same background run, deadline and
    terminal-record rules as ``POST /invocations``.
    """

    def __init__(
        self, app_or_handler: RolloutApp | Callable[..., Any], *, failure_reward: float = 0.0
    ) -> None:
        if isinstance(app_or_handler, RolloutApp):
            self.app = app_or_handler
        elif callable(app_or_handler):
            self.app = RolloutApp(failure_reward=failure_reward)
            self.app.rollout_entrypoint(app_or_handler)
        else:
            raise TypeError(
                f"LocalRunner needs a RolloutApp or a handler function, got {type(app_or_handler).__name__}"
            )
        self.app.handler  # noqa: B018 - fail now when the app has no entrypoint

    async def invoke(self, payload: Mapping[str, Any], session_id: str) -> None:
        """Start the rollout as a background task of the running loop."""
        try:
            await self.app.start_rollout(payload, session_id)
        except ValueError as exc:
            raise RunnerError(f"local runner could not start the rollout: {exc}") from exc

    async def drain(self, timeout: float = 30.0) -> None:
        """After a run: let finishing rollouts post their records, then close this loop's pool."""
        try:
            await self.app.wait_idle(timeout)
        except asyncio.TimeoutError:
            pass
        await self.app.close_http()

    async def aclose(self) -> None:
        """Cancel rollouts still running (each still gets its terminal record)."""
        await self.app.shutdown()
