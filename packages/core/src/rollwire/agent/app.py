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

Imports stay light (no gateway, engine or NumPy): this module runs inside agent containers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import inspect
import json
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import aiohttp
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from rollwire.agent.context import PAYLOAD_KEY, RolloutContext, rollout_context

__all__ = ["SESSION_HEADER", "InvocationContext", "RolloutApp", "RolloutOutcome", "load_app"]

log = logging.getLogger(__name__)

#: AgentCore Runtime's session header.
SESSION_HEADER = "X-Amzn-Bedrock-AgentCore-Runtime-Session-Id"

Handler = Callable[..., Any]
TerminalStatus = Literal["completed", "failed", "timeout", "cancelled"]
T = TypeVar("T")
#: How many finished session ids an app remembers, so a late duplicate invocation is not rerun.
_FINISHED_MEMORY = 10_000


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


class _HandlerTimeout(Exception):
    pass


class _HandlerAborted(Exception):
    """A ``BaseException`` that is not an ``Exception`` (``SystemExit``, ``KeyboardInterrupt``, a
    custom one) raised by a handler, carried as an ``Exception``: it fails that rollout, and never
    reaches the event loop (asyncio re-raises ``SystemExit``/``KeyboardInterrupt`` from a task
    into the loop, which would stop the trainer)."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(f"{type(original).__name__}: {original}")
        self.original = original


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


def _is_reward(value: Any) -> bool:
    if isinstance(value, Mapping):
        return "reward" in value
    return isinstance(value, (int, float)) and not isinstance(value, bool)


async def _last_reward_async(events: Any) -> Any:
    """Consume an async generator handler; its result is the last reward-shaped value it yielded."""
    result: Any = None
    async with contextlib.aclosing(events):
        async for event in events:
            if _is_reward(event):
                result = event
    return result


def _last_reward_sync(events: Any) -> Any:
    """The sync twin of :func:`_last_reward_async` (a generator is consumed on its thread)."""
    if not inspect.isgenerator(events):
        return events
    result: Any = None
    with contextlib.closing(events):
        for event in events:
            if _is_reward(event):
                result = event
    return result


def _sse(event: Any) -> str:
    """One server-sent event, as AgentCore frames a yielded value."""
    return f"data: {json.dumps(event, ensure_ascii=False, default=str)}\n\n"


def _sse_error(exc: Exception) -> str:
    log.exception("streaming invocation failed")
    return _sse({"error": f"{type(exc).__name__}: {exc}", "error_type": type(exc).__name__})


async def _sse_async(events: Any) -> AsyncIterator[str]:
    async with contextlib.aclosing(events):
        try:
            async for event in events:
                yield _sse(event)
        except Exception as exc:
            yield _sse_error(exc)


def _sse_sync(events: Any) -> Iterator[str]:
    with contextlib.closing(events):
        try:
            for event in events:
                yield _sse(event)
        except Exception as exc:
            yield _sse_error(exc)


class _HandlerThreads:
    """Runs sync handlers on daemon threads, at most ``limit`` at once.

    A Python thread cannot be killed: a sync handler that overruns its deadline (or outlives a
    shutdown) runs on and keeps its slot until it returns. Daemon threads never hold up process
    exit, unlike ``ThreadPoolExecutor`` workers, which the interpreter joins at exit.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"max_threads must be at least 1, got {limit}")
        self.limit = limit
        self._slots = threading.BoundedSemaphore(limit)
        self._alive = 0
        self._lock = threading.Lock()

    @property
    def alive(self) -> int:
        """Handler threads running now (including ones whose rollout already ended)."""
        return self._alive

    async def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on a new daemon thread once a slot is free; cancelling leaves it running."""
        delay = 0.005
        while not self._slots.acquire(blocking=False):  # a threading semaphore: loop-agnostic
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.1)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def settle(ok: bool, value: Any) -> None:
            if future.done():  # the awaiting rollout was cancelled or timed out
                return
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

        def target() -> None:
            ok: bool
            value: Any
            try:
                ok, value = True, fn()
            except Exception as exc:  # handed to the awaiting coroutine
                ok, value = False, exc
            except BaseException as exc:  # SystemExit & co.: a failed handler, never the loop's
                ok, value = False, _HandlerAborted(exc)
            finally:
                with self._lock:
                    self._alive -= 1
                self._slots.release()
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is waiting
                loop.call_soon_threadsafe(settle, ok, value)

        with self._lock:
            self._alive += 1
        try:
            threading.Thread(target=target, name="rollout-handler", daemon=True).start()
        except BaseException:
            with self._lock:
                self._alive -= 1
            self._slots.release()
            raise
        return await future


def _cancel(task: asyncio.Future[Any]) -> None:
    """Cancel a task of this or another event loop (a task may only be touched on its own)."""
    owner = task.get_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if owner is running:
        task.cancel()
    else:
        with contextlib.suppress(RuntimeError):  # its loop is closed: the task is gone anyway
            owner.call_soon_threadsafe(task.cancel)


async def _wait_tasks(
    tasks: Collection[asyncio.Future[Any]], timeout: float | None
) -> set[asyncio.Future[Any]]:
    """Wait for tasks of any event loop: the running loop's are awaited, other loops' polled
    (awaiting a future of another loop raises). Returns the ones still pending at ``timeout``."""
    loop = asyncio.get_running_loop()
    end = None if timeout is None else loop.time() + timeout
    own = {t for t in tasks if t.get_loop() is loop}
    if own:
        await asyncio.wait(own, timeout=timeout)
    delay = 0.005
    while foreign := [
        t
        for t in tasks
        if t.get_loop() is not loop and not t.done() and not t.get_loop().is_closed()
    ]:
        left = None if end is None else end - loop.time()
        if left is not None and left <= 0:
            return {*foreign, *(t for t in own if not t.done())}
        await asyncio.sleep(delay if left is None else min(delay, left))
        delay = min(delay * 2, 0.1)
    return {t for t in own if not t.done()}


@dataclass
class _ReportState:
    """Whether the gateway holds a terminal record of this rollout (ours, or one that won)."""

    accepted: bool = False


class RolloutApp:
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
        if not math.isfinite(failure_reward):
            raise ValueError(f"failure_reward must be finite, got {failure_reward}")
        self.failure_reward = float(failure_reward)
        self.max_threads = max_threads
        self.post_retries = post_retries
        self.post_timeout = post_timeout
        self.report_grace = report_grace
        self.shutdown_timeout = shutdown_timeout
        self.debug = debug
        self._handler: Handler | None = None
        self._takes_context = False
        # One app may serve several event loops at once (a shared LocalRunner used from threads,
        # each with its own loop): this lock guards the state they share.
        self._lock = threading.Lock()
        self._running: dict[str, asyncio.Task[None]] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._final_posts: set[asyncio.Task[bool]] = set()
        self._stop_at: float | None = None
        self._threads = _HandlerThreads(max_threads)
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
        """Register ``fn(payload[, context])`` as the app's entrypoint: sync or async, a plain
        function or a generator (``yield`` events; see :meth:`_call_handler` for rollouts)."""
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if not params:
            raise TypeError(f"entrypoint {fn.__name__} must take the payload as its first argument")
        self._handler = fn
        self._takes_context = len(params) >= 2
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

    async def _call_handler(
        self, payload: Any, ctx: InvocationContext, *, rollout: bool = False
    ) -> Any:
        """Call the entrypoint: async functions on the loop, sync ones on a handler thread.

        In production a generator's events are returned unconsumed (they are streamed). In a
        rollout the generator is run to its end and the result is the last value it yielded that
        is a number or a dict with ``"reward"`` (so an agent that streams progress still reports).
        """
        fn = self.handler
        args: tuple[Any, ...] = (payload, ctx) if self._takes_context else (payload,)
        if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
            result = fn(*args)
        elif rollout:  # a sync generator is consumed on its thread too
            result = await self._threads.run(lambda: _last_reward_sync(fn(*args)))
        else:
            result = await self._threads.run(functools.partial(fn, *args))
        if inspect.isawaitable(result):  # an async function, or a sync one returning a coroutine
            result = await result
        if rollout and inspect.isasyncgen(result):
            result = await _last_reward_async(result)
        return result

    async def start_rollout(
        self,
        payload: Mapping[str, Any],
        session_id: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """Start the rollout in ``payload`` in the background; returns the ``accepted`` answer.

        Used by ``POST /invocations`` and by the in-process :class:`~rollwire.trainer.runners.LocalRunner`.
        An invocation for a session that runs, or already ran here, is acknowledged, not run again.
        """
        rc = rollout_context(payload)
        if rc is None:
            raise ValueError(f"not a rollout payload: no {PAYLOAD_KEY!r} key")
        self.handler  # noqa: B018 - fail here, not in the background, when nothing is registered
        sid = rc.session_id
        loop = asyncio.get_running_loop()
        with self._lock:
            if sid in self._running or sid in self._finished:
                return {"status": "accepted", "session_id": sid}
            ctx = InvocationContext(
                session_id=session_id or sid, headers=dict(headers or {}), rollout=rc
            )
            task = loop.create_task(self._run_rollout(payload, ctx, rc), name=f"rollout-{sid}")
            self._running[sid] = task
        self._touch()
        task.add_done_callback(functools.partial(self._forget, sid))
        return {"status": "accepted", "session_id": sid}

    def _forget(self, sid: str, task: asyncio.Task[None]) -> None:
        with self._lock:
            if self._running.get(sid) is task:
                del self._running[sid]
            self._finished[sid] = None
            while len(self._finished) > _FINISHED_MEMORY:
                self._finished.popitem(last=False)
        self._touch()

    def _discard_post(self, post: asyncio.Task[bool]) -> None:
        with self._lock:
            self._final_posts.discard(post)

    def _live_tasks(self) -> list[asyncio.Task[None]]:
        """The running rollouts' tasks; ones of a closed event loop (they can never finish, and
        their done callbacks never run) are forgotten."""
        with self._lock:
            dead = [s for s, t in self._running.items() if t.get_loop().is_closed()]
            for sid in dead:
                del self._running[sid]
                self._finished[sid] = None
            return list(self._running.values())

    def _touch(self) -> None:
        self._last_update = int(time.time())

    async def _run_rollout(
        self, payload: Mapping[str, Any], ctx: InvocationContext, rc: RolloutContext
    ) -> None:
        state = _ReportState()
        outcome: RolloutOutcome | None = None
        try:
            outcome = await self._outcome(payload, ctx, rc)
            loop = asyncio.get_running_loop()
            remaining = rc.remaining()
            give_up_at = None if remaining is None else loop.time() + remaining + self.report_grace
            await self._report(rc, outcome, state, give_up_at=give_up_at)
        except asyncio.CancelledError:
            # Cancelled at any point (shutdown, or a caller's cancel), also mid-post or in a
            # backoff: the gateway still gets one record, within the shutdown budget. A result
            # the handler already produced is posted as it is, not thrown away.
            if not state.accepted:
                final = outcome or RolloutOutcome(
                    "cancelled",
                    self.failure_reward,
                    error="rollout cancelled: the agent process shut down",
                )
                post = asyncio.get_running_loop().create_task(self._final_report(rc, final, state))
                with self._lock:
                    self._final_posts.add(post)
                post.add_done_callback(self._discard_post)
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(post)  # cancelled again: the post goes on regardless
            raise

    async def _outcome(
        self, payload: Mapping[str, Any], ctx: InvocationContext, rc: RolloutContext
    ) -> RolloutOutcome:
        """Run the handler under the deadline and turn whatever happens into a terminal record."""
        try:
            remaining = rc.remaining()
            if remaining is not None and remaining <= 0:
                raise asyncio.TimeoutError
            result = await asyncio.wait_for(self._guarded(payload, ctx), timeout=remaining)
            reward, metrics = _outcome_from_result(result)
            return RolloutOutcome("completed", reward, metrics)
        except asyncio.TimeoutError:
            return RolloutOutcome(
                "failed",
                self.failure_reward,
                error=f"deadline exceeded: the rollout ran past its deadline ({rc.deadline})",
            )
        except _HandlerTimeout as exc:  # the handler's own timeout, not the deadline
            return self._failed(rc, exc.__cause__ or exc)
        except _InvalidReward as exc:
            return RolloutOutcome("failed", self.failure_reward, error=f"invalid reward: {exc}")
        except _HandlerAborted as exc:
            return self._failed(rc, exc.original)
        except Exception as exc:
            return self._failed(rc, exc)
        except (asyncio.CancelledError, GeneratorExit):
            raise  # a cancelled (or closed) rollout: _run_rollout posts its record
        except BaseException as exc:  # SystemExit, KeyboardInterrupt, a custom BaseException
            return self._failed(rc, exc)

    async def _guarded(self, payload: Mapping[str, Any], ctx: InvocationContext) -> Any:
        # a TimeoutError of the handler itself must not read as the deadline's (wait_for's)
        try:
            return await self._call_handler(payload, ctx, rollout=True)
        except (asyncio.TimeoutError, TimeoutError) as exc:
            raise _HandlerTimeout(str(exc)) from exc
        except (Exception, asyncio.CancelledError, GeneratorExit):
            raise
        except BaseException as exc:
            # wait_for may run this in a task of its own (Python < 3.12), and a task re-raises
            # SystemExit/KeyboardInterrupt into the event loop: carry it as an Exception instead
            raise _HandlerAborted(exc) from exc

    def _failed(self, rc: RolloutContext, exc: BaseException) -> RolloutOutcome:
        log.warning("rollout %s failed: %s: %s", rc.session_id, type(exc).__name__, exc)
        return RolloutOutcome("failed", self.failure_reward, error=f"{type(exc).__name__}: {exc}")

    async def _client(self) -> aiohttp.ClientSession:
        """This event loop's HTTP pool (an aiohttp session is bound to the loop it was made on)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            client = self._http.get(loop)
            if client is None or client.closed:
                for gone in [lp for lp in self._http if lp.is_closed()]:
                    del self._http[gone]  # nothing can close those any more; do not hold them
                client = aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=self.post_timeout),
                    connector=aiohttp.TCPConnector(limit=64),
                )
                self._http[loop] = client
        return client

    async def _post_once(
        self, rc: RolloutContext, body: dict[str, Any], timeout: float
    ) -> tuple[int, str]:
        client = await self._client()
        async with client.post(
            rc.complete_url,
            json=body,
            headers={"Authorization": f"Bearer {rc.api_key}"},
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as resp:
            if resp.status < 300 or resp.status == 409:
                return resp.status, ""
            return resp.status, (await resp.text())[:200]

    async def _report(
        self,
        rc: RolloutContext,
        outcome: RolloutOutcome,
        state: _ReportState,
        *,
        give_up_at: float | None,
        min_retries: int | None = None,
        max_delay: float = 5.0,
    ) -> bool:
        """Post the terminal record, retrying transport errors, 429 and 5xx with bounded backoff:
        at least ``min_retries`` retries (default ``post_retries``) and on until ``give_up_at``
        (loop time). True once the gateway holds our record; 4xx other than 429 is final."""
        loop = asyncio.get_running_loop()
        retries = self.post_retries if min_retries is None else min_retries
        body = outcome.body()
        delay = 0.2
        last = ""
        attempt = 0
        while True:
            timeout = self.post_timeout
            if give_up_at is not None and attempt >= retries:
                timeout = min(timeout, give_up_at - loop.time())
            if timeout <= 0:
                break
            try:
                status, text = await self._post_once(rc, body, timeout)
                if status < 300:
                    state.accepted = True
                    with self._lock:
                        self.completed += 1
                    return True
                if status == 409:  # already terminal with another record: nothing to add
                    state.accepted = True
                    log.warning(
                        "rollout %s: gateway already holds a different terminal record",
                        rc.session_id,
                    )
                    return False
                last = f"HTTP {status}: {text}"
                if status < 500 and status != 429:
                    break
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            attempt += 1
            past_minimum = attempt > retries
            if past_minimum and (give_up_at is None or loop.time() + delay >= give_up_at):
                break
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_delay)
        log.error(
            "rollout %s: could not post its terminal record (%s) to %s: %s",
            rc.session_id,
            outcome.status,
            rc.complete_url,
            last or "out of time",
        )
        return False

    async def _final_report(
        self, rc: RolloutContext, outcome: RolloutOutcome, state: _ReportState
    ) -> bool:
        """The record of a cancelled rollout, within the shutdown budget that every such post
        shares (or ``shutdown_timeout`` from now when no shutdown is under way)."""
        loop = asyncio.get_running_loop()
        stop_at = (
            self._stop_at if self._stop_at is not None else loop.time() + self.shutdown_timeout
        )
        return await self._report(
            rc, outcome, state, give_up_at=stop_at, min_retries=0, max_delay=1.0
        )

    async def run_rollout(self, payload: Mapping[str, Any], session_id: str | None = None) -> None:
        """Run one rollout to its end in the current event loop (Ray workers use this)."""
        await self.start_rollout(payload, session_id)
        sid = str(payload[PAYLOAD_KEY]["session_id"])
        task = self._running.get(sid)
        if task is not None:
            await asyncio.shield(task)

    async def wait_idle(self, timeout: float | None = None) -> None:
        """Return once no rollout runs, on any event loop (or raise ``TimeoutError``)."""

        async def _wait() -> None:
            while tasks := self._live_tasks():
                await _wait_tasks(tasks, None)

        await asyncio.wait_for(_wait(), timeout)

    async def wait_sessions(
        self, session_ids: Iterable[str] | None = None, timeout: float | None = None
    ) -> bool:
        """Wait for these sessions' rollouts to end (their terminal records are posted by then);
        ``None``: every rollout of the running event loop. Rollouts of other sessions are not
        waited for, wherever they run. True when all ended within ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        tasks = self._live_tasks()
        if session_ids is None:
            wanted = [t for t in tasks if t.get_loop() is loop]
        else:
            with self._lock:
                found = (self._running.get(sid) for sid in set(session_ids))
                wanted = [t for t in found if t is not None]
        return not await _wait_tasks(wanted, timeout)

    async def close_http(self) -> None:
        """Close this event loop's HTTP pool (a later report opens a new one)."""
        with self._lock:
            client = self._http.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.close()

    async def close_idle_http(self) -> bool:
        """Close this event loop's HTTP pool unless a rollout or record post of this loop may
        still use it (a later report opens a new one). True when no pool of this loop is left."""
        loop = asyncio.get_running_loop()
        with self._lock:
            in_use = any(
                t.get_loop() is loop and not t.done()
                for t in (*self._running.values(), *self._final_posts)
            )
            client = None if in_use else self._http.pop(loop, None)
        if client is not None:
            await client.close()
        return not in_use

    async def _close_all_http(self, timeout: float = 5.0) -> None:
        """Close every loop's HTTP pool, each on its own loop (the owner's close)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            clients, self._http = self._http, {}
        for owner, client in clients.items():
            if owner is loop:
                await client.close()
            elif owner.is_running() and not owner.is_closed():
                with contextlib.suppress(Exception):  # that loop stopped meanwhile: nothing to do
                    done = asyncio.run_coroutine_threadsafe(client.close(), owner)
                    await asyncio.wait_for(asyncio.wrap_future(done), timeout)

    async def shutdown(self) -> None:
        """Cancel running rollouts (on every event loop) and post their records, all within
        ``shutdown_timeout`` seconds together; close HTTP clients. Sync handler threads are not
        waited for (they cannot be stopped, and being daemon threads they do not hold up the
        process's exit)."""
        loop = asyncio.get_running_loop()
        self._stop_at = loop.time() + self.shutdown_timeout
        try:
            tasks = self._live_tasks()
            for task in tasks:
                _cancel(task)
            with self._lock:
                posts = list(self._final_posts)
            pending: list[asyncio.Future[Any]] = [*tasks, *posts]
            if pending:
                # every post gives up at _stop_at by itself; the margin covers the last attempt
                late = await _wait_tasks(pending, self.shutdown_timeout + 1.0)
                for fut in late:
                    _cancel(fut)
                if late:
                    log.error(
                        "shutdown: %d rollout(s) did not post their record within %.0fs",
                        len(late),
                        self.shutdown_timeout,
                    )
            await self._close_all_http()
        finally:
            self._stop_at = None

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
            return StreamingResponse(_sse_async(result), media_type="text/event-stream")
        if inspect.isgenerator(result):  # iterated on Starlette's thread pool
            return StreamingResponse(_sse_sync(result), media_type="text/event-stream")
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
