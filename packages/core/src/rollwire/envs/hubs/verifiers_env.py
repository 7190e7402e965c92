"""A Prime Intellect verifiers taskset as a rollwire task: ``rollwire.envs.hubs.verifiers_env:app``.

Each task names a taskset (a ``verifiers.v1`` taskset id: an installed environment or a module
on the path) and one of its tasks, by ``task_idx`` (its position) or ``task_key``::

    {"taskset": "verifiers_vault", "taskset_config": {"split": "train"}, "task_idx": 3}

One rollout is one ``vf.Agent.run(task)``: verifiers runs the task's harness (``harness``: a
harness id; default the taskset's own, else verifiers' default) in a subprocess runtime, with the
task's toolsets as MCP servers, and its model client pointed at the rollout session's base URL —
verifiers' interception server forwards every model call there, so rollwire captures it. The
trace's reward (the sum of the task's weighted ``@vf.reward`` scores) is the rollout's reward;
each reward's score is the metric ``reward/<name>`` and each ``@vf.metric`` a metric. The trace
records the rollwire session id as ``trace.info["rollwire_session_id"]``. A trace that ended in an
error (the model endpoint, the harness, a tool server) fails the rollout with the error.
"""

from __future__ import annotations

import asyncio
import functools
import json
from typing import Any

from rollwire.agent.app import RolloutApp
from rollwire.agent.context import rollout_context
from rollwire.envs.hubs.episode import (
    episode_result,
    import_framework,
    number_metrics,
    task_field,
)

__all__ = ["agent_config", "app", "find_task", "play", "trace_result"]

#: the package to install for this environment standard
REQUIREMENT = "verifiers>=0.4"
#: where a trace keeps the rollout's session id
SESSION_INFO_KEY = "rollwire_session_id"

app = RolloutApp(failure_reward=0.0)


@functools.lru_cache(maxsize=16)
def _taskset(taskset_id: str, config_json: str) -> list[Any]:
    """The tasks of ``taskset_id`` under its config (loaded once per process)."""
    loaders = import_framework("verifiers.v1.utils.loaders", REQUIREMENT)
    config_type = loaders.taskset_config_type(taskset_id)
    config = config_type.model_validate({**json.loads(config_json), "id": taskset_id})
    return list(loaders.load_taskset(config))


def find_task(task: dict[str, Any]) -> Any:
    """The verifiers task that ``task`` names (``taskset``, ``taskset_config``, and
    ``task_idx`` or ``task_key``)."""
    taskset_id = str(task_field(task, "taskset", "ROLLWIRE_VERIFIERS_TASKSET"))
    config = json.dumps(task.get("taskset_config") or {}, sort_keys=True)
    tasks = _taskset(taskset_id, config)
    if task.get("task_key") is not None:
        found = [t for t in tasks if t.key == str(task["task_key"])]
    else:
        idx = int(task_field(task, "task_idx"))
        found = [t for t in tasks if t.data.idx == idx]
    if not found:
        which = task.get("task_key", task.get("task_idx"))
        raise ValueError(f"taskset {taskset_id!r} has no task {which!r} ({len(tasks)} tasks)")
    return found[0]


def agent_config(payload: dict[str, Any]) -> Any:
    """A ``vf.AgentConfig`` whose model endpoint is the rollout session (its token is in the
    base URL), in a subprocess runtime, with the task's harness, turn and token limits."""
    vf = import_framework("verifiers.v1", REQUIREMENT)
    loaders = import_framework("verifiers.v1.utils.loaders", REQUIREMENT)
    ctx = rollout_context(payload)
    if ctx is None:
        raise ValueError("a verifiers task runs as a rollout: the payload has no '_rollwire'")
    taskset_id = str(task_field(payload, "taskset", "ROLLWIRE_VERIFIERS_TASKSET"))
    harness_id = payload.get("harness") or loaders.default_harness_id(taskset_id)
    sampling: dict[str, Any] = {"max_tokens": int(payload.get("max_tokens") or 64)}
    return vf.AgentConfig(
        model=ctx.model,
        client=vf.EvalClientConfig(base_url=ctx.base_url, api_key_var="ROLLWIRE_SESSION_KEY"),
        runtime=vf.SubprocessConfig(),
        harness=loaders.harness_config_type(harness_id)(id=harness_id),
        sampling=vf.SamplingConfig(**sampling),
        max_turns=int(payload.get("max_turns") or 4),
    )


def trace_result(trace: Any) -> dict[str, Any]:
    """A finished trace as the rollout's terminal record; an errored trace raises."""
    if trace.errors or not trace.ok:
        errors = "; ".join(str(getattr(e, "message", e)) for e in trace.errors) or "not ok"
        raise RuntimeError(f"the verifiers rollout failed: {errors}")
    metrics = number_metrics({k: v for k, v in trace.metrics.items() if v is not None})
    for name, reward in trace.rewards.items():
        if reward is not None:
            metrics[f"reward/{name}"] = float(reward.score)
    metrics["turns"] = float(trace.num_turns)
    return episode_result(trace.reward, metrics)


@app.rollout_entrypoint
async def play(payload: dict[str, Any]) -> dict[str, Any]:
    """One verifiers rollout: ``{"reward", "metrics": {"reward/<name>", "turns", ...}}``."""
    vf = import_framework("verifiers.v1", REQUIREMENT)
    task = await asyncio.to_thread(find_task, payload)  # the first load imports the taskset
    ctx = rollout_context(payload)
    session_id = ctx.session_id if ctx is not None else None

    def tag(trace: Any) -> None:
        trace.info[SESSION_INFO_KEY] = session_id

    async with vf.make_agent(agent_config(payload)) as agent:
        trace = await agent.run(task, on_trace=tag)
    return trace_result(trace)
