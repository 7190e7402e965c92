"""Whether the agent of an in-flight call hung up before its answer was ready.

A non-streamed call whose agent went away is recorded non-trainable (``client_disconnected``): the
agent never saw the answer, so it does not build on it. Under uvicorn (how the gateway is always
served) the connection already keeps that state for every call on it: its protocol marks the
request cycle ``disconnected`` when the connection is lost, so :func:`watch` reads that flag and
starts nothing per call. Any other ASGI server gets a task per call that waits on ``receive()``
for ``http.disconnect``.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

__all__ = ["Hangup", "watch"]


class Hangup(Protocol):
    """One call's hang-up state: :meth:`is_set` once the agent is gone; :meth:`stop` when the
    handler is done (before the response is sent: a stream listens for itself)."""

    def is_set(self) -> bool:
        """True once the agent disconnected."""
        ...

    def stop(self) -> None:
        """Stop watching (nothing to do for a connection's own flag)."""
        ...


class _CycleFlag:
    """The uvicorn request cycle's own ``disconnected`` flag (set by ``connection_lost``)."""

    __slots__ = ("_cycle",)

    def __init__(self, cycle: Any) -> None:
        self._cycle = cycle

    def is_set(self) -> bool:
        return bool(self._cycle.disconnected)

    def stop(self) -> None:
        pass


class _Watcher:
    """A task that waits on ``receive()`` for ``http.disconnect`` (servers without the flag)."""

    __slots__ = ("_event", "_task")

    def __init__(self, receive: Any) -> None:
        self._event = asyncio.Event()
        self._task = asyncio.ensure_future(self._watch(receive))

    async def _watch(self, receive: Any) -> None:
        while True:
            message = await receive()
            if message.get("type") == "http.disconnect":
                self._event.set()
                return

    def is_set(self) -> bool:
        return self._event.is_set()

    def stop(self) -> None:
        self._task.cancel()


def watch(receive: Any) -> Hangup:
    """Watch the agent of a call whose request body was read already."""
    cycle = getattr(receive, "__self__", None)
    flow: Any = getattr(cycle, "flow", None)
    if isinstance(getattr(cycle, "disconnected", None), bool) and hasattr(flow, "resume_reading"):
        # uvicorn pauses reading while a large body piles up; a paused transport never notices
        # the peer's close. Its own receive() resumes reading before it waits: so do we.
        flow.resume_reading()
        return _CycleFlag(cycle)
    return _Watcher(receive)
