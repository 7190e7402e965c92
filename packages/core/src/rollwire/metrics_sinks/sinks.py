"""Metrics sinks: MLflow, Weights & Biases, TensorBoard — each an optional extra.

A sink takes ``log(metrics, step)`` with flat ``{name: float}`` (see
:func:`~rollwire.metrics_sinks.stats.step_metrics`), ``set_tags({name: str})`` for values that
are not numbers (the policy version), and ``close()``. The library is imported when the sink is
made; a missing one raises :class:`MissingSinkExtra` naming the extra to install.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "MetricsSink",
    "MissingSinkExtra",
    "MlflowSink",
    "TensorBoardSink",
    "WandbSink",
    "make_sink",
]


class MissingSinkExtra(ImportError):
    """The sink's library is not installed."""


@runtime_checkable
class MetricsSink(Protocol):
    """Where per-step statistics go."""

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Record ``metrics`` at ``step``."""
        ...

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Record string values of the run (e.g. ``policy_version``)."""
        ...

    def close(self) -> None:
        """Flush and finish."""
        ...


def _need(module: str, extra: str, what: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingSinkExtra(
            f"the {what} metrics sink needs {module.split('.')[0]}, which is not installed: "
            f'pip install "rollwire[{extra}]"'
        ) from exc


class TensorBoardSink:
    """TensorBoard event files under ``logdir`` (tensorboard's own writer; no TF or torch)."""

    def __init__(self, logdir: str | Path) -> None:
        summary = _need("tensorboard.summary", "tensorboard", "TensorBoard")
        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        self._writer = summary.Writer(str(self.logdir))

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """One scalar per metric at ``step``."""
        for name, value in metrics.items():
            self._writer.add_scalar(name, float(value), int(step))
        self._writer.flush()

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Tags go to ``tags.json`` beside the event files (TensorBoard's writer logs scalars)."""
        import json

        path = self.logdir / "tags.json"
        current = json.loads(path.read_text()) if path.exists() else {}
        current.update({k: str(v) for k, v in tags.items()})
        path.write_text(json.dumps(current, indent=1, sort_keys=True))

    def close(self) -> None:
        """Flush and close the event file."""
        self._writer.close()


class MlflowSink:
    """An MLflow run (``tracking_uri``: a ``file:`` store, ``sqlite:///...``, or a server)."""

    def __init__(
        self, tracking_uri: str, experiment: str = "rollwire", run_name: str | None = None
    ) -> None:
        if tracking_uri.startswith("file:") or "://" not in tracking_uri:
            # MLflow 3 keeps the file store behind an opt-in; naming a folder is that choice.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            if "://" not in tracking_uri and not tracking_uri.startswith("file:"):
                tracking_uri = Path(tracking_uri).resolve().as_uri()
        tracking = _need("mlflow.tracking", "mlflow", "MLflow")
        self.client = tracking.MlflowClient(tracking_uri=tracking_uri)
        self.tracking_uri = tracking_uri
        found = self.client.get_experiment_by_name(experiment)
        exp_id = found.experiment_id if found else self.client.create_experiment(experiment)
        self.run_id: str = self.client.create_run(exp_id, run_name=run_name).info.run_id

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """One batch of metrics at ``step``."""
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(_mlflow_key(k), float(v), now, int(step)) for k, v in metrics.items()]
        self.client.log_batch(self.run_id, metrics=batch)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Run tags."""
        for name, value in tags.items():
            self.client.set_tag(self.run_id, name, str(value))

    def close(self) -> None:
        """End the run."""
        self.client.set_terminated(self.run_id)


def _mlflow_key(name: str) -> str:
    # MLflow allows letters, digits, _ - . space : / only.
    return "".join(c if c.isalnum() or c in "_-. :/" else "_" for c in name)


class WandbSink:
    """A Weights & Biases run; offline (files under ``directory``) unless ``mode`` says otherwise."""

    def __init__(
        self,
        directory: str | Path,
        project: str = "rollwire",
        run_name: str | None = None,
        mode: str = "offline",
        config: Mapping[str, Any] | None = None,
    ) -> None:
        wandb = _need("wandb", "wandb", "Weights & Biases")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=project,
            name=run_name,
            dir=str(self.directory),
            mode=mode,
            config=dict(config or {}),
            reinit="create_new",
        )

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """One history row at ``step``."""
        self.run.log({k: float(v) for k, v in metrics.items()}, step=int(step))

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Run summary values."""
        for name, value in tags.items():
            self.run.summary[name] = str(value)

    def close(self) -> None:
        """Finish the run (writes the offline run's files)."""
        self.run.finish()


def make_sink(spec: str) -> MetricsSink:
    """A sink from ``tensorboard:DIR``, ``mlflow:URI_OR_DIR`` or ``wandb:DIR`` (offline)."""
    kind, sep, where = spec.partition(":")
    if not sep or not where:
        raise ValueError(
            f"metrics sink {spec!r}: use tensorboard:DIR, mlflow:URI_OR_DIR or wandb:DIR"
        )
    if kind == "tensorboard":
        return TensorBoardSink(where)
    if kind == "mlflow":
        return MlflowSink(where)
    if kind == "wandb":
        return WandbSink(where, mode=os.environ.get("WANDB_MODE", "offline"))
    raise ValueError(f"unknown metrics sink {kind!r} in {spec!r}: use tensorboard, mlflow or wandb")
