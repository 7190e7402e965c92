"""The rollout runner: runs an entrypoint as a rollout in the background, under its deadline, and
always ends it with exactly one terminal record (reward or failure), also when the handler raises,
overruns its deadline, returns no valid reward, or the process shuts down.

:class:`RolloutRunner` is the part of :class:`~rollwire.agent.app.RolloutApp` that needs no HTTP
server: ``LocalRunner`` and Ray workers drive it directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import aiohttp

from rollwire.agent.context import PAYLOAD_KEY, RolloutContext, rollout_context
from rollwire.agent.handlers import (
    HandlerAborted,
    HandlerThreads,
    InvalidReward,
    WorkerLoop,
    call_handler,
    cancel_task,
    outcome_from_result,
    wait_tasks,
)
from rollwire.agent.invocation import InvocationContext
from rollwire.agent.reporter import Reporter, ReportState, RolloutOutcome

__all__ = ["RolloutRunner"]

log = logging.getLogger("rollwire.agent.app")

Handler = Callable[..., Any]
#: How many finished session ids an app remembers, so a late duplicate invocation is not rerun.
_FINISHED_MEMORY = 10_000


class _HandlerTimeout(Exception):
    pass


class RolloutRunner:
    """Runs rollouts of one registered entrypoint; see :class:`~rollwire.agent.app.RolloutApp`.

    Subclasses that speak another framework's payload override :meth:`view_payload` (what the
    handler is called with), :meth:`read_result` (how its result becomes a reward) and
    :meth:`rollout_answer` (what the invocation answers).
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
    ) -> None:
        if not math.isfinite(failure_reward):
            raise ValueError(f"failure_reward must be finite, got {failure_reward}")
        self.failure_reward = float(failure_reward)
        self.max_threads = max_threads
        self.report_grace = report_grace
        self._handler: Handler | None = None
        self._takes_context = False
        # One app may serve several event loops at once (a shared LocalRunner used from threads,
        # each with its own loop): this lock guards the state they share.
        self._lock = threading.Lock()
        self._running: dict[str, asyncio.Task[None]] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._final_posts: set[asyncio.Task[bool]] = set()
        self._threads = HandlerThreads(max_threads)
        self._worker: WorkerLoop | None = None
        self._reporter = Reporter(
            post_retries=post_retries, post_timeout=post_timeout, shutdown_timeout=shutdown_timeout
        )
        self._last_update = int(time.time())

    # -- settings kept on the reporter ------------------------------------------------------------

    @property
    def post_retries(self) -> int:
        """Retries of a terminal record's post, at least (see :class:`Reporter`)."""
        return self._reporter.post_retries

    @property
    def post_timeout(self) -> float:
        """Seconds one post of a terminal record may take."""
        return self._reporter.post_timeout

    @property
    def shutdown_timeout(self) -> float:
        """Seconds all records posted at shutdown share."""
        return self._reporter.shutdown_timeout

    @property
    def completed(self) -> int:
        """Terminal records the gateway accepted from this app."""
        return self._reporter.completed

    @property
    def _http(self) -> dict[asyncio.AbstractEventLoop, aiohttp.ClientSession]:
        return self._reporter.http

    # -- registration -----------------------------------------------------------------------------

    def rollout_entrypoint(self, fn: Handler) -> Handler:
        """Register ``fn(payload[, context])`` as the app's entrypoint: sync or async, a plain
        function or a generator (``yield`` events; in a rollout the last reward it yields counts)."""
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

    # -- extension points for other frameworks' payloads ------------------------------------------

    def view_payload(self, payload: Mapping[str, Any], ctx: InvocationContext) -> Any:
        """The payload the handler is called with in a rollout (here: the payload itself)."""
        return payload

    def view_context(self, payload: Mapping[str, Any], ctx: InvocationContext) -> Any:
        """The ``context`` the handler is called with in a rollout (here: ``ctx`` itself)."""
        return ctx

    def read_result(self, result: Any) -> tuple[float, dict[str, float]]:
        """``(reward, metrics)`` from the handler's result; raises when there is no reward."""
        return outcome_from_result(result)

    def rollout_answer(self, payload: Mapping[str, Any], ctx: InvocationContext) -> Any:
        """What an invocation that starts (or repeats) a rollout answers."""
        assert ctx.rollout is not None
        return {"status": "accepted", "session_id": ctx.rollout.session_id}

    # -- state ------------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """True while any rollout runs (``/ping`` says ``HealthyBusy``)."""
        return bool(self._running)

    @property
    def running(self) -> int:
        """How many rollouts run now."""
        return len(self._running)

    def _touch(self) -> None:
        self._last_update = int(time.time())

    # -- running rollouts -------------------------------------------------------------------------

    async def _call_handler(
        self, payload: Any, ctx: Any, *, rollout: bool = False, offload: bool = False
    ) -> Any:
        """Call the entrypoint; with ``offload`` (served over HTTP) an ``async def`` handler runs
        on the worker loop, so a handler that blocks its loop does not delay ``/ping``."""
        args: tuple[Any, ...] = (payload, ctx) if self._takes_context else (payload,)
        worker = self._worker if offload else None
        return await call_handler(self.handler, args, self._threads, rollout=rollout, worker=worker)

    async def start_rollout(
        self,
        payload: Mapping[str, Any],
        session_id: str | None = None,
        headers: Mapping[str, str] | None = None,
        request: Any = None,
    ) -> Any:
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
        ctx = InvocationContext(
            session_id=session_id or sid, headers=dict(headers or {}), rollout=rc, request=request
        )
        with self._lock:
            if sid in self._running or sid in self._finished:
                return self.rollout_answer(payload, ctx)
            offload = request is not None  # served over HTTP: async handlers off the server loop
            run = self._run_rollout(payload, ctx, rc, offload)
            task = loop.create_task(run, name=f"rollout-{sid}")
            self._running[sid] = task
        self._touch()
        task.add_done_callback(functools.partial(self._forget, sid))
        return self.rollout_answer(payload, ctx)

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

    async def _run_rollout(
        self,
        payload: Mapping[str, Any],
        ctx: InvocationContext,
        rc: RolloutContext,
        offload: bool = False,
    ) -> None:
        state = ReportState()
        outcome: RolloutOutcome | None = None
        try:
            outcome = await self._outcome(payload, ctx, rc, offload)
            loop = asyncio.get_running_loop()
            remaining = rc.remaining()
            give_up_at = None if remaining is None else loop.time() + remaining + self.report_grace
            await self._reporter.report(rc, outcome, state, give_up_at=give_up_at)
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
                report = self._reporter.final_report(rc, final, state)
                post = asyncio.get_running_loop().create_task(report)
                with self._lock:
                    self._final_posts.add(post)
                post.add_done_callback(self._discard_post)
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(post)  # cancelled again: the post goes on regardless
            raise

    async def _outcome(
        self,
        payload: Mapping[str, Any],
        ctx: InvocationContext,
        rc: RolloutContext,
        offload: bool = False,
    ) -> RolloutOutcome:
        """Run the handler under the deadline and turn whatever happens into a terminal record."""
        try:
            remaining = rc.remaining()
            if remaining is not None and remaining <= 0:
                raise asyncio.TimeoutError
            view, hctx = self.view_payload(payload, ctx), self.view_context(payload, ctx)
            result = await asyncio.wait_for(self._guarded(view, hctx, offload), timeout=remaining)
            reward, metrics = self.read_result(result)
            return RolloutOutcome("completed", reward, metrics)
        except asyncio.TimeoutError:
            return RolloutOutcome(
                "failed",
                self.failure_reward,
                error=f"deadline exceeded: the rollout ran past its deadline ({rc.deadline})",
            )
        except _HandlerTimeout as exc:  # the handler's own timeout, not the deadline
            return self._failed(rc, exc.__cause__ or exc)
        except InvalidReward as exc:
            return RolloutOutcome("failed", self.failure_reward, error=f"invalid reward: {exc}")
        except HandlerAborted as exc:
            return self._failed(rc, exc.original)
        except Exception as exc:
            return self._failed(rc, exc)
        except (asyncio.CancelledError, GeneratorExit):
            raise  # a cancelled (or closed) rollout: _run_rollout posts its record
        except BaseException as exc:  # SystemExit, KeyboardInterrupt, a custom BaseException
            return self._failed(rc, exc)

    async def _guarded(self, payload: Any, ctx: Any, offload: bool = False) -> Any:
        # a TimeoutError of the handler itself must not read as the deadline's (wait_for's)
        try:
            return await self._call_handler(payload, ctx, rollout=True, offload=offload)
        except (asyncio.TimeoutError, TimeoutError) as exc:
            raise _HandlerTimeout(str(exc)) from exc
        except (Exception, asyncio.CancelledError, GeneratorExit):
            raise
        except BaseException as exc:
            # wait_for may run this in a task of its own (Python < 3.12), and a task re-raises
            # SystemExit/KeyboardInterrupt into the event loop: carry it as an Exception instead
            raise HandlerAborted(exc) from exc

    def _failed(self, rc: RolloutContext, exc: BaseException) -> RolloutOutcome:
        log.warning("rollout %s failed: %s: %s", rc.session_id, type(exc).__name__, exc)
        return RolloutOutcome("failed", self.failure_reward, error=f"{type(exc).__name__}: {exc}")

    # -- waiting and stopping ---------------------------------------------------------------------

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
                await wait_tasks(tasks, None)

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
        return not await wait_tasks(wanted, timeout)

    async def close_http(self) -> None:
        """Close this event loop's HTTP pool (a later report opens a new one)."""
        await self._reporter.close_loop_pool()

    async def close_idle_http(self) -> bool:
        """Close this event loop's HTTP pool unless a rollout or record post of this loop may
        still use it (a later report opens a new one). True when no pool of this loop is left."""
        loop = asyncio.get_running_loop()
        with self._lock:
            in_use = any(
                t.get_loop() is loop and not t.done()
                for t in (*self._running.values(), *self._final_posts)
            )
        await self._reporter.close_loop_pool(in_use)
        return not in_use

    async def shutdown(self) -> None:
        """Cancel running rollouts (on every event loop) and post their records, all within
        ``shutdown_timeout`` seconds together; close HTTP clients. Sync handler threads are not
        waited for (they cannot be stopped, and being daemon threads they do not hold up the
        process's exit)."""
        loop = asyncio.get_running_loop()
        self._reporter.stop_at = loop.time() + self.shutdown_timeout
        try:
            tasks = self._live_tasks()
            for task in tasks:
                cancel_task(task)
            with self._lock:
                posts = list(self._final_posts)
            pending: list[asyncio.Future[Any]] = [*tasks, *posts]
            if pending:
                # every post gives up at stop_at by itself; the margin covers the last attempt
                late = await wait_tasks(pending, self.shutdown_timeout + 1.0)
                for fut in late:
                    cancel_task(fut)
                if late:
                    log.error(
                        "shutdown: %d rollout(s) did not post their record within %.0fs",
                        len(late),
                        self.shutdown_timeout,
                    )
            await self._reporter.close_all()
        finally:
            self._reporter.stop_at = None
