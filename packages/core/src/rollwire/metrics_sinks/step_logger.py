"""Per-step logging for the trainer adapters' hooks: the sink is chosen by ``ROLLWIRE_METRICS``.

A hook that sees a whole rollout step (slime's ``generate_rollout``) calls
:meth:`StepLogger.log_groups` once per step. A hook that sees one rollout at a time (verl's agent
loop, rLLM's flow) calls :meth:`StepLogger.add` per rollout: the rollouts are aggregated and
logged as one step when the trainer step they carry changes, or every ``every`` rollouts when
they carry none, and the rest on :meth:`StepLogger.flush` / :meth:`StepLogger.close`.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rollwire.data.protocol import Group, Rollout, Row, group_rollouts
from rollwire.data.trajectory import TokenizerLike
from rollwire.metrics_sinks.sinks import MetricsSink, make_sink
from rollwire.metrics_sinks.stats import step_metrics

__all__ = [
    "METRICS_ENV",
    "METRICS_EVERY_ENV",
    "StepLogger",
    "metrics_every",
    "metrics_spec",
    "shared_step_logger",
]

#: ``tensorboard:DIR``, ``mlflow:URI_OR_DIR`` or ``wandb:DIR``: where the hooks log each step.
METRICS_ENV = "ROLLWIRE_METRICS"
#: rollouts per logged step for hooks that see one rollout at a time and no trainer step.
METRICS_EVERY_ENV = "ROLLWIRE_METRICS_EVERY"


def metrics_spec(value: str | None = None, environ: Mapping[str, str] | None = None) -> str | None:
    """The sink spec: ``value`` when set, else ``$ROLLWIRE_METRICS``; None (no logging) if empty."""
    env = os.environ if environ is None else environ
    spec = value if value is not None else env.get(METRICS_ENV)
    return spec.strip() or None if spec else None


def metrics_every(value: Any = None, environ: Mapping[str, str] | None = None) -> int:
    """Rollouts per step: ``value`` when set, else ``$ROLLWIRE_METRICS_EVERY``, else 64."""
    env = os.environ if environ is None else environ
    raw = value if value is not None else env.get(METRICS_EVERY_ENV) or 64
    try:
        every = int(raw)
    except (TypeError, ValueError):
        raise ValueError(f"{METRICS_EVERY_ENV} must be a positive integer, got {raw!r}") from None
    if every < 1:
        raise ValueError(f"{METRICS_EVERY_ENV} must be a positive integer, got {raw!r}")
    return every


def _wall_s(rollouts: Sequence[Rollout]) -> float | None:
    """Seconds from the first call's start to the last call's end (for calls/s)."""
    calls = [c for r in rollouts for c in r.calls]
    if not calls:
        return None
    start = min(c.started_at for c in calls)
    end = max(c.started_at + c.latency_ms / 1000.0 for c in calls)
    return end - start if end > start else None


def _versions(rollouts: Iterable[Rollout]) -> set[str]:
    return {c.policy_version for r in rollouts for c in r.calls if c.policy_version is not None}


class StepLogger:
    """Logs :func:`step_metrics` of each trainer step, plus the policy version, to ``sink``.

    ``prefix`` goes before every name (``rollwire/reward/mean``); ``every``: rollouts per step
    for :meth:`add` when rollouts carry no step. The policy version is logged as
    ``policy/version`` (the newest, when versions are numbers) and as the ``policy_version`` tag.
    Thread-safe: hooks run concurrently.
    """

    def __init__(
        self,
        sink: MetricsSink,
        *,
        every: int = 64,
        prefix: str = "rollwire/",
        tokenizer: TokenizerLike | None = None,
    ) -> None:
        if every < 1:
            raise ValueError(f"StepLogger every must be a positive integer, got {every}")
        self.sink = sink
        self.every = every
        self.prefix = prefix
        self.tokenizer = tokenizer
        self._lock = threading.Lock()
        self._next_step = 0
        self._pending: list[Rollout] = []
        self._pending_rows: dict[str, Sequence[Row]] = {}
        self._pending_step: int | None = None
        self._closed = False

    def log_groups(
        self,
        batch: Iterable[Group | Rollout],
        step: int | None = None,
        *,
        rows_by_rollout: Mapping[str, Sequence[Row]] | None = None,
        wall_s: float | None = None,
    ) -> dict[str, float]:
        """Log one step of ``batch`` (at ``step``, else the step after the last); the figures."""
        groups = group_rollouts(batch)
        rollouts = [r for g in groups for r in g.rollouts]
        rows = None
        if rows_by_rollout is not None and all(r.rollout_id in rows_by_rollout for r in rollouts):
            rows = rows_by_rollout
        metrics = step_metrics(
            groups,
            rows_by_rollout=rows,
            tokenizer=self.tokenizer,
            wall_s=wall_s if wall_s is not None else _wall_s(rollouts),
            prefix=self.prefix,
        )
        versions = _versions(rollouts)
        numeric = [float(v) for v in versions if v.lstrip("-").replace(".", "", 1).isdigit()]
        if numeric:
            metrics[f"{self.prefix}policy/version"] = max(numeric)
            metrics[f"{self.prefix}policy/version_min"] = min(numeric)
        with self._lock:
            at = self._next_step if step is None else int(step)
            self._next_step = at + 1
            self.sink.log(metrics, at)
            if versions:
                self.sink.set_tags({"policy_version": ",".join(sorted(versions))})
        return metrics

    def add(
        self, rollout: Rollout, step: int | None = None, rows: Sequence[Row] | None = None
    ) -> dict[str, float] | None:
        """Buffer one rollout of trainer step ``step``; the last figures when this logged a step.

        The buffer is logged when a rollout of another step arrives (as the buffered step), or,
        for rollouts without a step, when it holds ``every`` rollouts.
        """
        with self._lock:
            taken = []
            if self._pending and step != self._pending_step:
                taken.append(self._take())
            self._pending.append(rollout)
            if rows is not None:
                self._pending_rows[rollout.rollout_id] = rows
            self._pending_step = step
            if step is None and len(self._pending) >= self.every:
                taken.append(self._take())
        logged = None
        for t in taken:
            logged = self._log(t)
        return logged

    def flush(self) -> dict[str, float] | None:
        """Log what :meth:`add` buffered, if anything, as one step."""
        with self._lock:
            taken = self._take() if self._pending else None
        return self._log(taken)

    def close(self) -> None:
        """Flush, then close the sink (once)."""
        self.flush()
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.sink.close()

    def _take(self) -> tuple[list[Rollout], dict[str, Sequence[Row]], int | None]:
        taken = (self._pending, self._pending_rows, self._pending_step)
        self._pending, self._pending_rows, self._pending_step = [], {}, None
        return taken

    def _log(
        self, taken: tuple[list[Rollout], dict[str, Sequence[Row]], int | None] | None
    ) -> dict[str, float] | None:
        if taken is None:
            return None
        rollouts, rows, step = taken
        return self.log_groups(rollouts, step, rows_by_rollout=rows or None)


_SHARED: dict[tuple[str, int, str], StepLogger] = {}
_SHARED_LOCK = threading.Lock()


def shared_step_logger(
    spec: str,
    *,
    every: int = 64,
    prefix: str = "rollwire/",
    tokenizer: TokenizerLike | None = None,
) -> StepLogger:
    """The process's logger for ``spec`` (made on first use, flushed and closed at exit).

    Hooks are plain functions or objects a trainer makes per sample, so the sink is kept here.
    ``tokenizer`` (used when the logger is made) classifies forks of rollouts logged without rows.
    ``{pid}`` in ``spec`` becomes the process id: trainers that run hooks in several worker
    processes (verl's agent-loop workers) then give each its own run or directory.
    """
    spec = spec.replace("{pid}", str(os.getpid()))
    key = (spec, every, prefix)
    with _SHARED_LOCK:
        logger = _SHARED.get(key)
        if logger is None:
            logger = StepLogger(make_sink(spec), every=every, prefix=prefix, tokenizer=tokenizer)
            _SHARED[key] = logger
    return logger


def close_shared_loggers() -> None:
    """Flush and close every shared logger (registered to run at exit)."""
    with _SHARED_LOCK:
        loggers = list(_SHARED.values())
        _SHARED.clear()
    for logger in loggers:
        logger.close()


atexit.register(close_shared_loggers)
