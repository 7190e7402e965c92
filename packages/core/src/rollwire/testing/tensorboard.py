"""Read back what :class:`rollwire.metrics_sinks.TensorBoardSink` wrote, with TensorBoard's reader."""

from __future__ import annotations

from pathlib import Path

__all__ = ["read_scalars"]


def read_scalars(where: str | Path) -> dict[int, dict[str, float]]:
    """``{step: {name: value}}`` of every scalar in the event files under ``where``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    acc = EventAccumulator(str(where), size_guidance={"tensors": 0})
    acc.Reload()
    out: dict[int, dict[str, float]] = {}
    for name in acc.Tags()["tensors"]:
        for event in acc.Tensors(name):
            value = float(tensor_util.make_ndarray(event.tensor_proto))
            out.setdefault(int(event.step), {})[name] = value
    return out
