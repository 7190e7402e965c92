"""What the environment standards' rollout apps share: reading a task's fields, the framework's
import with the package to install, and the result record (reward, metrics, per-turn rewards)."""

from __future__ import annotations

import importlib
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from rollwire.data.foreign import step_metrics

__all__ = ["episode_result", "import_framework", "number_metrics", "task_field"]


def task_field(task: Mapping[str, Any], key: str, env_var: str | None = None) -> Any:
    """``task[key]``, else the environment variable ``env_var``; an error saying what to add
    when neither is set."""
    value = task.get(key)
    if value is None and env_var is not None:
        value = os.environ.get(env_var) or None
    if value is None:
        where = f" (or the environment variable {env_var})" if env_var else ""
        raise ValueError(f"the task has no {key!r}{where}: add it to each line of the tasks file")
    return value


def import_framework(module: str, requirement: str) -> Any:
    """``importlib.import_module(module)``, or an ImportError that names what to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"this environment needs {module!r}: pip install '{requirement}' ({exc})"
        ) from exc


def number_metrics(values: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The finite numbers (and booleans) of ``values`` as metrics, keys prefixed."""
    out: dict[str, float] = {}
    for key, value in values.items():
        if isinstance(value, (bool, int, float)) and math.isfinite(float(value)):
            out[f"{prefix}{key}"] = float(value)
    return out


def episode_result(
    reward: float, metrics: Mapping[str, float], steps: Sequence[float] = ()
) -> dict[str, Any]:
    """The rollout's terminal record: ``reward``, ``metrics`` and, when the environment scored
    each turn, ``step_reward/<i>`` for the ``i``-th model call (``rollwire.data.credit``)."""
    return {"reward": float(reward), "metrics": {**metrics, **step_metrics(list(steps))}}
