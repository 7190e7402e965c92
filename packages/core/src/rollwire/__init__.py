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
    "RolloutApp": "rollwire.agent.app",
    "RolloutContext": "rollwire.agent.context",
    "rollout_context": "rollwire.agent.context",
    "openai_client": "rollwire.agent.context",
    "async_openai_client": "rollwire.agent.context",
    "anthropic_client": "rollwire.agent.context",
    "async_anthropic_client": "rollwire.agent.context",
    "rollout_model": "rollwire.agent.context",
    "rollout_create_kwargs": "rollwire.agent.context",
    # trainer side
    "RolloutClient": "rollwire.trainer.client",
    "GatewayUnavailable": "rollwire.trainer.client",
    "GatewayClient": "rollwire.trainer.gateway_client",
    "AsyncGatewayClient": "rollwire.trainer.gateway_client",
    "LocalRunner": "rollwire.trainer.runners",
    "HttpRunner": "rollwire.trainer.runners",
    "RunnerError": "rollwire.trainer.runners",
    "make_runner": "rollwire.trainer.runners",
    # data model
    "ModelCall": "rollwire.data.protocol",
    "Rollout": "rollwire.data.protocol",
    "Group": "rollwire.data.protocol",
    "Row": "rollwire.data.protocol",
    "Fork": "rollwire.data.protocol",
    "TrajectoryBuilder": "rollwire.data.trajectory",
    "build_rows": "rollwire.data.trajectory",
    "read_jsonl": "rollwire.data.dataset",
    "write_jsonl": "rollwire.data.dataset",
    "group_advantages": "rollwire.data.rewards",
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
    "anthropic_client",
    "async_anthropic_client",
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
    from rollwire.agent.app import RolloutApp
    from rollwire.agent.context import (
        RolloutContext,
        anthropic_client,
        async_anthropic_client,
        async_openai_client,
        openai_client,
        rollout_context,
        rollout_create_kwargs,
        rollout_model,
    )
    from rollwire.data.dataset import read_jsonl, write_jsonl
    from rollwire.data.protocol import Fork, Group, ModelCall, Rollout, Row
    from rollwire.data.rewards import group_advantages
    from rollwire.data.trajectory import TrajectoryBuilder, build_rows
    from rollwire.trainer.client import GatewayUnavailable, RolloutClient
    from rollwire.trainer.gateway_client import AsyncGatewayClient, GatewayClient
    from rollwire.trainer.runners import HttpRunner, LocalRunner, RunnerError, make_runner


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rollwire' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
