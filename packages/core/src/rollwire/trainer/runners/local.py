"""In-process runner: the agent's entrypoint runs as an asyncio task of the trainer's event loop.

One LocalRunner may be shared by concurrent runs, on one event loop or on several (threads, each
with its own ``asyncio.run``): a rollout runs on the loop that invoked it, and a run's
:meth:`~LocalRunner.drain` waits for its own sessions only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from rollwire.agent.app import RolloutApp
from rollwire.trainer.runners.base import RunnerError

__all__ = ["LocalRunner"]


class LocalRunner:
    """Calls a :class:`~rollwire.agent.app.RolloutApp` (or a bare handler, wrapped in one) directly.

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

    async def drain(self, session_ids: Iterable[str] | None = None, timeout: float = 30.0) -> None:
        """After a run: let its rollouts (``session_ids``; None: all of this event loop's) post
        their records, up to ``timeout`` seconds, then close this loop's HTTP pool unless another
        run's rollout still uses it. Other runs' rollouts are neither waited for nor disturbed."""
        await self.app.wait_sessions(session_ids, timeout)
        await self.app.close_idle_http()

    async def aclose(self) -> None:
        """Cancel rollouts still running, on every event loop (each still gets its terminal
        record), and close the HTTP pools: for the runner's owner, once no run uses it."""
        await self.app.shutdown()
