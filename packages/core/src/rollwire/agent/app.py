"""The agent-side server: a drop-in for a Bedrock AgentCore app that also runs RL rollouts.

``app = RolloutApp()`` and ``@app.rollout_entrypoint`` on ``def handler(payload[, context])``
(sync or async). The app speaks the AgentCore Runtime HTTP contract (``POST /invocations``,
``GET /ping``, port 8080) so one container serves AgentCore, Kubernetes or a laptop.

A payload with ``_rollwire`` is a rollout: the invocation answers ``{"status": "accepted"}`` at
once, the handler runs in the background, and its reward is posted to ``complete_url``. Every
rollout ends with exactly one terminal record, also when the handler raises, overruns its
deadline, returns no valid reward, or the process shuts down. A payload without ``_rollwire`` runs
in the foreground and returns the handler's result, as in production; a generator handler (``yield``
events) is streamed as server-sent events, like AgentCore does.

The pieces: :mod:`rollwire.agent.invocation` (the protocol), :mod:`rollwire.agent.rollouts` (the
rollout runner), :mod:`rollwire.agent.reporter` (terminal records), :mod:`rollwire.agent.handlers`
(calling handlers). Imports stay light (no gateway, engine or NumPy): this runs in agent containers.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from rollwire.agent.context import rollout_context
from rollwire.agent.invocation import SESSION_HEADER, InvocationContext, sse_async, sse_sync
from rollwire.agent.reporter import RolloutOutcome
from rollwire.agent.rollouts import RolloutRunner

__all__ = ["SESSION_HEADER", "InvocationContext", "RolloutApp", "RolloutOutcome", "load_app"]

log = logging.getLogger(__name__)


class RolloutApp(RolloutRunner):
    """AgentCore-compatible ASGI app whose entrypoint doubles as an RL rollout worker.

    ``failure_reward`` is reported for failed, timed-out and cancelled rollouts. ``max_threads``
    bounds how many sync handlers run at once (a sync handler's thread cannot be killed: one that
    overruns its deadline keeps its slot until it returns). A terminal record is posted with
    retries (bounded backoff) for at least ``post_retries`` retries and until ``report_grace``
    seconds past the rollout's deadline. On shutdown, all remaining records share one budget of
    ``shutdown_timeout`` seconds (Kubernetes gives a pod 30 s after SIGTERM).
    """

    def __init__(
        self,
        *,
        failure_reward: float = 0.0,
        max_threads: int = 64,
        post_retries: int = 4,
        post_timeout: float = 10.0,
        report_grace: float = 10.0,
        shutdown_timeout: float = 10.0,
        debug: bool = False,
    ) -> None:
        super().__init__(
            failure_reward=failure_reward,
            max_threads=max_threads,
            post_retries=post_retries,
            post_timeout=post_timeout,
            report_grace=report_grace,
            shutdown_timeout=shutdown_timeout,
        )
        self.debug = debug
        self.asgi = Starlette(
            debug=debug,
            routes=[
                Route("/invocations", self._invocations, methods=["POST"]),
                Route("/ping", self._ping, methods=["GET"]),
            ],
            lifespan=self._lifespan,
        )

    def ping_status(self) -> dict[str, Any]:
        """The ``/ping`` body."""
        return {
            "status": "HealthyBusy" if self.busy else "Healthy",
            "time_of_last_update": self._last_update,
        }

    # -- HTTP -----------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        yield
        await self.shutdown()

    async def _ping(self, request: Request) -> Response:
        return JSONResponse(self.ping_status())

    async def _invocations(self, request: Request) -> Response:
        session_id = request.headers.get(SESSION_HEADER)
        try:
            payload = await request.json()
        except ValueError:
            return JSONResponse(
                {"error": "the request body must be a JSON object"}, status_code=400
            )
        try:
            rc = rollout_context(payload)
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        if rc is not None:
            try:
                answer = await self.start_rollout(payload, session_id, dict(request.headers))
            except RuntimeError as exc:
                return JSONResponse({"error": str(exc)}, status_code=500)
            return JSONResponse(answer)
        ctx = InvocationContext(session_id=session_id, headers=dict(request.headers))
        self._touch()
        try:
            result = await self._call_handler(payload, ctx)
        except Exception as exc:
            log.exception("invocation failed")
            return JSONResponse({"error": f"{type(exc).__name__}: {exc}"}, status_code=500)
        if isinstance(result, Response):
            return result
        if inspect.isasyncgen(result):  # AgentCore streams a generator's events as SSE
            return StreamingResponse(sse_async(result), media_type="text/event-stream")
        if inspect.isgenerator(result):  # iterated on Starlette's thread pool
            return StreamingResponse(sse_sync(result), media_type="text/event-stream")
        return JSONResponse(result)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.asgi(scope, receive, send)

    def run(self, host: str = "0.0.0.0", port: int = 8080, **uvicorn_kwargs: Any) -> None:
        """Serve with uvicorn (AgentCore expects port 8080 on all interfaces)."""
        import uvicorn

        uvicorn.run(self, host=host, port=port, **uvicorn_kwargs)


def load_app(app_path: str) -> RolloutApp:
    """Import ``"module:attr"`` and return its RolloutApp (a bare handler is wrapped in one)."""
    module, sep, attr = app_path.partition(":")
    if not sep or not module or not attr:
        raise ValueError(
            f"expected 'module:app' (e.g. rollwire.envs.wordle.agent_openai:app), got {app_path!r}"
        )
    obj = getattr(importlib.import_module(module), attr)
    if isinstance(obj, RolloutApp):
        return obj
    if callable(obj):
        app = RolloutApp()
        app.rollout_entrypoint(obj)
        return app
    raise TypeError(f"{app_path} is a {type(obj).__name__}, not a RolloutApp or a handler function")
