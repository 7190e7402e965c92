"""The store protocol: an append-only per-session log of model calls plus the session records.

A call is durable when :meth:`Store.append_call` returns (the gateway answers the agent only
after that). Prompts and messages are stored as deltas against earlier calls (DESIGN §5).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

from rollwire.data.protocol import TERMINAL_STATUSES, ModelCall

__all__ = [
    "CompletionConflict",
    "SessionClosed",
    "SessionExists",
    "SessionNotFound",
    "SessionRecord",
    "Store",
    "StoreUnavailable",
]


class SessionNotFound(KeyError):
    """No session with that id."""


class SessionClosed(ValueError):
    """The session is terminal (completed, failed, timed out or cancelled): it takes no calls."""


class SessionExists(ValueError):
    """A session with that id exists already."""


class StoreUnavailable(RuntimeError):
    """The store cannot take or give data right now (server down, disk full): nothing was
    recorded. The gateway answers 503; the caller may retry later."""


class CompletionConflict(ValueError):
    """The session was completed already with a different outcome."""

    def __init__(self, message: str, record: SessionRecord) -> None:
        super().__init__(message)
        self.record = record


@dataclass
class SessionRecord:
    """One session (= one rollout): its configuration, status, outcome and counters."""

    session_id: str
    group_id: str | None = None
    task_id: str | None = None
    status: str = "running"
    reward: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    sampling: dict[str, Any] = field(default_factory=dict)
    sampling_policy: dict[str, str] = field(default_factory=dict)
    capture: str = "passthrough"
    allow_off_policy: bool = False
    #: the session trains with routing replay: a streamed passthrough call is asked non-streamed
    #: and re-streamed to the agent (vLLM and SGLang put no routing on stream chunks), and a call
    #: that still comes back without routed experts is flagged ``routed_experts_missing``. None
    #: (the default): so does every call to a backend that has returned routing; False: never
    routed_experts: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    #: policy versions a call may be sampled behind the trainer (None: no bound); see
    #: ``rollwire.gateway.dataplane.staleness``
    max_staleness: int | None = None
    #: ``hold``: a rollout whose first call would be stale waits; ``mark``: it runs, and its
    #: stale calls are flagged (a started rollout is never held, under either)
    on_stale: str = "hold"
    max_calls: int | None = None
    max_tokens: int | None = None
    expires_at: float | None = None
    created_at: float = field(default_factory=time.time)
    completed_at: float | None = None
    num_calls: int = 0
    num_tokens: int = 0
    # Which creation of this session id the record is: a session deleted and created again
    # with the same id is another incarnation (tokens of the old one must not work for it).
    incarnation: str = field(default_factory=lambda: secrets.token_hex(8))

    @property
    def terminal(self) -> bool:
        """True once the session has a final status."""
        return self.status in TERMINAL_STATUSES

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready."""
        return asdict(self)

    def info(self) -> dict[str, Any]:
        """The public ``SessionInfo`` form of docs/control-api.md."""
        return {
            "session_id": self.session_id,
            "group_id": self.group_id,
            "task_id": self.task_id,
            "status": self.status,
            "reward": self.reward,
            "metrics": self.metrics,
            "error": self.error,
            "metadata": self.metadata,
            "sampling": self.sampling,
            "capture": self.capture,
            "created_at": self.created_at,
            "completed_at": self.completed_at,
            "num_calls": self.num_calls,
            "num_tokens": self.num_tokens,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SessionRecord:
        """Inverse of :meth:`to_dict` (unknown keys are ignored)."""
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in names})


@runtime_checkable
class Store(Protocol):
    """What the gateway needs of a store. Every method is safe to call concurrently."""

    async def create_session(self, record: SessionRecord) -> SessionRecord:
        """Persist a new session; raises :class:`SessionExists` when the id is taken."""
        ...

    async def get_session(self, session_id: str) -> SessionRecord | None:
        """The session's record, or None."""
        ...

    async def list_sessions(
        self,
        group_id: str | None = None,
        status: str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[SessionRecord]:
        """Sessions, oldest first, optionally filtered by group and/or status; ``offset`` and
        ``limit`` page through them."""
        ...

    async def delete_session(self, session_id: str) -> bool:
        """Remove a session and its calls; False when there was none."""
        ...

    async def append_call(self, call: ModelCall, *, request_key: str | None = None) -> ModelCall:
        """Store ``call`` durably; assigns ``index``, ``parent_call_id``, ``shared_prefix_len``.

        Also adds the call to the session's ``num_calls`` and its completion tokens to
        ``num_tokens``. Raises :class:`SessionNotFound` for an unknown session and
        :class:`SessionClosed` for a terminal one (nothing is stored then).

        Retries are matched in the same commit: with ``request_key`` (a digest of the request
        body as received, :func:`rollwire.store.codec.request_key`) a call with
        ``retry_count > 0`` gets ``retry_of`` = the latest earlier call of the session with that
        key, when it has none; a successful retry marks its original superseded (non-trainable),
        and an original that lands after its successful, unmatched retry is stored superseded.
        The call's ``retry_of``, ``trainable`` and ``flags`` say what was decided.
        """
        ...

    async def mark_superseded(self, session_id: str, call_id: str, by: str) -> None:
        """Mark an earlier call non-trainable because ``by`` retried it (agent-side retry)."""
        ...

    async def calls(self, session_id: str) -> list[ModelCall]:
        """The session's calls in index order, with full prompts and messages rebuilt."""
        ...

    async def complete(
        self,
        session_id: str,
        *,
        status: str = "completed",
        reward: float | None = None,
        metrics: dict[str, float] | None = None,
        error: str | None = None,
    ) -> tuple[SessionRecord, bool]:
        """Set the terminal outcome; returns ``(record, changed)``.

        Completing again with the same outcome is a no-op (``changed`` False); a different
        outcome raises :class:`CompletionConflict`.
        """
        ...

    async def get_setting(self, name: str) -> Any:
        """A setting shared by every gateway on this store (a JSON value), or None when unset
        or expired: the pause state, the policy version, sticky backends."""
        ...

    async def get_settings(self, names: Sequence[str]) -> dict[str, Any]:
        """The settings among ``names`` that are set (and unexpired), read at one instant:
        changes another gateway made meanwhile are seen together or not at all."""
        ...

    async def set_setting(self, name: str, value: Any, *, ttl: float | None = None) -> None:
        """Set a shared setting (``None`` removes it), optionally expiring after ``ttl`` s."""
        ...

    async def settings_with_prefix(self, prefix: str) -> dict[str, Any]:
        """Every unexpired setting whose name starts with ``prefix`` (the gateways' membership
        and acknowledgements of a weight sync's pause)."""
        ...

    async def ping(self) -> None:
        """Raise :class:`StoreUnavailable` when the store cannot be reached."""
        ...

    async def close(self) -> None:
        """Flush and release resources."""
        ...


def same_outcome(
    rec: SessionRecord,
    status: str,
    reward: float | None,
    metrics: dict[str, float] | None,
    error: str | None,
) -> bool:
    """True when a repeated completion matches the stored one (idempotent retry)."""
    return (
        rec.status == status
        and rec.reward == reward
        and (rec.metrics or {}) == (metrics or {})
        and (error is None or rec.error == error)
    )
