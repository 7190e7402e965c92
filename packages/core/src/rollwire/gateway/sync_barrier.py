"""The pause a weight sync needs: every gateway on the store acknowledges it, and has drained its
calls, before any weight is pushed (docs/weight-sync.md).

A person's pause (``POST /api/pause``) reaches the other gateways within
``shared_state_interval``; a weight push cannot start on that promise. Each gateway keeps a
membership record in the store (``gateway:member:<id>``, refreshed every interval, expiring when
the gateway is gone); a sync's pause carries an epoch, and each gateway writes the epoch into its
record once it is paused and (when asked) has no call in flight. The coordinator waits for every
live member's acknowledgement, or names the ones that did not answer.

The epoch is a lease: it expires in the store unless the trainer renews it, so a trainer that dies
mid-sync cannot leave the gateways paused for good, and the next sync's begin takes it over. A
server the sync pushed to is out of rotation until the sync ends with a version (it holds weights
nobody has verified yet), so a lapsed or abandoned sync leaves it out, said why.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from typing import TYPE_CHECKING, Any

from rollwire.gateway.errors import GatewayError

if TYPE_CHECKING:
    from rollwire.gateway.backends.pool import Backend
    from rollwire.gateway.ports import GatewayPort

__all__ = ["EPOCH_SETTING", "QUARANTINE_SETTING", "UNVERIFIED_PREFIX", "SyncBarrier"]

EPOCH_SETTING = "gateway:sync_epoch"
#: + backend URL: why the backend is out of rotation (every gateway on the store reads it)
QUARANTINE_SETTING = "gateway:quarantine:"
#: how the reason of a backend a sync pushed to, and has not verified, begins (WeightSync pushes
#: to such a backend again; any other reason needs a person)
UNVERIFIED_PREFIX = "unverified: "
_MEMBER = "gateway:member:"
#: at most this many session ids with calls in flight are named per gateway (a drain's 504)
_NAMED = 20


def _stamp(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


def _waited(epoch: str, timeout: float, lease: float, gateways: list[Any]) -> dict[str, Any]:
    """The ``details`` of a pause that timed out: what it waited for, on which gateway."""
    return {"epoch": epoch, "waited_s": timeout, "lease": lease, "gateways": gateways}


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
        """Refresh this gateway's membership record (with its acknowledgement, and during a sync
        the sessions whose calls it is draining, for a coordinator that waits too long)."""
        record: dict[str, Any] = {"at": time.time(), "acked": self.acked}
        record["in_flight"] = self.gw.in_flight
        if self.epoch is not None and self.acked != self.epoch:
            record["sessions"] = self.in_flight_sessions()
        await self.gw.store.set_setting(_MEMBER + self.id, record, ttl=self._ttl)

    def in_flight_sessions(self) -> list[str]:
        """The sessions with a call in flight on this gateway (the first :data:`_NAMED` of
        them): what a drain waits for."""
        named: list[str] = []
        for sid, st in self.gw.sessions.items():
            if st.in_flight:
                named.append(sid)
                if len(named) == _NAMED:
                    break
        return named

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

    # ------------------------------------------------------------------ the epoch and its lease
    async def current(self) -> dict[str, Any] | None:
        """The sync epoch standing in the store (None: no sync, or its lease lapsed)."""
        value = await self.gw.store.get_setting(EPOCH_SETTING)
        return value if isinstance(value, dict) and value.get("epoch") else None

    async def check(self, epoch: str) -> dict[str, Any]:
        """The standing epoch record if it is ``epoch``; a 409 saying what happened otherwise."""
        record = await self.current()
        if record is not None and record["epoch"] == epoch:
            return record
        if record is None:
            what = (
                "no sync is running: its lease lapsed (the trainer stopped renewing it) or it "
                "was ended (POST /api/sync/end or /api/resume)"
            )
        else:
            what = (
                f"sync {record['epoch']} took it over (begun {_stamp(record.get('began_at', 0))}"
                f" through gateway {record.get('by')})"
            )
        raise GatewayError(
            409,
            f"the weight sync's pause {epoch} is over: {what}; nothing of it may be stamped now — "
            "start a new sync (WeightSync.sync pushes and verifies every server again)",
            code="sync_epoch_over",
        )

    async def _write(self, record: dict[str, Any]) -> None:
        await self.gw.set_sync_epoch(record, ttl=float(record["lease"]))

    async def renew(self, epoch: str, lease: float) -> dict[str, Any]:
        """Extend the lease of ``epoch`` by ``lease`` seconds from now (409 once it is over)."""
        record = dict(await self.check(epoch))
        record["lease"] = lease
        record["renewed_at"] = time.time()
        await self._write(record)
        return {"epoch": epoch, "lease": lease}

    # ------------------------------------------------------------------ begin / push / end
    async def begin(self, *, drain: bool, timeout: float, lease: float = 60.0) -> dict[str, Any]:
        """Pause every gateway on the store and wait for each one's acknowledgement; an epoch
        still standing (a trainer that died mid-sync) is taken over."""
        previous = await self.current()
        epoch = secrets.token_hex(8)
        record = {"epoch": epoch, "drain": drain, "lease": lease, "began_at": time.time()}
        record["by"] = self.id
        await self._write(record)
        self.epoch = epoch
        deadline = time.monotonic() + timeout
        renew_at = time.monotonic() + lease / 3
        if drain:
            while not await self.gw.drained(max(0.0, min(deadline, renew_at) - time.monotonic())):
                if time.monotonic() >= deadline:
                    sessions = self.in_flight_sessions()
                    waited = {"id": self.id, "in_flight": self.gw.in_flight, "sessions": sessions}
                    raise GatewayError(
                        504,
                        f"this gateway ({self.id}) still has {self.gw.in_flight} calls in flight "
                        f"after {timeout:g} s (sessions: {', '.join(sessions) or 'none named'}); "
                        f"every gateway stays paused until the sync's lease lapses ({lease:g} s), "
                        "POST /api/sync/end or POST /api/resume",
                        code="sync_pause_timeout",
                        details=_waited(epoch, timeout, lease, [waited]),
                    )
                await self.renew(epoch, lease)  # our own wait must not outlast the lease
                renew_at = time.monotonic() + lease / 3
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
                    "lease": lease,
                    "took_over": previous,
                    "gateways": sorted(k[len(_MEMBER) :] for k in members),
                }
            if time.monotonic() > deadline:
                now = time.time()
                waited_for = [
                    {
                        "id": gid,
                        "last_seen_s": round(now - float(v.get("at", 0)), 3),
                        "in_flight": v.get("in_flight"),
                        "sessions": list(v.get("sessions") or []),
                    }
                    for gid, v in sorted(late.items())
                ]
                raise GatewayError(
                    504,
                    self._late(late, timeout, lease),
                    code="sync_pause_timeout",
                    details=_waited(epoch, timeout, lease, waited_for),
                )
            if time.monotonic() >= renew_at:
                await self.renew(epoch, lease)
                renew_at = time.monotonic() + lease / 3
            await asyncio.sleep(poll)

    @staticmethod
    def _late(late: dict[str, Any], timeout: float, lease: float) -> str:
        named = ", ".join(
            f"{gid} (last seen {time.time() - float(v.get('at', 0)):.1f} s ago, "
            f"{v.get('in_flight', '?')} calls in flight"
            + (f": sessions {', '.join(v['sessions'])}" if v.get("sessions") else "")
            + ")"
            for gid, v in sorted(late.items())
        )
        return (
            f"gateways did not acknowledge the sync's pause within {timeout:g} s: {named}; "
            f"every gateway stays paused until the sync's lease lapses ({lease:g} s), "
            "POST /api/sync/end or POST /api/resume"
        )

    async def pushing(
        self, backend: Backend, *, epoch: str | None, version: str, weights_path: str
    ) -> None:
        """Before weights go to ``backend``: inside a sync, take it out of rotation until the
        sync ends with a version (if the sync is abandoned it stays out, saying so)."""
        record = await (self.check(epoch) if epoch is not None else self.current())
        if record is None:
            return  # a push outside any sync: the caller labels and verifies it itself
        reason = (
            f"{UNVERIFIED_PREFIX}weight sync {record['epoch']} pushed version {version!r} "
            f"({weights_path}) at {_stamp(time.time())} and has not verified it; if that sync "
            "was abandoned (its trainer stopped or the gateway it used died), run "
            f"WeightSync.sync again, which pushes to and verifies this server, or DELETE "
            f"/api/backends/{backend.name}/quarantine once you know what it serves"
        )
        await self.gw.set_quarantine(backend, reason)

    async def _release_verified(self, epoch: str) -> list[str]:
        """Back into rotation: every backend this epoch pushed to whose reason is still the
        push's (a server that failed verification was given another reason by the trainer)."""
        mark = f"{UNVERIFIED_PREFIX}weight sync {epoch} "
        reasons = await self.gw.store.settings_with_prefix(QUARANTINE_SETTING)
        released = []
        for backend in self.gw.pool.backends.values():
            reason = reasons.get(QUARANTINE_SETTING + backend.url)
            if isinstance(reason, str) and reason.startswith(mark):
                await self.gw.set_quarantine(backend, None)
                released.append(backend.name)
        return released

    async def end(
        self, version: str | None, seq: int | None = None, *, epoch: str | None = None
    ) -> dict[str, Any]:
        """Set the policy version (with its ordinal ``seq``, default one more), put the servers
        this sync verified back in rotation, then resume every gateway (in that order, so a
        gateway that sees the resume has the new version already). With ``epoch``, a sync that
        is over (lapsed, taken over) is a 409 and nothing changes."""
        record = await (self.check(epoch) if epoch is not None else self.current())
        released: list[str] = []
        if version is not None:
            await self.gw.set_policy_version(version, seq)
            if record is not None:
                released = await self._release_verified(str(record["epoch"]))
        await self.gw.set_sync_epoch(None)
        self.epoch = None
        await self.gw.set_paused(False)
        return {
            "paused": False,
            "policy_version": self.gw.policy_version,
            "policy_seq": self.gw.staleness.policy_seq,
            "released": released,
        }

    async def close(self) -> None:
        """Leave the membership (a stopped gateway is not waited for)."""
        if self._ack_task is not None:
            self._ack_task.cancel()
        with contextlib.suppress(Exception):
            await self.gw.store.set_setting(_MEMBER + self.id, None)
