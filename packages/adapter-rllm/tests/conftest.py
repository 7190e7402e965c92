"""The two rLLM dataclasses the flow tests hand ``RollwireAgentFlow.arun``.

rLLM's ``Episode`` / ``Trajectory`` / ``Step`` / ``ModelOutput`` are not copied here: what rLLM's
real classes and trainers make of rollwire's output is recorded in ``data/rllm_contract.json``
(``ci/record_contract.py``). These two are plain argument shapes; ``test_rllm_contract.py`` checks
their fields against the ones recorded from rLLM's ``rllm.types``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class AgentConfig:
    """rLLM's ``AgentConfig``, as its ``AgentFlowEngine._run_flow_only`` fills it."""

    base_url: str
    model: str
    session_uid: str
    metadata: dict[str, Any] = field(default_factory=dict)
    is_validation: bool = False
    sampling_params: dict[str, Any] = field(default_factory=dict)


@dataclass
class Task:
    """rLLM's ``Task``: its leading fields (the rest have defaults)."""

    id: str
    instruction: str
    metadata: dict[str, Any] = field(default_factory=dict)
