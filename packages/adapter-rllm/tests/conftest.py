"""A faithful minimal stand-in for the rLLM types rollwire builds (rLLM is not installable here).

Written from the field lists of rLLM 0.3.0.pre: ``rllm.types`` ``Step`` / ``Trajectory`` /
``Episode`` (pydantic models; ``metadata`` where the older ``rllm.agents.agent`` dataclasses have
``info``; ``Episode.task_id`` is ``id.split(":")[0]``), ``ModelOutput`` of
``rllm.engine.rollout.rollout_engine`` and the ``TerminationReason`` enum of
``rllm.workflows.workflow``. Not rLLM's code: our own, to validate like it.
"""

from __future__ import annotations

import base64
import json
import sys
import types
import uuid
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np
import pytest
from pydantic import BaseModel, ConfigDict, Field


class TerminationReason(Enum):
    MAX_PROMPT_LENGTH_EXCEEDED = "max_prompt_length_exceeded"
    MAX_RESPONSE_LENGTH_EXCEEDED = "max_response_length_exceeded"
    ENV_DONE = "env_done"
    MAX_TURNS_EXCEEDED = "max_turns_exceeded"
    TIMEOUT = "timeout"
    UNKNOWN = "unknown"
    ERROR = "error"


@dataclass
class ModelOutput:
    text: str | None = None
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[Any] | None = None
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    multi_modal_inputs: dict[str, Any] | None = None
    logprobs: list[float] | None = None
    prompt_logprobs: list[float] | None = None
    routing_matrices: list[str] | None = None
    prompt_length: int = 0
    completion_length: int = 0
    finish_reason: str | None = None
    weight_version: int | None = None
    metrics: dict[str, Any] | None = None


class Step(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    id: str = Field(default_factory=lambda: str(uuid.uuid4()))
    prompt_ids: list[int] = Field(default_factory=list)
    response_ids: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    routing_matrices: list[str] | None = None
    chat_completions: list[dict[str, Any]] = Field(default_factory=list)
    observation: Any = None
    thought: str = ""
    action: Any = None
    model_response: str = ""
    model_output: ModelOutput | None = None
    metadata: dict[str, Any] | None = None
    reward: float = 0.0
    done: bool = False
    mc_return: float = 0.0
    advantage: list[float] | float | None = None
    weight_version: int | None = None

    def model_post_init(self, context: Any, /) -> None:
        if self.logprobs and len(self.logprobs) != len(self.response_ids):
            raise ValueError("length mismatch between response_ids and logprobs")


class Trajectory(BaseModel):
    uid: str = Field(default_factory=lambda: str(uuid.uuid4()))
    name: str = "agent"
    task: Any = None
    steps: list[Step] = Field(default_factory=list)
    reward: float | None = None
    signals: dict[str, float] = Field(default_factory=dict)
    metadata: dict[str, Any] | None = None


class Episode(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    id: str = Field(default_factory=lambda: str(uuid.uuid4()))
    task: Any = None
    termination_reason: TerminationReason | None = None
    is_correct: bool = False
    trajectories: list[Trajectory] = Field(default_factory=list)
    artifacts: dict[str, Any] = Field(default_factory=dict)
    metrics: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def task_id(self) -> str:
        return self.id.split(":")[0]

    @property
    def rollout_idx(self) -> str:
        return self.id.split(":")[1]


def verl_decode_routing(encoded: Any) -> np.ndarray | None:
    """rLLM's verl-backend read of ``Step.routing_matrices``: a ``[header_json, base64]`` pair.

    Anything not of length 2 is ignored (None); a header that is not a mapping fails as rLLM's
    does (a per-token list of exactly two entries gives ``TypeError``).
    """
    if not encoded or len(encoded) != 2:
        return None
    header = json.loads(encoded[0])
    layers, top_k = header["shape"]
    arr = np.frombuffer(base64.b64decode(encoded[1]), dtype=np.dtype(header["dtype"]))
    return arr.reshape(-1, layers, top_k)


def _get(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name)


def verl_segments(episode: Any) -> list[dict[str, Any]]:
    """rLLM's verl transform of one Episode: prefix-extending steps merged into one segment.

    A segment keeps its first step's prompt; its response is each action plus the observation
    tokens between; its routing is that of the last step with routing (which covers the whole
    cumulative sequence). An Episode with no trajectory contributes nothing.
    """
    out: list[dict[str, Any]] = []
    for traj in _get(episode, "trajectories") or []:
        seg: dict[str, Any] | None = None
        for step in _get(traj, "steps"):
            prompt, action = list(_get(step, "prompt_ids")), list(_get(step, "response_ids"))
            routing = _get(step, "routing_matrices")
            if seg is not None and prompt[: len(seg["full"])] == seg["full"]:
                obs = prompt[len(seg["full"]) :]
                seg["response"] += obs + action
                seg["mask"] += [0] * len(obs) + [1] * len(action)
                seg["full"] += obs + action
                seg["routing"] = routing if routing is not None else seg["routing"]
                continue
            if seg is not None:
                out.append(seg)
            seg = {
                "prompt": prompt,
                "response": action,
                "mask": [1] * len(action),
                "full": prompt + action,
                "routing": routing,
            }
        if seg is not None:
            out.append(seg)
    return out


def verl_routed_experts(segments: list[dict[str, Any]], max_prompt: int, max_response: int) -> Any:
    """The ``routed_experts`` tensor rLLM's verl transform adds: only when *every* segment has
    routing, each placed from the first prompt column of its row, zeros elsewhere."""
    decoded = [verl_decode_routing(s["routing"]) for s in segments]
    if not decoded or any(d is None for d in decoded):
        return None
    _, layers, top_k = decoded[0].shape  # type: ignore[union-attr]
    out = np.zeros((len(segments), max_prompt + max_response, layers, top_k), np.int16)
    for i, (seg, r) in enumerate(zip(segments, decoded)):
        assert r is not None
        start = max_prompt - min(len(seg["prompt"]), max_prompt)
        end = min(start + r.shape[0], max_prompt + max_response)
        out[i, start:end] = r[: end - start]
    return out


@pytest.fixture
def rllm_types(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """Installs the stand-in modules rollwire_rllm imports, for the test."""
    modules = {
        "rllm.types": {"Episode": Episode, "Trajectory": Trajectory, "Step": Step},
        "rllm.engine.rollout.rollout_engine": {"ModelOutput": ModelOutput},
        "rllm.workflows.workflow": {"TerminationReason": TerminationReason},
    }
    for name in ("rllm", "rllm.engine", "rllm.engine.rollout", "rllm.workflows"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    for name, attrs in modules.items():
        mod = types.ModuleType(name)
        for key, value in attrs.items():
            setattr(mod, key, value)
        monkeypatch.setitem(sys.modules, name, mod)
    return types.SimpleNamespace(
        Episode=Episode,
        Trajectory=Trajectory,
        Step=Step,
        ModelOutput=ModelOutput,
        TerminationReason=TerminationReason,
    )
