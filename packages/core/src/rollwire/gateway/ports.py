"""What the gateway's modules need from the gateway, as a protocol (no import of ``app``).

The data-plane handlers, the commit path, the stream relay, the control plane and the tokens
handler all take a :class:`GatewayPort`; :class:`~rollwire.gateway.app.Gateway` is the one
implementation. Keeping the dependency on this protocol lets ``app`` import them without cycles.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import aiohttp

    from rollwire.gateway.backends.pool import Backend, BackendPool
    from rollwire.gateway.backends.upstream import UpstreamPool
    from rollwire.gateway.config import GatewayConfig
    from rollwire.gateway.dataplane.sessions import SessionState
    from rollwire.gateway.dataplane.staleness import StalenessGate
    from rollwire.gateway.metrics import GatewayMetrics
    from rollwire.gateway.security import TokenSigner
    from rollwire.gateway.sync_barrier import SyncBarrier
    from rollwire.store import SessionRecord, Store

__all__ = ["GatewayPort"]


class GatewayPort(Protocol):
    """The gateway's state and services, as its modules see them."""

    config: GatewayConfig
    store: Store
    pool: BackendPool
    metrics: GatewayMetrics
    upstream: UpstreamPool
    signer: TokenSigner
    admin_key: str | None
    policy_version: str | None
    paused: bool
    in_flight: int
    sessions: OrderedDict[str, SessionState]
    closing: set[str]
    waiters: dict[str, asyncio.Event]
    waiter_counts: dict[str, int]
    barrier: SyncBarrier
    staleness: StalenessGate

    @property
    def http(self) -> aiohttp.ClientSession:
        """The pooled upstream HTTP client (exists between start-up and shutdown)."""
        ...

    @property
    def started(self) -> bool:
        """True between start-up and shutdown (while :attr:`http` exists)."""
        ...

    def new_call_id(self) -> str:
        """A fresh call id."""
        ...

    def apply_sampling(
        self, rec: SessionRecord, body: dict[str, Any]
    ) -> tuple[dict[str, Any], list[str]]:
        """The session's sampling policy applied to ``body`` in place; (effective, flags)."""
        ...

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` in the background; shutdown waits for it."""
        ...

    async def expire(self, rec: SessionRecord) -> SessionRecord:
        """Give a running session past its TTL the status ``timeout``."""
        ...

    def issue_token(self, rec: SessionRecord) -> str:
        """A signed data-plane token for the session."""
        ...

    def check_incarnation(self, rec: SessionRecord, incarnation: str | None) -> None:
        """Refuse (401) a token issued for an earlier session that had this id."""
        ...

    def session_finished(self, rec: SessionRecord) -> None:
        """Called when a session became terminal."""
        ...

    async def set_paused(self, paused: bool) -> None:
        """Pause or resume every gateway on the store."""
        ...

    async def set_sync_epoch(self, record: dict[str, Any] | None, ttl: float | None = None) -> None:
        """Write (None: clear) a weight sync's epoch, which pauses every gateway while it stands."""
        ...

    async def set_policy_version(self, version: str | None, seq: int | None = None) -> None:
        """Set the policy version (and its ordinal) for every gateway on the store."""
        ...

    async def set_trainer_seq(self, seq: int | None, version: str | None = None) -> None:
        """Say how far the trainer is, for every gateway on the store."""
        ...

    async def set_quarantine(self, backend: Backend, reason: str | None) -> None:
        """Take a backend out of rotation (or back in) for every gateway on the store."""
        ...

    async def set_adapters(
        self, backend: Backend, adapter: str | None, adapters: list[dict[str, Any]]
    ) -> None:
        """Record the LoRA adapters ``backend`` holds and serves, for every gateway on the store."""
        ...

    def pause(self) -> None:
        """Hold new data-plane calls."""
        ...

    def resume(self) -> None:
        """Let held and new calls through again."""
        ...

    async def drained(self, timeout: float | None = None) -> bool:
        """Wait until no call is in flight; False on timeout."""
        ...
