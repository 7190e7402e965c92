"""How an entrypoint is called: sync handlers on daemon threads, async ones on a worker loop, and
a rollout's result read from whatever the handler returned (a value, or a generator's events).

Also the small cross-loop task helpers the app needs: one app may serve several event loops at
once (a shared ``LocalRunner`` used from threads), and a task may only be touched on its own loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import math
import threading
from collections.abc import Callable, Collection, Coroutine, Mapping
from typing import Any, TypeVar

__all__ = [
    "HandlerAborted",
    "HandlerThreads",
    "InvalidReward",
    "WorkerLoop",
    "call_handler",
    "cancel_task",
    "outcome_from_result",
    "wait_tasks",
]

T = TypeVar("T")
Handler = Callable[..., Any]


class InvalidReward(ValueError):
    """The handler's result holds no usable reward."""


class HandlerAborted(Exception):
    """A ``BaseException`` that is not an ``Exception`` (``SystemExit``, ``KeyboardInterrupt``, a
    custom one) raised by a handler, carried as an ``Exception``: it fails that rollout, and never
    reaches the event loop (asyncio re-raises ``SystemExit``/``KeyboardInterrupt`` from a task
    into the loop, which would stop the trainer)."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(f"{type(original).__name__}: {original}")
        self.original = original


def outcome_from_result(result: Any) -> tuple[float, dict[str, float]]:
    """Read ``float`` or ``{"reward": float, "metrics": {...}}``; raise on anything else."""
    metrics: dict[str, float] = {}
    reward: Any = result
    if isinstance(result, Mapping):
        if "reward" not in result:
            raise InvalidReward(
                f"handler returned a dict without 'reward' (keys: {sorted(result)})"
            )
        reward = result["reward"]
        raw_metrics = result.get("metrics") or {}
        if not isinstance(raw_metrics, Mapping):
            raise InvalidReward(
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
        raise InvalidReward(f"handler returned no usable reward: {reward!r}")
    try:
        value = float(reward)
    except (TypeError, ValueError) as exc:
        raise InvalidReward(
            f"reward must be a number, got {type(reward).__name__}: {reward!r}"
        ) from exc
    if not math.isfinite(value):
        raise InvalidReward(f"reward must be finite, got {value}")
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


class HandlerThreads:
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

    @property
    def saturated(self) -> bool:
        """True when every slot is taken: a new sync handler would have to wait."""
        return self._alive >= self.limit

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
                ok, value = False, HandlerAborted(exc)
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


class WorkerLoop:
    """One event loop on a daemon thread for ``async def`` handlers served over HTTP.

    As in ``BedrockAgentCoreApp``, a handler that blocks its loop (``time.sleep`` in an
    ``async def``) then delays other handlers, never ``/ping``: the server's loop stays free.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def _ensure(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                ready = threading.Event()
                loop = asyncio.new_event_loop()

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                threading.Thread(target=serve, name="rollwire-worker-loop", daemon=True).start()
                if not ready.wait(timeout=10):
                    raise RuntimeError("the handlers' worker event loop did not start within 10s")
                self._loop = loop
            return self._loop

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the worker loop with the caller's context variables; cancelling the
        caller cancels it there."""
        ctx = contextvars.copy_context()

        async def with_context() -> T:
            for var, value in ctx.items():
                var.set(value)
            return await coro

        future = asyncio.run_coroutine_threadsafe(with_context(), self._ensure())
        return await asyncio.wrap_future(future)

    def close(self) -> None:
        """Stop the worker loop (its thread ends; a later handler starts a new one)."""
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(loop.stop)


async def call_handler(
    fn: Handler,
    args: tuple[Any, ...],
    threads: HandlerThreads,
    *,
    rollout: bool = False,
    worker: WorkerLoop | None = None,
) -> Any:
    """Call an entrypoint: async functions on the loop (or on ``worker``), sync ones on a
    handler thread.

    In production a generator's events are returned unconsumed (they are streamed). In a
    rollout the generator is run to its end and the result is the last value it yielded that
    is a number or a dict with a reward (so an agent that streams progress still reports).
    """
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        if worker is not None and inspect.iscoroutinefunction(fn):
            return await worker.run(_settle_on_worker(fn, args, rollout))
        result = fn(*args)
    elif rollout:  # a sync generator is consumed on its thread too
        result = await threads.run(lambda: _last_reward_sync(fn(*args)))
    else:
        result = await threads.run(functools.partial(fn, *args))
    if inspect.isawaitable(result):  # an async function, or a sync one returning a coroutine
        result = await result
    if rollout and inspect.isasyncgen(result):
        result = await _last_reward_async(result)
    return result


async def _settle_on_worker(fn: Handler, args: tuple[Any, ...], rollout: bool) -> Any:
    result = await fn(*args)
    if rollout and inspect.isasyncgen(result):
        result = await _last_reward_async(result)
    return result


def cancel_task(task: asyncio.Future[Any]) -> None:
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


async def wait_tasks(
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
