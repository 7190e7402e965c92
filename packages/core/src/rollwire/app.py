"""The agent-side server: a drop-in for a Bedrock AgentCore app that also runs RL rollouts.

``app = RolloutApp()`` and ``@app.rollout_entrypoint`` on ``def handler(payload[, context])``
(sync or async). The app speaks the AgentCore Runtime HTTP contract (``POST /invocations``,
``GET /ping``, port 8080) so one container serves AgentCore, Kubernetes or a laptop.

A payload with ``_rollwire`` is a rollout: the invocation answers ``{"status": "accepted"}`` at
once, the handler runs in the background, and its reward is posted to ``complete_url``. Every
rollout ends with exactly one terminal record, also when the handler raises, overruns its
deadline, returns no valid reward, or the process shuts down. A payload without ``_rollwire`` runs
in the foreground and returns the handler's result, as in production.

Imports stay light (no gateway, engine or NumPy): this module runs inside agent containers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import inspect
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rollwire.context import PAYLOAD_KEY, RolloutContext, rollout_context

__all__ = ["SESSION_HEADER", "InvocationContext", "RolloutApp", "RolloutOutcome", "load_app"]

log = logging.getLogger(__name__)

#: AgentCore Runtime's session header.
SESSION_HEADER = "X-Amzn-Bedrock-AgentCore-Runtime-Session-Id"

Handler = Callable[..., Any]
TerminalStatus = Literal["completed", "failed", "timeout", "cancelled"]


@dataclass
class InvocationContext:
    """What a handler may take as its second argument (AgentCore's ``RequestContext`` shape)."""

    session_id: str | None
    headers: dict[str, str] = field(default_factory=dict)
    rollout: RolloutContext | None = None


@dataclass(frozen=True)
class RolloutOutcome:
    """The terminal record of one rollout, as posted to ``complete_url``."""

    status: TerminalStatus
    reward: float
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    def body(self) -> dict[str, Any]:
        """The JSON body of ``POST /api/sessions/{id}/complete``."""
        out: dict[str, Any] = {
            "status": self.status,
            "reward": self.reward,
            "metrics": self.metrics,
        }
        if self.error is not None:
            out["error"] = self.error
        return out


class _InvalidReward(ValueError):
    pass


def _outcome_from_result(result: Any) -> tuple[float, dict[str, float]]:
    """Read ``float`` or ``{"reward": float, "metrics": {...}}``; raise on anything else."""
    metrics: dict[str, float] = {}
    reward: Any = result
    if isinstance(result, Mapping):
        if "reward" not in result:
            raise _InvalidReward(
                f"handler returned a dict without 'reward' (keys: {sorted(result)})"
            )
        reward = result["reward"]
        raw_metrics = result.get("metrics") or {}
        if not isinstance(raw_metrics, Mapping):
            raise _InvalidReward(
                f"'metrics' must be a dict of numbers, got {type(raw_metrics).__name__}"
            )
        for k, v in raw_metrics.items():
            try:
                fv = float(v)
            except (TypeError, ValueError):
                continue  # non-numeric metrics are dropped, not fatal: the reward is what matters
            if math.isfinite(fv):
                metrics[str(k)] = fv
    if isinstance(reward, bool) or reward is None:
        raise _InvalidReward(f"handler returned no usable reward: {reward!r}")
    try:
        value = float(reward)
    except (TypeError, ValueError) as exc:
        raise _InvalidReward(
            f"reward must be a number, got {type(reward).__name__}: {reward!r}"
        ) from exc
    if not math.isfinite(value):
        raise _InvalidReward(f"reward must be finite, got {value}")
    return value, metrics


class RolloutApp:
    """AgentCore-compatible ASGI app whose entrypoint doubles as an RL rollout worker.

    ``failure_reward`` is reported for failed, timed-out and cancelled rollouts; ``max_threads``
    bounds how many sync handlers run at once; ``post_retries`` is how often a terminal record is
    retried (with backoff) before it is given up on and logged.
    """

    def __init__(
        self,
        *,
        failure_reward: float = 0.0,
        max_threads: int = 64,
        post_retries: int = 4,
        post_timeout: float = 10.0,
        debug: bool = False,
    ) -> None:
        if not math.isfinite(failure_reward):
            raise ValueError(f"failure_reward must be finite, got {failure_reward}")
        self.failure_reward = float(failure_reward)
        self.max_threads = max_threads
        self.post_retries = post_retries
        self.post_timeout = post_timeout
        self.debug = debug
        self._handler: Handler | None = None
        self._takes_context = False
        self._is_async = False
        self._running: dict[str, asyncio.Task[None]] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._http: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
        self._last_update = int(time.time())
        self.completed: int = 0
        self.asgi = Starlette(
            debug=debug,
            routes=[
                Route("/invocations", self._invocations, methods=["POST"]),
                Route("/ping", self._ping, methods=["GET"]),
            ],
            lifespan=self._lifespan,
        )

    # -- registration -------------------------------------------------------------------------

    def rollout_entrypoint(self, fn: Handler) -> Handler:
        """Register ``fn(payload[, context])`` (sync or async) as the app's entrypoint."""
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if not params:
            raise TypeError(f"entrypoint {fn.__name__} must take the payload as its first argument")
        self._handler = fn
        self._takes_context = len(params) >= 2
        self._is_async = inspect.iscoroutinefunction(fn)
        return fn

    #: AgentCore's decorator name, so ``BedrockAgentCoreApp`` code changes only its constructor.
    entrypoint = rollout_entrypoint

    @property
    def handler(self) -> Handler:
        """The registered entrypoint; raises when none was registered."""
        if self._handler is None:
            raise RuntimeError(
                "no entrypoint registered: decorate a function with @app.rollout_entrypoint"
            )
        return self._handler

    # -- state ----------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """True while any rollout runs (``/ping`` says ``HealthyBusy``)."""
        return bool(self._running)

    @property
    def running(self) -> int:
        """How many rollouts run now."""
        return len(self._running)

    def ping_status(self) -> dict[str, Any]:
        """The ``/ping`` body."""
        return {
            "status": "HealthyBusy" if self.busy else "Healthy",
            "time_of_last_update": self._last_update,
        }

    # -- running handlers -----------------------------------------------------------------------

    async def _call_handler(self, payload: Any, ctx: InvocationContext) -> Any:
        fn = self.handler
        args: tuple[Any, ...] = (payload, ctx) if self._takes_context else (payload,)
        if self._is_async:
            return await fn(*args)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.max_threads, thread_name_prefix="rollout")
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(self._executor, functools.partial(fn, *args))
        if inspect.isawaitable(result):  # a sync function that returned a coroutine
            result = await result
        return result

    async def start_rollout(
        self,
        payload: Mapping[str, Any],
        session_id: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """Start the rollout in ``payload`` in the background; returns the ``accepted`` answer.

        Used by ``POST /invocations`` and by the in-process :class:`~rollwire.runners.LocalRunner`.
        An invocation for a session that already runs is acknowledged, not started twice.
        """
        rc = rollout_context(payload)
        if rc is None:
            raise ValueError(f"not a rollout payload: no {PAYLOAD_KEY!r} key")
        self.handler  # noqa: B018 - fail here, not in the background, when nothing is registered
        sid = rc.session_id
        if sid not in self._running:
            ctx = InvocationContext(
                session_id=session_id or sid, headers=dict(headers or {}), rollout=rc
            )
            task = asyncio.get_running_loop().create_task(
                self._run_rollout(payload, ctx, rc), name=f"rollout-{sid}"
            )
            self._running[sid] = task
            self._touch()
            task.add_done_callback(functools.partial(self._forget, sid))
        return {"status": "accepted", "session_id": sid}

    def _forget(self, sid: str, task: asyncio.Task[None]) -> None:
        if self._running.get(sid) is task:
            del self._running[sid]
        self._touch()

    def _touch(self) -> None:
        self._last_update = int(time.time())

    async def _run_rollout(
        self, payload: Mapping[str, Any], ctx: InvocationContext, rc: RolloutContext
    ) -> None:
        outcome: RolloutOutcome
        try:
            remaining = rc.remaining()
            if remaining is not None and remaining <= 0:
                raise asyncio.TimeoutError
            result = await asyncio.wait_for(self._call_handler(payload, ctx), timeout=remaining)
            reward, metrics = _outcome_from_result(result)
            outcome = RolloutOutcome("completed", reward, metrics)
        except asyncio.CancelledError:
            await self._report(
                rc,
                RolloutOutcome(
                    "cancelled",
                    self.failure_reward,
                    error="rollout cancelled: the agent process shut down",
                ),
            )
            raise
        except asyncio.TimeoutError:
            outcome = RolloutOutcome(
                "failed",
                self.failure_reward,
                error=f"deadline exceeded: the rollout ran past its deadline ({rc.deadline})",
            )
        except _InvalidReward as exc:
            outcome = RolloutOutcome("failed", self.failure_reward, error=f"invalid reward: {exc}")
        except Exception as exc:
            log.warning("rollout %s failed: %s: %s", rc.session_id, type(exc).__name__, exc)
            outcome = RolloutOutcome(
                "failed", self.failure_reward, error=f"{type(exc).__name__}: {exc}"
            )
        await self._report(rc, outcome)

    async def _client(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        client = self._http.get(loop)
        if client is None or client.closed:
            client = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.post_timeout),
                connector=aiohttp.TCPConnector(limit=64),
            )
            self._http[loop] = client
        return client

    async def _report(self, rc: RolloutContext, outcome: RolloutOutcome) -> bool:
        """Post the terminal record, retrying transport errors, 429 and 5xx with backoff."""
        headers = {"Authorization": f"Bearer {rc.api_key}"}
        body = outcome.body()
        delay = 0.2
        last = ""
        for attempt in range(self.post_retries + 1):
            try:
                client = await self._client()
                async with client.post(rc.complete_url, json=body, headers=headers) as resp:
                    status, text = resp.status, await resp.text()
                if status < 300:
                    self.completed += 1
                    return True
                if status == 409:  # already terminal with another record: nothing to add
                    log.warning(
                        "rollout %s: gateway already holds a different terminal record",
                        rc.session_id,
                    )
                    return False
                last = f"HTTP {status}: {text[:200]}"
                if status < 500 and status != 429:
                    break
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            if attempt < self.post_retries:
                await asyncio.sleep(delay)
                delay = min(delay * 2.5, 5.0)
        log.error(
            "rollout %s: could not post its terminal record to %s: %s",
            rc.session_id,
            rc.complete_url,
            last,
        )
        return False

    async def run_rollout(self, payload: Mapping[str, Any], session_id: str | None = None) -> None:
        """Run one rollout to its end in the current event loop (Ray workers use this)."""
        await self.start_rollout(payload, session_id)
        sid = str(payload[PAYLOAD_KEY]["session_id"])
        task = self._running.get(sid)
        if task is not None:
            await asyncio.shield(task)

    async def wait_idle(self, timeout: float | None = None) -> None:
        """Return once no rollout runs (or raise ``TimeoutError``)."""

        async def _wait() -> None:
            while self._running:
                await asyncio.gather(*list(self._running.values()), return_exceptions=True)

        await asyncio.wait_for(_wait(), timeout)

    async def close_http(self) -> None:
        """Close this event loop's HTTP pool (a later report opens a new one)."""
        client = self._http.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.close()

    async def shutdown(self) -> None:
        """Cancel running rollouts, wait for their ``cancelled`` records, close HTTP clients."""
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await self.close_http()
        if self._executor is not None and not self._running:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

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
            f"expected 'module:app' (e.g. rollwire.wordle.agent_openai:app), got {app_path!r}"
        )
    obj = getattr(importlib.import_module(module), attr)
    if isinstance(obj, RolloutApp):
        return obj
    if callable(obj):
        app = RolloutApp()
        app.rollout_entrypoint(obj)
        return app
    raise TypeError(f"{app_path} is a {type(obj).__name__}, not a RolloutApp or a handler function")
