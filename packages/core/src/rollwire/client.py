"""The trainer side: fan tasks out as groups of N rollouts and collect them from the gateway.

For every task, :class:`RolloutClient` creates N sessions sharing a ``group_id``, builds each
payload (the task plus ``_rollwire``, DESIGN §7), hands it to a runner, waits on the gateway until
the rollout is terminal and fetches it. Failed rollouts are kept, with their status and the failure
reward, never dropped; a whole group is dropped only with ``drop_failed_groups=True``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp

from rollwire.context import PAYLOAD_KEY
from rollwire.gateway_client import SessionHandle, SessionInfo
from rollwire.protocol import TERMINAL_STATUSES, CaptureMode, Group, Rollout
from rollwire.runners.base import RateLimiter, Runner, RunnerError

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

__all__ = ["RolloutClient", "RunStats", "task_id_of"]

log = logging.getLogger(__name__)


def task_id_of(task: Mapping[str, Any], index: int) -> str:
    """A task's id: ``task["task_id"]``, else ``task["id"]``, else its index in the dataset."""
    for key in ("task_id", "id"):
        value = task.get(key)
        if value is not None and value != "":
            return str(value)
    return str(index)


@dataclass
class RunStats:
    """Counters of the last run (``RolloutClient.stats``)."""

    rollouts: int = 0
    completed: int = 0
    failed: int = 0
    groups: int = 0
    dropped_groups: int = 0
    infra_retries: int = 0
    undeliverable: int = 0
    client_timeouts: int = 0
    calls: int = 0
    wall_s: float = 0.0
    statuses: dict[str, int] = field(default_factory=dict)


