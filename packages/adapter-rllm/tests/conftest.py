"""A faithful minimal stand-in for the rLLM types rollwire builds (rLLM is not installable here).

Written from the field lists of rLLM 0.3.0.pre: ``rllm.types`` ``Step`` / ``Trajectory`` /
``Episode`` (pydantic models; ``metadata`` where the older ``rllm.agents.agent`` dataclasses have
``info``; ``Episode.task_id`` is ``id.split(":")[0]``), ``ModelOutput`` of
``rllm.engine.rollout.rollout_engine`` and the ``TerminationReason`` enum of
``rllm.workflows.workflow``. Not rLLM's code: our own, to validate like it.
"""

from __future__ import annotations

import sys
import types
import uuid
from dataclasses import dataclass
from enum import Enum
from typing import Any

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
    advantage: list[float] | float | None = None
    weight_version: int | None = None

    def model_post_init(self, context: Any, /) -> None:
        if self.logprobs and len(self.logprobs) != len(self.response_ids):
            raise ValueError("length mismatch between response_ids and logprobs")
        if self.routing_matrices is not None and len(self.routing_matrices) != len(
            self.response_ids
        ):
            raise ValueError("routing_matrices must have one entry per response token")


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
