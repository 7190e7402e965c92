"""Runners hand rollout payloads to agents: ``local`` (in-process), ``http`` (``/invocations``),
``agentcore`` (boto3 ``invoke_agent_runtime``) and ``ray`` (Ray tasks). Heavy clients are imported
only when their runner is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rollwire.trainer.runners.base import RateLimiter, Runner, RunnerError
from rollwire.trainer.runners.http import HttpRunner
from rollwire.trainer.runners.local import LocalRunner

if TYPE_CHECKING:
    from rollwire.trainer.runners.agentcore import AgentCoreRunner
    from rollwire.trainer.runners.ray import RayRunner

__all__ = [
    "AgentCoreRunner",
    "HttpRunner",
    "LocalRunner",
    "RateLimiter",
    "RayRunner",
    "Runner",
    "RunnerError",
    "make_runner",
]


def __getattr__(name: str) -> Any:
    if name == "AgentCoreRunner":
        from rollwire.trainer.runners.agentcore import AgentCoreRunner

        return AgentCoreRunner
    if name == "RayRunner":
        from rollwire.trainer.runners.ray import RayRunner

        return RayRunner
    raise AttributeError(f"module 'rollwire.trainer.runners' has no attribute {name!r}")


def make_runner(
    spec: str | Runner, *, app: Any = None, app_path: str | None = None, **options: Any
) -> Runner:
    """A runner from a spec: ``local``, ``http:URL[,URL]``, ``ray[:ADDRESS]``, ``agentcore:ARN``.

    ``local`` needs ``app`` (a RolloutApp or handler); ``ray`` needs ``app_path`` (``module:app``,
    importable on the workers). ``options`` go to the runner's constructor.
    """
    if not isinstance(spec, str):
        return spec
    kind, _, rest = spec.partition(":")
    if kind == "local":
        if app is None:
            raise ValueError(
                "the local runner needs the agent app: pass app=... (or --agent MODULE:APP)"
            )
        return LocalRunner(app, **options)
    if kind == "http":
        if not rest:
            raise ValueError(
                "the http runner needs agent URLs: http:http://127.0.0.1:8080[,URL...]"
            )
        return HttpRunner(rest, **options)
    if kind == "ray":
        if app_path is None:
            raise ValueError(
                "the ray runner needs the agent as 'module:app' importable on the workers"
            )
        from rollwire.trainer.runners.ray import RayRunner

        return RayRunner(app_path, address=rest or None, **options)
    if kind == "agentcore":
        if not rest:
            raise ValueError(
                "the agentcore runner needs the agent runtime ARN: agentcore:arn:aws:bedrock-agentcore:..."
            )
        from rollwire.trainer.runners.agentcore import AgentCoreRunner

        return AgentCoreRunner(rest, **options)
    raise ValueError(
        f"unknown runner {spec!r}: use local, http:URL[,URL], ray[:ADDRESS] or agentcore:ARN"
    )
