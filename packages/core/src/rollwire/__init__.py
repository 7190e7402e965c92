"""rollwire: online RL for production LLM agents.

The public API is re-exported here lazily, so ``import rollwire`` stays light for agent
containers (no NumPy, gateway or engine code until a name that needs them is used).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # agent side
    "RolloutApp": "rollwire.app",
    "RolloutContext": "rollwire.context",
    "rollout_context": "rollwire.context",
    "openai_client": "rollwire.context",
    "async_openai_client": "rollwire.context",
    "rollout_model": "rollwire.context",
    "rollout_create_kwargs": "rollwire.context",
    # trainer side
    "RolloutClient": "rollwire.client",
    "GatewayUnavailable": "rollwire.client",
    "GatewayClient": "rollwire.gateway_client",
    "AsyncGatewayClient": "rollwire.gateway_client",
    "LocalRunner": "rollwire.runners",
    "HttpRunner": "rollwire.runners",
    "RunnerError": "rollwire.runners",
    "make_runner": "rollwire.runners",
    # data model
    "ModelCall": "rollwire.protocol",
    "Rollout": "rollwire.protocol",
    "Group": "rollwire.protocol",
    "Row": "rollwire.protocol",
    "Fork": "rollwire.protocol",
    "TrajectoryBuilder": "rollwire.trajectory",
    "build_rows": "rollwire.trajectory",
    "read_jsonl": "rollwire.dataset",
    "write_jsonl": "rollwire.dataset",
    "group_advantages": "rollwire.rewards",
}

__all__ = [
    "AsyncGatewayClient",
    "Fork",
    "GatewayClient",
    "GatewayUnavailable",
    "Group",
    "HttpRunner",
    "LocalRunner",
    "ModelCall",
    "Rollout",
    "RolloutApp",
    "RolloutClient",
    "RolloutContext",
    "Row",
    "RunnerError",
    "TrajectoryBuilder",
    "__version__",
    "async_openai_client",
    "build_rows",
    "group_advantages",
    "make_runner",
    "openai_client",
    "read_jsonl",
    "rollout_context",
    "rollout_create_kwargs",
    "rollout_model",
    "write_jsonl",
]

if TYPE_CHECKING:
    from rollwire.app import RolloutApp
    from rollwire.client import GatewayUnavailable, RolloutClient
    from rollwire.context import (
        RolloutContext,
        async_openai_client,
        openai_client,
        rollout_context,
        rollout_create_kwargs,
        rollout_model,
    )
    from rollwire.dataset import read_jsonl, write_jsonl
    from rollwire.gateway_client import AsyncGatewayClient, GatewayClient
    from rollwire.protocol import Fork, Group, ModelCall, Rollout, Row
    from rollwire.rewards import group_advantages
    from rollwire.runners import HttpRunner, LocalRunner, RunnerError, make_runner
    from rollwire.trajectory import TrajectoryBuilder, build_rows


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rollwire' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
