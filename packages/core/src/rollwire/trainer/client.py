"""The trainer side: fan tasks out as groups of N rollouts and collect them from the gateway.

For every task, :class:`RolloutClient` creates N sessions sharing a ``group_id``, builds each
payload (the task plus ``_rollwire``, DESIGN §7), hands it to a runner, waits on the gateway until
the rollout is terminal and fetches it. Failed rollouts are kept, with their status and the failure
reward, never dropped; a whole group is dropped only with ``drop_failed_groups=True``. One rollout's
error (a runner bug, a control-plane call that keeps failing) fails that rollout only; the run is
aborted only when the gateway stays unreachable for ``gateway_timeout`` seconds.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rollwire.data.foreign import PAYLOAD_FORMATS
from rollwire.data.protocol import CaptureMode, Group, Rollout
from rollwire.trainer.batch import BatchItem, arun_batch, run_batch
from rollwire.trainer.control_plane import ControlPlane, GatewayUnavailable
from rollwire.trainer.rollout_driver import RolloutDriver
from rollwire.trainer.runners.base import RateLimiter, Runner

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from rollwire.evaluation import EvalResult, EvalSetting

__all__ = ["GatewayUnavailable", "RolloutClient", "RunStats", "task_id_of"]

log = logging.getLogger(__name__)


def _settings(settings: Sequence[EvalSetting | Mapping[str, Any]]) -> list[EvalSetting]:
    from rollwire.evaluation import EvalSetting

    return [s if isinstance(s, EvalSetting) else EvalSetting.from_sampling(s) for s in settings]


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
    gateway_retries: int = 0
    undeliverable: int = 0
    client_errors: int = 0
    client_timeouts: int = 0
    calls: int = 0
    wall_s: float = 0.0
    statuses: dict[str, int] = field(default_factory=dict)


class RolloutClient(RolloutDriver):
    """Runs tasks as GRPO groups of ``group_size`` rollouts through a gateway and a runner.

    ``gateway``: a URL (with ``admin_key``), ``"embedded"`` (an in-process gateway over
    ``backends``), or a running gateway object with ``url`` and ``admin_key``. ``runner``: a
    :class:`~rollwire.trainer.runners.Runner` or a spec for :func:`~rollwire.trainer.runners.make_runner` (``local``
    needs ``app``; ``ray`` needs ``app_path``). ``deadline`` is seconds per rollout; the agent
    enforces it and the client gives up ``deadline_grace`` seconds later. Only invocations the
    runner could not deliver are retried (``infra_retries`` times) — never a failed rollout.
    Control-plane calls are retried while the gateway is unreachable, for up to
    ``gateway_timeout`` seconds; after that the run is aborted with :class:`GatewayUnavailable`.
    A runner built from a spec is kept across runs; :meth:`close`/:meth:`aclose` release it.
    ``payload_format`` adds the keys unmodified agents of another toolkit read
    (``"agentcore-rl-toolkit"``: gen-1's ``_rollout``; ``"agentcore-runtime"``: gen-2's
    ``_config`` and start envelope); ``_rollwire`` is always there. ``max_staleness`` bounds
    how many policy versions behind the trainer (``GatewayClient.set_trainer_version``) a
    rollout is sampled: ``on_stale="hold"`` holds one not yet started, ``"mark"`` runs it; calls
    beyond the bound are flagged ``stale`` and not trained (docs/control-api.md).
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
        gateway_timeout: float = 60.0,
        failure_reward: float = 0.0,
        drop_failed_groups: bool = False,
        progress: bool = False,
        session_options: Mapping[str, Any] | None = None,
        gateway_options: Mapping[str, Any] | None = None,
        payload_format: str = "rollwire",
        max_staleness: int | None = None,
        on_stale: str = "hold",
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
        self.gateway_timeout = gateway_timeout
        self.failure_reward = failure_reward
        self.drop_failed_groups = drop_failed_groups
        self.progress = progress
        self.session_options = dict(session_options or {})
        if max_staleness is not None:
            if type(max_staleness) is not int or max_staleness < 0:
                raise ValueError(
                    f"max_staleness must be a whole number of policy versions, got {max_staleness!r}"
                )
            if on_stale not in ("hold", "mark"):
                raise ValueError(f"on_stale must be 'hold' or 'mark', got {on_stale!r}")
            self.session_options.update(max_staleness=max_staleness, on_stale=on_stale)
        if payload_format not in PAYLOAD_FORMATS:
            raise ValueError(
                f"payload_format must be one of {list(PAYLOAD_FORMATS)}, got {payload_format!r}"
            )
        self.payload_format = payload_format
        self.stats = RunStats()
        self._progress_started = time.monotonic()
        self._runner_spec = runner
        self._runner: Runner | None = None  # built from a spec, kept across runs
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
        """Close the runner this client built and stop the embedded gateway it started."""
        if self._runner is not None:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                asyncio.run(self._close_runner())
            else:
                log.warning(
                    "RolloutClient.close() inside an event loop: use `await client.aclose()`"
                )
        self._stop_embedded()

    async def aclose(self) -> None:
        """Async :meth:`close`."""
        await self._close_runner()
        self._stop_embedded()

    async def _close_runner(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.aclose()

    def _stop_embedded(self) -> None:
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
        await self.aclose()

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
        try:
            async for group in self._stream(task_list, order):
                done[group.group_id] = group
        except GatewayUnavailable as exc:
            exc.groups = [done[gid] for gid in order if gid in done]
            raise
        return [done[gid] for gid in order if gid in done]

    async def stream(self, tasks: Iterable[Mapping[str, Any]]) -> AsyncIterator[Group]:
        """Yield each group as soon as all of its rollouts are terminal (completion order)."""
        async for group in self._stream(list(tasks), []):
            yield group

    def evaluate(
        self,
        tasks: Iterable[Mapping[str, Any]],
        settings: Sequence[EvalSetting | Mapping[str, Any]],
        *,
        k: int = 8,
        ks: Sequence[int] | None = None,
        success_threshold: float = 1.0,
        confidence: float = 0.95,
    ) -> EvalResult:
        """Run every task ``k`` times at each sampling setting (an :class:`EvalSetting` or a
        sampling dict) and score them: mean reward, success rate, pass@k (see
        :mod:`rollwire.evaluation`). Evaluation rollouts are marked non-trainable."""
        from rollwire.evaluation import run_eval

        return run_eval(
            self,
            list(tasks),
            _settings(settings),
            k=k,
            ks=ks,
            success_threshold=success_threshold,
            failure_reward=self.failure_reward,
            confidence=confidence,
        )

    async def aevaluate(
        self,
        tasks: Iterable[Mapping[str, Any]],
        settings: Sequence[EvalSetting | Mapping[str, Any]],
        *,
        k: int = 8,
        ks: Sequence[int] | None = None,
        success_threshold: float = 1.0,
        confidence: float = 0.95,
    ) -> EvalResult:
        """Async :meth:`evaluate`."""
        from rollwire.evaluation import arun_eval

        return await arun_eval(
            self,
            list(tasks),
            _settings(settings),
            k=k,
            ks=ks,
            success_threshold=success_threshold,
            failure_reward=self.failure_reward,
            confidence=confidence,
        )

    def run_batch(
        self,
        payloads: Sequence[Mapping[str, Any]],
        max_concurrent_sessions: int,
        timeout: float = 900.0,
    ) -> Iterator[BatchItem]:
        """agentcore-rl-toolkit's ``run_batch``: one rollout per payload, at most
        ``max_concurrent_sessions`` at once, ``timeout`` seconds each; yields
        :class:`~rollwire.trainer.batch.BatchItem` in completion order."""
        return run_batch(self, payloads, max_concurrent_sessions, timeout)

    def arun_batch(
        self,
        payloads: Sequence[Mapping[str, Any]],
        max_concurrent_sessions: int,
        timeout: float = 900.0,
    ) -> AsyncIterator[BatchItem]:
        """Async :meth:`run_batch` (the toolkit's ``run_batch_async``)."""
        return arun_batch(self, payloads, max_concurrent_sessions, timeout)

    run_batch_async = arun_batch

    # -- internals ------------------------------------------------------------------------------

    def _get_runner(self) -> tuple[Runner, bool]:
        if not isinstance(self._runner_spec, str):
            return self._runner_spec, False
        if self._runner is None:
            from rollwire.trainer.runners import make_runner

            self._runner = make_runner(self._runner_spec, app=self._app, app_path=self._app_path)
        return self._runner, True

    async def _stream(
        self, tasks: list[Mapping[str, Any]], order: list[str]
    ) -> AsyncIterator[Group]:
        self.stats = RunStats()
        started = time.monotonic()
        runner, owned = self._get_runner()
        gw = ControlPlane(self.gateway_url, self.admin_key, self.concurrency)
        sem = asyncio.Semaphore(self.concurrency)
        limiter = RateLimiter(self.rate_limit)
        progress, bar = self._progress(len(tasks) * self.group_size)
        tick: Callable[[Rollout], None] = lambda r: self._tick(progress, bar, r)  # noqa: E731
        jobs: list[asyncio.Task[Group]] = []
        sids: list[str] = []  # this run's sessions, for the runner's drain
        clean = False
        try:
            for i, task in enumerate(tasks):
                if not isinstance(task, Mapping):
                    raise TypeError(f"task #{i} must be a dict, got {type(task).__name__}")
                tid = task_id_of(task, i)
                gid = f"{tid}-{uuid.uuid4().hex[:10]}"
                order.append(gid)
                jobs.append(
                    asyncio.create_task(
                        self._group(gw, runner, sem, limiter, dict(task), tid, gid, tick, sids)
                    )
                )
            for fut in asyncio.as_completed(jobs):
                group = await fut
                self.stats.groups += 1
                if self.drop_failed_groups and any(r.status != "completed" for r in group.rollouts):
                    self.stats.dropped_groups += 1
                    continue
                yield group
            clean = True
        except GatewayUnavailable as exc:
            log.error("%s", exc)
            raise
        finally:
            for job in jobs:
                job.cancel()
            if jobs:
                await asyncio.gather(*jobs, return_exceptions=True)
            if progress is not None:
                progress.stop()
            if owned and not clean:  # rollouts may still run: cancel them (terminal records too)
                await self._close_runner()
            else:
                await self._drain(runner, sids)
            await gw.aclose()
            self.stats.wall_s = time.monotonic() - started

    def _progress(self, total: int) -> tuple[Progress | None, TaskID | None]:
        if not self.progress:
            return None, None
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        console = Console(stderr=True)
        if not console.is_terminal:
            return None, None  # a log file or a pipe gets the summary, not a redrawn bar
        progress = Progress(
            TextColumn("rollouts"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console,
        )
        bar = progress.add_task("", total=total)
        progress.start()
        self._progress_started = time.monotonic()
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
            elapsed = max(time.monotonic() - self._progress_started, 1e-9)
            progress.update(
                bar,
                advance=1,
                description=f"completed {s.completed}, failed {s.failed}, "
                f"{s.calls / elapsed:.1f} calls/s",
            )

    async def _group(
        self,
        gw: ControlPlane,
        runner: Runner,
        sem: asyncio.Semaphore,
        limiter: RateLimiter,
        task: dict[str, Any],
        task_id: str,
        group_id: str,
        tick: Callable[[Rollout], None],
        sids: list[str],
    ) -> Group:
        rollouts = await asyncio.gather(
            *(
                self._rollout(gw, runner, sem, limiter, task, task_id, group_id, k, tick, sids)
                for k in range(self.group_size)
            )
        )
        return Group(group_id=group_id, task_id=task_id, task=task, rollouts=list(rollouts))

    async def _drain(self, runner: Runner, sids: list[str]) -> None:
        """End the run on a runner the client does not own: ``runner.drain(session_ids)`` for this
        run's sessions only (the runner may be shared with other runs). Best effort: a failing
        drain is logged, and the run's groups are kept."""
        drain = getattr(runner, "drain", None)
        if drain is None:
            return
        try:
            if _takes_argument(drain):
                await drain(list(sids))
            else:  # a runner written against the older drain() protocol
                await drain()
        except Exception as exc:
            log.warning("runner.drain failed after the run: %s: %s", type(exc).__name__, exc)


def _takes_argument(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` accepts one positional argument."""
    try:
        inspect.signature(fn).bind(None)
    except TypeError:
        return False
    except ValueError:  # no signature to read: assume the current protocol
        return True
    return True
