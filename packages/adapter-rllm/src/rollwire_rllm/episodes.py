"""rollwire rollouts as rLLM ``Episode``s (DESIGN §9). Pure functions: no I/O, no rLLM import.

:func:`to_episode_dicts` gives the ``Episode.to_dict()`` form; :func:`to_episodes` builds rLLM's
``Episode`` / ``Trajectory`` / ``Step`` / ``ModelOutput`` objects when rLLM is importable. One
Episode per rollout (``id = f"{task_id}:{rollout_idx}"``), one Trajectory per Episode, one Step per
captured call with exactly the captured ids — rLLM merges prefix-extending steps itself.
:func:`episode_rows` merges an Episode's steps back into rollwire rows.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from rollwire.data.credit import CreditSpec, as_credit
from rollwire.data.protocol import Group, ModelCall, Rollout, Row, group_rollouts
from rollwire.data.trajectory import SUPERSEDED_FLAG, BuildMode, TokenizerLike, TrajectoryBuilder
from rollwire_rllm.routing import (
    ROUTING_FORMATS,
    RoutingFormat,
    decode_routing_matrix,
    routing_matrices,
)
from rollwire_rllm.versions import spans_from_info, step_credit_fields, step_version, version_info

__all__ = [
    "decode_routing_matrix",
    "episode_rows",
    "episode_task_id",
    "routing_matrices",
    "termination_reason",
    "to_episode_dicts",
    "to_episodes",
]

#: Key under ``info`` where rollwire keeps its ids and per-call capture facts.
INFO_KEY = "rollwire"

_INSTALL_HINT = (
    "rLLM is not installed (it is not on PyPI): install it from source "
    "(git clone https://github.com/rllm-org/rllm && pip install -e rllm) in the trainer's "
    "environment, or use rollwire_rllm.to_episode_dicts() for the dict form"
)


def termination_reason(rollout: Rollout) -> str:
    """rLLM ``TerminationReason`` value for a rollout's status and its last call's finish reason."""
    if rollout.status == "failed":
        return "error"
    if rollout.status == "timeout":
        return "timeout"
    if rollout.status != "completed":
        return "unknown"
    usable = [c for c in rollout.calls if c.status == "ok"]
    if usable and max(usable, key=lambda c: c.index).finish_reason == "length":
        return "max_response_length_exceeded"
    return "env_done"


def episode_task_id(task_id: str) -> str:
    """``task_id`` safe for rLLM's ``Episode.id.split(":")``: ``%`` and ``:`` percent-escaped.

    rLLM reads an Episode's task id as ``id.split(":")[0]`` and groups rollouts by it, so a
    ``:`` inside the task id would cut it short; ``"gsm8k:12"`` becomes ``"gsm8k%3A12"``.
    """
    return task_id.replace("%", "%25").replace(":", "%3A")


def _is_correct(rollout: Rollout, reward: float) -> bool:
    for key in ("is_correct", "correct"):
        if key in rollout.metrics:
            return bool(rollout.metrics[key] > 0)
    return reward > 0


def _response_message(call: ModelCall, tokenizer: TokenizerLike | None) -> dict[str, Any]:
    choices = call.response.get("choices") if isinstance(call.response, dict) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        message = choices[0].get("message")
        if isinstance(message, dict):
            return dict(message)
    content = (
        tokenizer.decode(call.completion_ids.tolist(), skip_special_tokens=True)
        if tokenizer is not None
        else ""
    )
    return {"role": "assistant", "content": content}


def _step_dict(
    call: ModelCall,
    *,
    row_of_call: Mapping[str, Row],
    last: bool,
    reward: float,
    tokenizer: TokenizerLike | None,
    routing_format: RoutingFormat = "verl",
    credit: dict[str, Any] | None = None,
) -> dict[str, Any]:
    request_messages = call.request.get("messages")
    messages = list(request_messages) if isinstance(request_messages, list) else []
    response = _response_message(call, tokenizer)
    content = response.get("content")
    content = content if isinstance(content, str) else ""
    reasoning = response.get("reasoning_content") or response.get("reasoning") or ""
    tool_calls = response.get("tool_calls") or []
    prompt_ids = call.prompt_ids.tolist()
    completion_ids = call.completion_ids.tolist()
    logprobs = call.logprobs.astype(np.float64).tolist()
    matrices = routing_matrices(call, routing_format)
    version = step_version(call)
    row = row_of_call.get(call.call_id)
    model_output = {
        "text": content,
        "content": content,
        "reasoning": reasoning,
        "tool_calls": tool_calls,
        "prompt_ids": prompt_ids,
        "completion_ids": completion_ids,
        "multi_modal_inputs": None,
        "logprobs": logprobs,
        "prompt_logprobs": None,
        "routing_matrices": matrices,
        "prompt_length": len(prompt_ids),
        "completion_length": len(completion_ids),
        "finish_reason": call.finish_reason,
        "weight_version": version,
        "metrics": {"latency_ms": call.latency_ms},
    }
    return {
        "prompt_ids": prompt_ids,
        "response_ids": completion_ids,
        "logprobs": logprobs,
        "routing_matrices": matrices,
        "chat_completions": [*messages, response],
        "observation": None,
        "thought": reasoning,
        "action": None,
        "model_response": content,
        "model_output": model_output,
        "info": {
            INFO_KEY: {
                "call_id": call.call_id,
                "call_index": call.index,
                "trainable": call.trainable,
                "off_policy": call.off_policy,
                "flags": list(call.flags),
                "capture": call.capture,
                "backend": call.backend,
                "retry_of": call.retry_of,
                "policy_version": call.policy_version,
                "weight_versions": version_info(call),
                "row_index": row.row_index if row is not None else None,
                "fork": (
                    row.fork.model_dump(mode="json")
                    if row is not None and row.fork is not None and row.call_ids[0] == call.call_id
                    else None
                ),
            }
        },
        "reward": reward if last else 0.0,
        "done": last,
        "mc_return": 0.0,
        "advantage": None,
        "weight_version": version,
        **(credit or {}),
    }


def _trainable(call: ModelCall) -> bool:
    return (
        call.status == "ok"
        and SUPERSEDED_FLAG not in call.flags
        and call.trainable
        and not call.off_policy
    )


def _episode_info(
    rollout: Rollout, *, group_id: str, rows: int, left_out: list[str], mode: BuildMode
) -> dict[str, Any]:
    return {
        INFO_KEY: {
            "rollout_id": rollout.rollout_id,
            "group_id": group_id,
            "task_id": rollout.task_id,
            "session_id": rollout.session_id,
            "status": rollout.status,
            "reward": rollout.reward,
            "error": rollout.error,
            "num_rows": rows,
            "num_calls": len(rollout.calls),
            "left_out_calls": left_out,
            "capture": rollout.capture,
            "mode": mode,
            "weight_versions": rollout.weight_versions(),
        }
    }


def rollout_episode_dict(
    rollout: Rollout,
    *,
    rollout_idx: int,
    task_id: str | None = None,
    group_id: str | None = None,
    task: Any = None,
    tokenizer: TokenizerLike | None = None,
    trajectory_name: str = "agent",
    failure_reward: float = 0.0,
    mode: BuildMode = "merge",
    routing_format: RoutingFormat = "verl",
    step_credit: CreditSpec | None = None,
) -> dict[str, Any]:
    """The Episode dict of one rollout: one Trajectory, one Step per trainable captured call.

    rLLM trains every step it is given (a Step has no loss mask), so calls rollwire would keep
    only as context are left out: failed calls, calls superseded by an agent retry, and
    non-trainable or off-policy calls (guided decoding, ``logit_bias``, ``n > 1``). Their ids go
    into ``info["rollwire"]["left_out_calls"]``. ``routing_format``: how ``Step.routing_matrices``
    is written (:mod:`rollwire_rllm.routing`; ``"verl"`` for rLLM's verl backend, ``"tinker"``
    for its Tinker/Fireworks path). ``step_credit``: Steps of a rollout with step rewards carry
    them (:mod:`rollwire_rllm.versions`).
    """
    if routing_format not in ROUTING_FORMATS:
        raise ValueError(f"routing_format must be one of {ROUTING_FORMATS}, got {routing_format!r}")
    calls = sorted((c for c in rollout.calls if _trainable(c)), key=lambda c: c.index)
    left_out = [c.call_id for c in rollout.calls if c.status == "ok" and not _trainable(c)]
    rows = TrajectoryBuilder(mode, tokenizer).build(rollout)
    row_of_call = {cid: row for row in rows for cid in row.call_ids}
    reward = float(rollout.reward) if rollout.reward is not None else float(failure_reward)
    credit = as_credit(step_credit)
    fields = step_credit_fields(rollout, credit)
    steps = [
        _step_dict(
            call,
            row_of_call=row_of_call,
            last=i == len(calls) - 1,
            reward=reward,
            tokenizer=tokenizer,
            routing_format=routing_format,
            credit=fields.get(call.call_id) if fields else None,
        )
        for i, call in enumerate(calls)
    ]
    group_id = group_id if group_id is not None else (rollout.group_id or rollout.rollout_id)
    task_id = task_id or rollout.task_id or group_id
    task = task if task is not None else rollout.task
    info = _episode_info(rollout, group_id=group_id, rows=len(rows), left_out=left_out, mode=mode)
    info[INFO_KEY]["routing_format"] = routing_format
    info[INFO_KEY]["step_credit"] = credit.mode if credit is not None and fields else None
    trains = rollout.status == "completed"
    info[INFO_KEY]["trainable"] = trains
    return {
        "id": f"{episode_task_id(task_id)}:{rollout_idx}",
        "task": task,
        "termination_reason": termination_reason(rollout),
        "is_correct": trains and _is_correct(rollout, reward),
        # a rollout that did not complete trains nothing: like the Episode rLLM's own engine
        # returns for a failed flow, it has no trajectories (rLLM steps carry no loss mask)
        "trajectories": [
            {
                "uid": rollout.rollout_id,
                "name": trajectory_name,
                "task": task,
                "steps": steps,
                "reward": reward,
                "info": info,
            }
        ]
        if trains
        else [],
        "metrics": dict(rollout.metrics),
        "info": info,
    }


def to_episode_dicts(
    batch: Iterable[Group | Rollout],
    *,
    tokenizer: TokenizerLike | None = None,
    trajectory_name: str = "agent",
    failure_reward: float = 0.0,
    mode: BuildMode = "merge",
    routing_format: RoutingFormat = "verl",
    step_credit: CreditSpec | None = None,
) -> list[dict[str, Any]]:
    """The batch as rLLM Episode dicts, group by group; ``rollout_idx`` is the position in the group.

    ``routing_format``: ``"verl"`` (default: ``[header_json, base64_blob]`` per step, what rLLM's
    verl backend reads) or ``"tinker"`` (one entry per completion token); see
    :mod:`rollwire_rllm.routing`. ``step_credit``: step rewards onto the Steps
    (:mod:`rollwire_rllm.versions`).
    """
    out: list[dict[str, Any]] = []
    for group in group_rollouts(batch):
        for idx, rollout in enumerate(group.rollouts):
            out.append(
                rollout_episode_dict(
                    rollout,
                    rollout_idx=idx,
                    task_id=rollout.task_id or group.task_id or group.group_id,
                    group_id=group.group_id,
                    task=rollout.task if rollout.task is not None else group.task,
                    tokenizer=tokenizer,
                    trajectory_name=trajectory_name,
                    failure_reward=failure_reward,
                    mode=mode,
                    routing_format=routing_format,
                    step_credit=step_credit,
                )
            )
    if not out:
        raise ValueError("empty batch: no rollouts to convert to rLLM episodes")
    return out


def import_rllm() -> dict[str, Any]:
    """rLLM's ``Episode``, ``Trajectory``, ``Step``, ``ModelOutput``, ``TerminationReason``.

    rLLM 0.3.0.pre's ``AgentFlowEngine`` works on ``rllm.types`` (its trace enrichment rebuilds
    any other Trajectory class), so those are preferred; ``rllm.agents.agent`` (the older
    workflow types) is the fallback.
    """
    try:
        try:
            from rllm.types import Episode, Step, Trajectory
        except ImportError:
            from rllm.agents.agent import Episode, Step, Trajectory
        try:
            from rllm.engine.rollout.rollout_engine import ModelOutput
        except ImportError:
            from rllm.experimental.rollout import ModelOutput
        from rllm.workflows.workflow import TerminationReason
    except ImportError as exc:
        raise ImportError(_INSTALL_HINT) from exc
    return {
        "Episode": Episode,
        "Trajectory": Trajectory,
        "Step": Step,
        "ModelOutput": ModelOutput,
        "TerminationReason": TerminationReason,
    }


def _field_names(cls: Any) -> set[str]:
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls) if f.init}
    model_fields = getattr(cls, "model_fields", None)
    if isinstance(model_fields, dict):
        return set(model_fields)
    return set()


#: dict keys an installed rLLM may lack without losing training data (display-only fields).
_OPTIONAL_KEYS = frozenset(
    {"uid", "observation", "thought", "action", "model_response", "text", "mc_return"}
)


def _construct(cls: Any, data: Mapping[str, Any]) -> Any:
    """``cls(**data)`` keeping the keys ``cls`` accepts (``info`` maps to ``metadata`` if needed).

    A key the installed class lacks is dropped with a warning (once per class and key set), so
    an rLLM without, say, ``routing_matrices`` does not lose R3 data silently.
    """
    names = _field_names(cls)
    kwargs = dict(data)
    if "info" in kwargs and "info" not in names and "metadata" in names:
        kwargs["metadata"] = kwargs.pop("info")
    dropped = sorted(k for k in kwargs if k not in names and k not in _OPTIONAL_KEYS)
    if dropped and any(kwargs[k] is not None for k in dropped):
        warnings.warn(
            f"the installed rLLM's {cls.__module__}.{cls.__qualname__} has no field "
            f"{', '.join(dropped)}; rollwire drops them (upgrade rLLM to keep them)",
            RuntimeWarning,
            stacklevel=3,
        )
    return cls(**{k: v for k, v in kwargs.items() if k in names})


def episode_from_dict(data: Mapping[str, Any], types: Mapping[str, Any] | None = None) -> Any:
    """An rLLM ``Episode`` from its dict form (rLLM must be importable)."""
    t = types or import_rllm()
    trajectories = []
    for traj in data["trajectories"]:
        steps = []
        for step in traj["steps"]:
            s = dict(step)
            if s.get("model_output") is not None:
                mo = dict(s["model_output"])
                mo["tool_calls"] = None  # rLLM wants ToolCall objects; the raw calls stay in chat
                s["model_output"] = _construct(t["ModelOutput"], mo)
            steps.append(_construct(t["Step"], s))
        trajectories.append(_construct(t["Trajectory"], {**traj, "steps": steps}))
    reason = data.get("termination_reason")
    return _construct(
        t["Episode"],
        {
            **data,
            "trajectories": trajectories,
            "termination_reason": t["TerminationReason"](reason) if reason is not None else None,
        },
    )


def to_episodes(batch: Iterable[Group | Rollout], **options: Any) -> list[Any]:
    """Like :func:`to_episode_dicts`, as rLLM ``Episode`` objects (needs rLLM installed)."""
    types = import_rllm()
    return [episode_from_dict(d, types) for d in to_episode_dicts(batch, **options)]


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def episode_rollout(episode: Any) -> Rollout:
    """A rollwire Rollout rebuilt from an Episode (dict or object) made by this module."""
    info = _get(episode, "info", None) or _get(episode, "metadata", None) or {}
    meta = info.get(INFO_KEY) or {}
    rollout_id = str(meta.get("rollout_id") or _get(episode, "id"))
    trajectories = _get(episode, "trajectories", []) or []
    calls: list[ModelCall] = []
    reward: float | None = None
    for traj in trajectories:
        reward = _get(traj, "reward", reward)
        for i, step in enumerate(_get(traj, "steps", []) or []):
            sinfo = (_get(step, "info", None) or _get(step, "metadata", None) or {}).get(
                INFO_KEY
            ) or {}
            calls.append(
                ModelCall(
                    call_id=str(sinfo.get("call_id") or f"{rollout_id}-s{len(calls)}"),
                    session_id=rollout_id,
                    index=int(sinfo.get("call_index", i)),
                    prompt_ids=np.asarray(_get(step, "prompt_ids"), dtype=np.int32),
                    completion_ids=np.asarray(_get(step, "response_ids"), dtype=np.int32),
                    logprobs=np.asarray(_get(step, "logprobs"), dtype=np.float32),
                    trainable=bool(sinfo.get("trainable", True)),
                    off_policy=bool(sinfo.get("off_policy", False)),
                    policy_version=sinfo.get("policy_version"),
                    weight_versions=spans_from_info(sinfo.get("weight_versions")),
                )
            )
    status = meta.get("status", "completed")
    return Rollout(
        rollout_id=rollout_id,
        group_id=meta.get("group_id"),
        task_id=meta.get("task_id"),
        status=status,
        reward=reward if meta.get("reward", reward) is not None else None,
        calls=calls,
    )


def episode_rows(episode: Any, mode: BuildMode | None = None) -> list[Row]:
    """The rollwire rows of an Episode: its steps merged back with :class:`TrajectoryBuilder`."""
    info = _get(episode, "info", None) or _get(episode, "metadata", None) or {}
    mode = mode or (info.get(INFO_KEY) or {}).get("mode", "merge")
    return TrajectoryBuilder(mode).build(episode_rollout(episode))


def flatten_steps(episodes: Sequence[Any]) -> list[Row]:
    """Rows of every Episode, in order."""
    return [row for ep in episodes for row in episode_rows(ep)]
