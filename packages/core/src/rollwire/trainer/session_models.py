"""What the control plane answers about sessions: the handle a new session gets and its status."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["SessionHandle", "SessionInfo"]


class SessionHandle(BaseModel):
    """What creating a session returns: the id, the agent's token and URLs."""

    model_config = ConfigDict(extra="ignore")

    session_id: str
    token: str
    base_url: str
    complete_url: str
    expires_at: float | None = None


class SessionInfo(BaseModel):
    """A session's status, outcome and counters."""

    model_config = ConfigDict(extra="ignore")

    session_id: str
    group_id: str | None = None
    task_id: str | None = None
    status: str = "running"
    reward: float | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    error: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    sampling: dict[str, Any] = Field(default_factory=dict)
    capture: str = "passthrough"
    created_at: float | None = None
    completed_at: float | None = None
    num_calls: int = 0
    num_tokens: int = 0

    @property
    def terminal(self) -> bool:
        """True once the session has a final status."""
        return self.status in ("completed", "failed", "timeout", "cancelled")