class RolloutClient:
    """Runs tasks as GRPO groups of ``group_size`` rollouts through a gateway and a runner.

    ``gateway``: a URL (with ``admin_key``), ``"embedded"`` (an in-process gateway over
    ``backends``), or a running gateway object with ``url`` and ``admin_key``. ``runner``: a
    :class:`~rollwire.runners.Runner` or a spec for :func:`~rollwire.runners.make_runner` (``local``
    needs ``app``; ``ray`` needs ``app_path``). ``deadline`` is seconds per rollout; the agent
    enforces it and the client gives up ``deadline_grace`` seconds later. Only invocations the
    runner could not deliver are retried (``infra_retries`` times) — never a failed rollout.
    """

    def __init__(
        self,
        gateway: Any = "embedded",
        *,
        runner: Runner | str = "local",
        app: Any = None,
        app_path: str | None = None,
        admin_key: str | None = None,
        backends: Sequence[Any] = (),
        group_size: int = 4,
        sampling: Mapping[str, Any] | None = None,
        capture: CaptureMode = "passthrough",
        model: str = "policy",
        concurrency: int = 64,
        rate_limit: float | None = None,
        deadline: float = 600.0,
        deadline_grace: float = 15.0,
        infra_retries: int = 2,
        retry_backoff: float = 0.5,
        failure_reward: float = 0.0,
        drop_failed_groups: bool = False,
        progress: bool = False,
        session_options: Mapping[str, Any] | None = None,
        gateway_options: Mapping[str, Any] | None = None,
    ) -> None:
        if group_size < 1:
            raise ValueError(f"group_size must be at least 1, got {group_size}")
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        if deadline <= 0:
            raise ValueError(f"deadline must be positive seconds, got {deadline}")
        self.group_size = group_size
        self.sampling = dict(sampling or {})
        self.capture: CaptureMode = capture
        self.model = model
        self.concurrency = concurrency
        self.rate_limit = rate_limit
        self.deadline = deadline
        self.deadline_grace = deadline_grace
        self.infra_retries = infra_retries
        self.retry_backoff = retry_backoff
        self.failure_reward = failure_reward
        self.drop_failed_groups = drop_failed_groups
        self.progress = progress
        self.session_options = dict(session_options or {})
        self.stats = RunStats()
        self._runner_spec = runner
        self._app = app
        self._app_path = app_path
        self._embedded: Any = None
        if isinstance(gateway, str) and gateway == "embedded":
            from rollwire.gateway import serve_in_thread

            self._embedded = serve_in_thread(backends=list(backends), **dict(gateway_options or {}))
            self.gateway_url, self.admin_key = self._embedded.url, self._embedded.admin_key
        elif isinstance(gateway, str):
            if not admin_key:
                raise ValueError(
                    f"the gateway at {gateway} needs its admin key: pass admin_key=..."
                )
            self.gateway_url, self.admin_key = gateway.rstrip("/"), admin_key
        elif hasattr(gateway, "url") and hasattr(gateway, "admin_key"):
            self.gateway_url, self.admin_key = str(gateway.url).rstrip("/"), str(gateway.admin_key)
        else:
            raise TypeError(
                f"gateway must be a URL, 'embedded' or a running gateway, got {type(gateway).__name__}"
            )

    # -- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the embedded gateway, if this client started one."""
        if self._embedded is not None:
            self._embedded.stop()
            self._embedded = None

    def __enter__(self) -> RolloutClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> RolloutClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    # -- public API -----------------------------------------------------------------------------

    def run(self, tasks: Iterable[Mapping[str, Any]]) -> list[Group]:
        """Run every task as a group; returns the groups in task order (blocking)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.arun(tasks))
        raise RuntimeError(
            "RolloutClient.run() was called inside a running event loop; use `await client.arun(tasks)`"
        )

    async def arun(self, tasks: Iterable[Mapping[str, Any]]) -> list[Group]:
        """Async :meth:`run`: the groups in task order."""
        task_list = list(tasks)
        done: dict[str, Group] = {}
        order: list[str] = []
        async for group in self._stream(task_list, order):
            done[group.group_id] = group
        return [done[gid] for gid in order if gid in done]

    async def stream(self, tasks: Iterable[Mapping[str, Any]]) -> AsyncIterator[Group]:
        """Yield each group as soon as all of its rollouts are terminal (completion order)."""
        async for group in self._stream(list(tasks), []):
            yield group

    # -- internals ------------------------------------------------------------------------------

    def _make_runner(self) -> tuple[Runner, bool]:
        if not isinstance(self._runner_spec, str):
            return self._runner_spec, False
        from rollwire.runners import make_runner

        return make_runner(self._runner_spec, app=self._app, app_path=self._app_path), True

    async def _stream(
        self, tasks: list[Mapping[str, Any]], order: list[str]
    ) -> AsyncIterator[Group]:
        self.stats = RunStats()
        started = time.monotonic()
        runner, owned = self._make_runner()
        gw = _ControlPlane(self.gateway_url, self.admin_key, self.concurrency)
        sem = asyncio.Semaphore(self.concurrency)
        limiter = RateLimiter(self.rate_limit)
        progress, bar = self._progress(len(tasks) * self.group_size)
        tick: Callable[[Rollout], None] = lambda r: self._tick(progress, bar, r)  # noqa: E731
        jobs: list[asyncio.Task[Group]] = []
        try:
            for i, task in enumerate(tasks):
                if not isinstance(task, Mapping):
                    raise TypeError(f"task #{i} must be a dict, got {type(task).__name__}")
                tid = task_id_of(task, i)
                gid = f"{tid}-{uuid.uuid4().hex[:10]}"
                order.append(gid)
                jobs.append(
                    asyncio.create_task(
                        self._group(gw, runner, sem, limiter, dict(task), tid, gid, tick)
                    )
                )
            for fut in asyncio.as_completed(jobs):
                group = await fut
                self.stats.groups += 1
                if self.drop_failed_groups and any(r.status != "completed" for r in group.rollouts):
                    self.stats.dropped_groups += 1
                    continue
                yield group
        finally:
            for job in jobs:
                job.cancel()
            if jobs:
                await asyncio.gather(*jobs, return_exceptions=True)
            if progress is not None:
                progress.stop()
            if owned:
                await runner.aclose()
            elif (drain := getattr(runner, "drain", None)) is not None:
                await drain()
            await gw.aclose()
            self.stats.wall_s = time.monotonic() - started

    def _progress(self, total: int) -> tuple[Progress | None, TaskID | None]:
        if not self.progress:
            return None, None
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        progress = Progress(
            TextColumn("rollouts"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
        )
        bar = progress.add_task("", total=total)
        progress.start()
        return progress, bar

    def _tick(self, progress: Progress | None, bar: TaskID | None, rollout: Rollout) -> None:
        s = self.stats
        s.rollouts += 1
        s.calls += len(rollout.calls)
        s.statuses[rollout.status] = s.statuses.get(rollout.status, 0) + 1
        if rollout.status == "completed":
            s.completed += 1
        else:
            s.failed += 1
        if progress is not None and bar is not None:
            progress.update(bar, advance=1, description=f"failed {s.failed}")

    async def _group(
        self,
        gw: _ControlPlane,
        runner: Runner,
        sem: asyncio.Semaphore,
        limiter: RateLimiter,
        task: dict[str, Any],
        task_id: str,
        group_id: str,
        tick: Callable[[Rollout], None],
    ) -> Group:
        rollouts = await asyncio.gather(
            *(
                self._rollout(gw, runner, sem, limiter, task, task_id, group_id, k, tick)
                for k in range(self.group_size)
            )
        )
        return Group(group_id=group_id, task_id=task_id, task=task, rollouts=list(rollouts))

    async def _rollout(
        self,
        gw: _ControlPlane,
        runner: Runner,
        sem: asyncio.Semaphore,
        limiter: RateLimiter,
        task: dict[str, Any],
        task_id: str,
        group_id: str,
        index: int,
        tick: Callable[[Rollout], None],
    ) -> Rollout:
        async with sem:
            await limiter.acquire()
            handle = await self._retry(
                "create a session",
                lambda: gw.create_session(
                    group_id=group_id,
                    task_id=task_id,
                    metadata={"rollout_index": index},
                    sampling=self.sampling,
                    capture=self.capture,
                    ttl=int(self.deadline + self.deadline_grace + 300),
                    **self.session_options,
                ),
            )
            sid = handle.session_id
            deadline_at = time.time() + self.deadline
            payload = {k: v for k, v in task.items() if k != PAYLOAD_KEY}
            payload[PAYLOAD_KEY] = {
                "version": 1,
                "session_id": sid,
                "base_url": handle.base_url,
                "api_key": handle.token,
                "model": self.model,
                "sampling": self.sampling,
                "complete_url": handle.complete_url,
                "deadline": deadline_at,
                "group_id": group_id,
                "task_id": task_id,
            }
            problem = await self._deliver(runner, payload, sid)
            if problem is not None:
                self.stats.undeliverable += 1
                await self._complete(
                    gw, sid, "failed", f"the runner could not reach the agent: {problem}"
                )
            else:
                await self._wait(gw, sid, deadline_at)
            release = getattr(runner, "release", None)
            if release is not None:
                await release(sid)
            rollout: Rollout = await self._retry("fetch the rollout", lambda: gw.rollout(sid))
            if rollout.task is None:
                rollout.task = task
            if rollout.group_id is None:
                rollout.group_id = group_id
            if rollout.task_id is None:
                rollout.task_id = task_id
            tick(rollout)
            return rollout

    async def _deliver(self, runner: Runner, payload: dict[str, Any], sid: str) -> str | None:
        """Invoke with retries of infrastructure errors; the last error text, or None on success."""
        delay = self.retry_backoff
        for attempt in range(self.infra_retries + 1):
            try:
                await runner.invoke(payload, sid)
                return None
            except RunnerError as exc:
                if not exc.retryable or attempt == self.infra_retries:
                    return str(exc)
                log.info("rollout %s: invocation failed (%s); retrying in %.1fs", sid, exc, delay)
            self.stats.infra_retries += 1
            await asyncio.sleep(delay)
            delay *= 2
        return "unreachable"

    async def _wait(self, gw: _ControlPlane, sid: str, deadline_at: float) -> None:
        give_up = deadline_at + self.deadline_grace
        while True:
            left = give_up - time.time()
            if left <= 0:
                self.stats.client_timeouts += 1
                await self._complete(
                    gw,
                    sid,
                    "timeout",
                    f"no terminal record {self.deadline_grace:.0f}s after the deadline: the agent did not report",
                )
                return
            wait = functools.partial(gw.wait, sid, timeout=max(0.1, min(left, 60.0)))
            info = await self._retry("wait for the rollout", wait)
            if info.status in TERMINAL_STATUSES:
                return

    async def _complete(self, gw: _ControlPlane, sid: str, status: str, error: str) -> None:
        try:
            await gw.complete(sid, reward=self.failure_reward, status=status, error=error)
        except Exception as exc:  # 409: the agent's record arrived first, which is fine
            log.info("rollout %s: could not record %s (%s)", sid, status, exc)

    async def _retry(self, what: str, fn: Callable[[], Any]) -> Any:
        """Gateway control-plane calls: retried on transport errors with backoff."""
        delay = self.retry_backoff
        for attempt in range(self.infra_retries + 2):
            try:
                return await fn()
            except Exception as exc:
                if not _transient(exc) or attempt == self.infra_retries + 1:
                    raise RuntimeError(
                        f"could not {what} on the gateway {self.gateway_url}: {exc}"
                    ) from exc
                self.stats.infra_retries += 1
                await asyncio.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")


class _ControlPlane:
    """The four control-plane routes a run needs, over one aiohttp pool sized for ``concurrency``
    long-polls (httpx's pool scans every queued request per assignment, quadratic at 1,000
    rollouts in flight). Answers are the models of :mod:`rollwire.gateway_client`."""

    def __init__(self, url: str, admin_key: str, concurrency: int) -> None:
        self.url = url
        self._headers = {"authorization": f"Bearer {admin_key}"}
        self._limit = 2 * concurrency + 16
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                connector=aiohttp.TCPConnector(limit=self._limit),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
            )
        return self._session

    async def _req(self, method: str, path: str, timeout: float = 60.0, **kw: Any) -> bytes:
        async with self._http().request(
            method, self.url + path, timeout=aiohttp.ClientTimeout(total=timeout), **kw
        ) as resp:
            body = await resp.read()
            if resp.status >= 400:
                raise _GatewayError(resp.status, body.decode("utf-8", "replace")[:500])
            return body

    async def create_session(self, **fields: Any) -> SessionHandle:
        body = {k: v for k, v in fields.items() if v is not None}
        return SessionHandle.model_validate_json(
            await self._req("POST", "/api/sessions", json=body)
        )

    async def wait(self, session_id: str, timeout: float = 30.0) -> SessionInfo:
        raw = await self._req(
            "GET",
            f"/api/sessions/{session_id}/wait",
            timeout=timeout + 30.0,
            params={"timeout": str(timeout)},
        )
        return SessionInfo.model_validate_json(raw)

    async def rollout(self, session_id: str) -> Rollout:
        return Rollout.from_json(await self._req("GET", f"/api/sessions/{session_id}/rollout"))

    async def complete(self, session_id: str, **fields: Any) -> None:
        body = {k: v for k, v in fields.items() if v is not None}
        await self._req("POST", f"/api/sessions/{session_id}/complete", json=body)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class _GatewayError(RuntimeError):
    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(f"HTTP {status_code}: {message}")
        self.status_code = status_code


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, (aiohttp.ClientConnectionError, ConnectionError, asyncio.TimeoutError)):
        return True
    status = getattr(exc, "status_code", None)
    if status is None:
        response = getattr(exc, "response", None)
        status = getattr(response, "status_code", None)
    return isinstance(status, int) and (status >= 500 or status == 429)
