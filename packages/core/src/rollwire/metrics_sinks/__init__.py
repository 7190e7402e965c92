"""Per-step statistics of rollouts to MLflow, Weights & Biases or TensorBoard.

``rollwire run --metrics tensorboard:runs/`` (or ``mlflow:mlruns``, ``wandb:wandb-dir``) logs the
batch's statistics; from Python, ``make_sink(spec).log(step_metrics(groups), step)``. Each
library is an optional extra (``rollwire[mlflow]``, ``rollwire[wandb]``, ``rollwire[tensorboard]``).
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

__all__ = [
    "MetricsSink",
    "MissingSinkExtra",
    "MlflowSink",
    "TensorBoardSink",
    "WandbSink",
    "make_sink",
    "step_metrics",
]
