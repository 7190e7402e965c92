"""The pause a weight sync needs: every gateway on the store acknowledges it, and has drained its
calls, before any weight is pushed (docs/weight-sync.md).

A person's pause (``POST /api/pause``) reaches the other gateways within
``shared_state_interval``; a weight push cannot start on that promise. Each gateway keeps a
membership record in the store (``gateway:member:<id>``, refreshed every interval, expiring when
the gateway is gone); a sync's pause carries an epoch, and each gateway writes the epoch into its
record once it is paused and (when asked) has no call in flight. The coordinator waits for every
live member's acknowledgement, or names the ones that did not answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from typing import Any

from rollwire.gateway.errors import GatewayError
from rollwire.gateway.ports import GatewayPort

__all__ = ["EPOCH_SETTING", "SyncBarrier"]

EPOCH_SETTING = "gateway:sync_epoch"
_MEMBER = "gateway:member:"


class SyncBarrier:
    """This gateway's part in a weight sync: membership, acknowledgement, coordination."""

    def __init__(self, gw: GatewayPort) -> None:
        self.gw = gw
        self.id = secrets.token_hex(6)
        self.acked: str | None = None
        self.epoch: str | None = None
        self._ack_task: asyncio.Task[None] | None = None

    @property
    def _ttl(self) -> float:
        return max(3.0, 6 * self.gw.config.shared_state_interval)

    async def heartbeat(self) -> None:
        """Refresh this gateway's membership record (with its acknowledgement)."""
        await self.gw.store.set_setting(
            _MEMBER + self.id,
            {"at": time.time(), "acked": self.acked, "in_flight": self.gw.in_flight},
            ttl=self._ttl,
        )

    async def follow(self, current: Any) -> None:
        """One tick of following the store, given the sync epoch setting it read (the gateway's
        shared-state loop counts a sync's epoch as a pause): acknowledge once drained."""
        epoch = current.get("epoch") if isinstance(current, dict) else None
        if epoch is not None and epoch != self.epoch:
            self.epoch = epoch
            drain = bool(current.get("drain", True))
            if self._ack_task is not None:
                self._ack_task.cancel()
            self._ack_task = asyncio.create_task(self._acknowledge(epoch, drain))
        elif epoch is None:
            self.epoch = None
        await self.heartbeat()

    async def _acknowledge(self, epoch: str, drain: bool) -> None:
        if drain:
            await self.gw.drained(None)
        if self.epoch == epoch:
            self.acked = epoch
            await self.heartbeat()

    async def begin(self, *, drain: bool, timeout: float) -> dict[str, Any]:
        """Pause every gateway on the store and wait for each one's acknowledgement."""
        epoch = secrets.token_hex(8)
        await self.gw.store.set_setting(EPOCH_SETTING, {"epoch": epoch, "drain": drain})
        await self.gw.set_paused(True)
        self.epoch = epoch
        deadline = time.monotonic() + timeout
        if drain and not await self.gw.drained(timeout):
            raise GatewayError(
                504,
                f"this gateway ({self.id}) still has {self.gw.in_flight} calls in flight after "
                f"{timeout:g} s; it stays paused",
                code="sync_pause_timeout",
            )
        self.acked = epoch
        await self.heartbeat()
        poll = min(0.05, self.gw.config.shared_state_interval)
        while True:
            members = await self.gw.store.settings_with_prefix(_MEMBER)
            late = {k[len(_MEMBER) :]: v for k, v in members.items() if v.get("acked") != epoch}
            if not late:
                return {
                    "paused": True,
                    "epoch": epoch,
                    "gateways": sorted(k[len(_MEMBER) :] for k in members),
                }
            if time.monotonic() > deadline:
                named = ", ".join(
                    f"{gid} (last seen {time.time() - float(v.get('at', 0)):.1f} s ago, "
                    f"{v.get('in_flight', '?')} calls in flight)"
                    for gid, v in sorted(late.items())
                )
                raise GatewayError(
                    504,
                    f"gateways did not acknowledge the sync's pause within {timeout:g} s: "
                    f"{named}; every gateway stays paused (POST /api/sync/end to resume)",
                    code="sync_pause_timeout",
                )
            await asyncio.sleep(poll)

    async def end(self, version: str | None, seq: int | None = None) -> dict[str, Any]:
        """Set the policy version (with its ordinal ``seq``, default one more), then resume every
        gateway (in that order, so a gateway that sees the resume has the new version already)."""
        if version is not None:
            await self.gw.set_policy_version(version, seq)
        await self.gw.store.set_setting(EPOCH_SETTING, None)
        self.epoch = None
        await self.gw.set_paused(False)
        return {
            "paused": False,
            "policy_version": self.gw.policy_version,
            "policy_seq": self.gw.staleness.policy_seq,
        }

    async def close(self) -> None:
        """Leave the membership (a stopped gateway is not waited for)."""
        if self._ack_task is not None:
            self._ack_task.cancel()
        with contextlib.suppress(Exception):
            await self.gw.store.set_setting(_MEMBER + self.id, None)
