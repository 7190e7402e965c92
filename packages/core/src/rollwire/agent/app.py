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
import functools
import importlib
import inspect
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

import orjson
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from rollwire.agent.context import rollout_context
from rollwire.agent.handlers import WorkerLoop
from rollwire.agent.invocation import (
    DEBUG_ACTION_KEY,
    SESSION_HEADER,
    InvocationContext,
    PingStatus,
    sse_async,
    sse_sync,
)
from rollwire.agent.reporter import RolloutOutcome
from rollwire.agent.rollouts import RolloutRunner

__all__ = [
    "SESSION_HEADER",
    "InvocationContext",
    "PingStatus",
    "RolloutApp",
    "RolloutOutcome",
    "load_app",
]

T = TypeVar("T")

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
        max_body_bytes: int = 8 * 1024 * 1024,
        lifespan: Callable[[Any], AbstractAsyncContextManager[Any]] | None = None,
        middleware: Sequence[Middleware] | None = None,
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
        self.max_body_bytes = max_body_bytes  # larger /invocations bodies are refused (413)
        self._user_lifespan = lifespan
        self._ping_handler: Callable[[], Any] | None = None
        self._websocket_handler: Callable[..., Any] | None = None
        self._forced_ping: PingStatus | None = None
        self._async_tasks: dict[int, dict[str, Any]] = {}
        self._last_status: PingStatus | None = None
        self._worker = WorkerLoop()
        self._task_ids = itertools.count(1)
        self.asgi = Starlette(
            debug=debug,
            routes=[
                Route("/invocations", self._invocations, methods=["POST"]),
                Route("/ping", self._ping, methods=["GET"]),
                WebSocketRoute("/ws", self._websocket),
            ],
            middleware=middleware,
            lifespan=self._lifespan,
        )

    # -- the rest of BedrockAgentCoreApp's surface ------------------------------------------------

    def ping(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        """Register ``fn() -> PingStatus | str`` as the ``/ping`` status (a forced one wins)."""
        self._ping_handler = fn
        return fn

    def websocket(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Register ``async fn(websocket, context)`` as the ``/ws`` handler."""
        self._websocket_handler = fn
        return fn

    def async_task(self, fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
        """Decorate an ``async def`` so ``/ping`` says ``HealthyBusy`` while it runs."""
        if not inspect.iscoroutinefunction(fn):
            raise ValueError(f"@async_task can only be applied to async functions, not {fn!r}")

        @functools.wraps(fn)
        async def tracked(*args: Any, **kwargs: Any) -> T:
            task_id = self.add_async_task(fn.__name__)
            try:
                return await fn(*args, **kwargs)
            finally:
                self.complete_async_task(task_id)

        return tracked

    def add_async_task(self, name: str, metadata: Mapping[str, Any] | None = None) -> int:
        """Track background work under ``name`` (``/ping`` is busy until it is completed)."""
        info: dict[str, Any] = {"name": name, "start_time": time.time()}
        if metadata:
            info["metadata"] = dict(metadata)
        with self._lock:
            task_id = next(self._task_ids)
            self._async_tasks[task_id] = info
        return task_id

    def complete_async_task(self, task_id: int) -> bool:
        """End tracked work; False when ``task_id`` is not tracked (already completed)."""
        with self._lock:
            return self._async_tasks.pop(task_id, None) is not None

    def get_async_task_info(self) -> dict[str, Any]:
        """``{"active_count", "running_jobs": [{"name", "duration"}]}`` of the tracked work."""
        now = time.time()
        with self._lock:
            jobs = [
                {"name": t["name"], "duration": now - t["start_time"]}
                for t in self._async_tasks.values()
            ]
        return {"active_count": len(jobs), "running_jobs": jobs}

    def force_ping_status(self, status: PingStatus | str) -> None:
        """Make ``/ping`` answer ``status`` until :meth:`clear_forced_ping_status`."""
        self._forced_ping = PingStatus(status)

    def clear_forced_ping_status(self) -> None:
        """Let ``/ping`` report the app's own status again."""
        self._forced_ping = None

    @property
    def saturated(self) -> bool:
        """True when every handler thread is taken (also by handlers past their deadlines): a
        new sync rollout would wait, so ``/ping`` says ``HealthyBusy``."""
        return self._threads.saturated

    def get_current_ping_status(self) -> PingStatus:
        """Forced status, else the ``@app.ping`` handler's, else ``HealthyBusy`` while rollouts
        or tracked tasks run or the app is at its concurrency limit."""
        status = self._forced_ping
        if status is None and self._ping_handler is not None:
            try:
                status = PingStatus(self._ping_handler())
            except Exception as exc:  # a broken ping handler must not make the app unhealthy
                log.warning("the @app.ping handler failed (%s); using the app's own status", exc)
        if status is None:
            busy = self.busy or bool(self._async_tasks) or self.saturated
            status = PingStatus.HEALTHY_BUSY if busy else PingStatus.HEALTHY
        if status != self._last_status:
            self._last_status = status
            self._touch()
        return status

    def ping_status(self) -> dict[str, Any]:
        """The ``/ping`` body."""
        status = self.get_current_ping_status()
        return {"status": status.value, "time_of_last_update": self._last_update}

    def _debug_action(self, action: Any) -> Response:
        """``BedrockAgentCoreApp``'s debug actions (``{"_agent_core_app_action": ...}``)."""
        if action == "ping_status":
            return JSONResponse(self.ping_status())
        if action == "job_status":
            return JSONResponse(self.get_async_task_info())
        forced = {"force_healthy": PingStatus.HEALTHY, "force_busy": PingStatus.HEALTHY_BUSY}
        if action in forced:
            self.force_ping_status(forced[action])
            return JSONResponse({"forced_status": forced[action].value})
        if action == "clear_forced_status":
            self.clear_forced_ping_status()
            return JSONResponse({"forced_status": "Cleared"})
        return JSONResponse({"error": f"Unknown action: {action}"}, status_code=400)

    # -- HTTP -------------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _lifespan(self, _app: Starlette) -> AsyncIterator[Any]:
        try:
            if self._user_lifespan is None:
                yield None
            else:
                async with self._user_lifespan(self) as state:
                    yield state
        finally:
            await self.shutdown()
            if self._worker is not None:
                self._worker.close()

    async def _ping(self, request: Request) -> Response:
        return JSONResponse(self.ping_status())

    async def _websocket(self, websocket: WebSocket) -> None:
        if self._websocket_handler is None:
            await websocket.close(code=1011)
            return
        ctx = InvocationContext(
            session_id=websocket.headers.get(SESSION_HEADER),
            headers=dict(websocket.headers),
            request=websocket,
        )
        try:
            await self._websocket_handler(websocket, ctx)
        except WebSocketDisconnect:
            pass
        except Exception:
            log.exception("the /ws handler failed")
            with contextlib.suppress(Exception):
                await websocket.close(code=1011)

    async def _invocations(self, request: Request) -> Response:
        session_id = request.headers.get(SESSION_HEADER)
        raw = await _read_limited(request, self.max_body_bytes)
        if raw is None:
            return JSONResponse(
                {
                    "error": f"the request body is over this agent's limit of {self.max_body_bytes} bytes"
                },
                status_code=413,
            )
        try:
            payload = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:  # also JSON nested deeper than the parser allows
            return JSONResponse(
                {"error": f"the request body must be a JSON object ({exc})"}, status_code=400
            )
        if self.debug and isinstance(payload, Mapping) and DEBUG_ACTION_KEY in payload:
            return self._debug_action(payload[DEBUG_ACTION_KEY])
        try:
            rc = rollout_context(payload)
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        headers = dict(request.headers)
        if rc is not None:
            try:
                answer = await self.start_rollout(payload, session_id, headers, request)
            except RuntimeError as exc:
                return JSONResponse({"error": str(exc)}, status_code=500)
            return answer if isinstance(answer, Response) else JSONResponse(answer)
        ctx = InvocationContext(session_id=session_id, headers=headers, request=request)
        self._touch()
        try:
            result = await self.production_call(payload, ctx)
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

    async def production_call(self, payload: Any, ctx: InvocationContext) -> Any:
        """Serve an invocation that is not a rollout (here: the handler's result, as it is)."""
        return await self._call_handler(payload, ctx, offload=True)

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


async def _read_limited(request: Request, limit: int) -> bytes | None:
    """The request body, or None once it is over ``limit`` bytes (read no further)."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)
