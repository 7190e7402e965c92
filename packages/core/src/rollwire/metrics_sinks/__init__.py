"""Per-step statistics of rollouts to MLflow, Weights & Biases or TensorBoard.

``rollwire run --metrics tensorboard:runs/`` (or ``mlflow:mlruns``, ``wandb:wandb-dir``) logs the
batch's statistics; from Python, ``make_sink(spec).log(step_metrics(groups), step)``. The
trainer adapters' hooks log each step to ``$ROLLWIRE_METRICS``
(:mod:`rollwire.metrics_sinks.step_logger`). Each library is an optional extra
(``rollwire[mlflow]``, ``rollwire[wandb]``, ``rollwire[tensorboard]``).
"""

from rollwire.metrics_sinks.sinks import (
    MetricsSink,
    MissingSinkExtra,
    MlflowSink,
    TensorBoardSink,
    WandbSink,
    make_sink,
)
from rollwire.metrics_sinks.stats import step_metrics
from rollwire.metrics_sinks.step_logger import (
    METRICS_ENV,
    METRICS_EVERY_ENV,
    StepLogger,
    metrics_every,
    metrics_spec,
    shared_step_logger,
)

__all__ = [
    "METRICS_ENV",
    "METRICS_EVERY_ENV",
    "MetricsSink",
    "MissingSinkExtra",
    "MlflowSink",
    "StepLogger",
    "TensorBoardSink",
    "WandbSink",
    "make_sink",
    "metrics_every",
    "metrics_spec",
    "shared_step_logger",
    "step_metrics",
]
