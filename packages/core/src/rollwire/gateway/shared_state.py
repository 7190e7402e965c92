"""What every gateway on one store shares, the pause state and the policy version (followed from
the store), and the pause / drain of this process's calls."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from rollwire.gateway.backends.pool import Backend, BackendPool
from rollwire.gateway.config import GatewayConfig
from rollwire.gateway.dataplane.staleness import (
    POLICY_SEQ,
    TRAINER_SEQ,
    StalenessGate,
    next_policy_seq,
)
from rollwire.gateway.sync_barrier import (
    EPOCH_SETTING,
    QUARANTINE_SETTING,
    UNVERIFIED_PREFIX,
    SyncBarrier,
)
from rollwire.store import Store

__all__ = ["SharedState"]

log = logging.getLogger("rollwire.gateway")

# Settings in the store that every gateway on it shares.
_PAUSED = "gateway:paused"
_POLICY_VERSION = "gateway:policy_version"
_QUARANTINE = QUARANTINE_SETTING  # + backend URL: why it is out of rotation
#: + backend URL: ``{"adapter", "adapters"}``, the LoRA adapters it holds and the one it serves
_ADAPTERS = "gateway:adapters:"
_FOLLOWED = (_PAUSED, EPOCH_SETTING, _POLICY_VERSION, POLICY_SEQ, TRAINER_SEQ)


class SharedState:
    """The pause / policy-version half of :class:`~rollwire.gateway.app.Gateway` (a mixin: it sets
    the fields)."""

    config: GatewayConfig
    store: Store
    pool: BackendPool
    barrier: SyncBarrier
    staleness: StalenessGate
    policy_version: str | None
    paused: bool
    in_flight: int
    _resumed: asyncio.Event | None
    _drained: asyncio.Event | None
    _shared_seen: tuple[bool, str | None]
    #: bumped before and after each shared setting this process writes: a read of the store that
    #: overlapped one may predate it and is not applied (the next tick reads again)
    _local_writes: int = 0

    async def load_shared_state(self) -> None:
        """Take the pause state, a weight sync's epoch, the policy version (and its ordinal), the
        trainer's ordinal and the backends out of rotation from the store (set by any gateway on
        it, and kept across restarts).

        Read in one snapshot (one store read, not one per setting: this runs every
        ``shared_state_interval``): a sync writes the ordinal, the version, then clears the epoch
        and the pause, so a gateway that reads "not paused" reads the new version and its ordinal.
        """
        writes = self._local_writes
        shared = await self.store.get_settings(_FOLLOWED)
        paused_setting = shared.get(_PAUSED)
        epoch = shared.get(EPOCH_SETTING)
        raw = shared.get(_POLICY_VERSION)
        policy_seq = shared.get(POLICY_SEQ)
        trainer = shared.get(TRAINER_SEQ)
        quarantined = await self.store.settings_with_prefix(_QUARANTINE)
        # after the pause: a gateway that reads a sync's end reads the adapters it loaded
        adapters = await self.store.settings_with_prefix(_ADAPTERS)
        if writes != self._local_writes:
            return
        paused = bool(paused_setting) or epoch is not None
        version = None if raw is None else str(raw)
        # Follow changes only (what this process set itself stays until someone changes it).
        last_paused, last_version = self._shared_seen
        if paused != last_paused and paused != self.paused:
            self.pause() if paused else self.resume()
        if version != last_version:
            self.policy_version = version
        self._shared_seen = (paused, version)
        # no await between the resume above and this: a call it lets through sees the ordinal
        self.staleness.follow(policy_seq, trainer)
        for backend in self.pool.backends.values():
            backend.quarantined = quarantined.get(_QUARANTINE + backend.url)
            held = adapters.get(_ADAPTERS + backend.url)
            held = held if isinstance(held, dict) else {}
            backend.adapter = held.get("adapter")
            backend.adapters = [a for a in held.get("adapters") or [] if isinstance(a, dict)]
        await self.barrier.follow(epoch)

    async def _follow_shared_state(self) -> None:
        while True:
            await asyncio.sleep(self.config.shared_state_interval)
            try:
                await self.load_shared_state()
            except Exception as exc:
                log.debug("could not read the shared gateway state: %r", exc)

    async def set_paused(self, paused: bool) -> None:
        """Pause or resume every gateway on this store (this one at once, the others within
        ``shared_state_interval``); kept across restarts."""
        self._local_writes += 1
        await self.store.set_setting(_PAUSED, True if paused else None)
        self._local_writes += 1
        self._shared_seen = (paused, self._shared_seen[1])
        self.pause() if paused else self.resume()

    async def set_sync_epoch(self, record: dict[str, Any] | None, ttl: float | None = None) -> None:
        """Write (None: clear) a weight sync's epoch for every gateway on this store, expiring
        after ``ttl`` seconds (its lease); while it stands every gateway counts as paused."""
        self._local_writes += 1
        await self.store.set_setting(EPOCH_SETTING, record, ttl=ttl)
        self._local_writes += 1
        if record is not None:
            self._shared_seen = (True, self._shared_seen[1])
            self.pause()

    async def set_policy_version(self, version: str | None, seq: int | None = None) -> None:
        """Set the policy version stamped on captured calls, for every gateway on this store,
        with its ordinal ``seq`` (default: one more than the last for a new version)."""
        self._local_writes += 1
        trainer = await self.store.get_setting(TRAINER_SEQ)
        if seq is None:
            current = await self.store.get_setting(POLICY_SEQ)
            old = await self.store.get_setting(_POLICY_VERSION)
            base = current if type(current) is int else self.staleness.policy_seq
            seq = next_policy_seq(base, None if old is None else str(old), version)
        # the ordinal before the version: a gateway reading the new version reads its ordinal
        await self.store.set_setting(POLICY_SEQ, seq)
        await self.store.set_setting(_POLICY_VERSION, version)
        self._local_writes += 1
        self._shared_seen = (self._shared_seen[0], version)
        self.policy_version = version
        self.staleness.follow(seq, trainer)

    async def set_trainer_seq(self, seq: int | None, version: str | None = None) -> None:
        """Say how far the trainer is (``seq``, in the policy versions' ordinal; None: it no
        longer says), for every gateway on this store: what staleness is measured against."""
        trainer = None if seq is None else {"seq": seq, "version": version}
        self._local_writes += 1
        await self.store.set_setting(TRAINER_SEQ, trainer)
        self._local_writes += 1
        self.staleness.follow(self.staleness.policy_seq, trainer)

    async def set_quarantine(self, backend: Backend, reason: str | None) -> None:
        """Take ``backend`` out of rotation (``reason``) or put it back (None), for every gateway
        on this store: health checks do not undo it."""
        self._local_writes += 1
        await self.store.set_setting(_QUARANTINE + backend.url, reason)
        self._local_writes += 1
        if reason is not None:
            # every push of a sync does this until the sync verifies it: not worth a warning
            level = logging.INFO if reason.startswith(UNVERIFIED_PREFIX) else logging.WARNING
            log.log(level, "backend %s (%s) out of rotation: %s", backend.name, backend.url, reason)
        backend.quarantined = reason

    async def set_adapters(
        self, backend: Backend, adapter: str | None, adapters: list[dict[str, Any]]
    ) -> None:
        """Record the LoRA adapters ``backend`` holds (``adapters``) and the one forwarded calls
        name (``adapter``; None: the base), for every gateway on this store (kept across
        restarts)."""
        record = {"adapter": adapter, "adapters": adapters}
        self._local_writes += 1
        backend.adapter, backend.adapters = adapter, adapters
        empty = adapter is None and not adapters
        await self.store.set_setting(_ADAPTERS + backend.url, None if empty else record)
        self._local_writes += 1

    # ------------------------------------------------------------------ pause / drain
    def pause(self) -> None:
        """Hold new data-plane calls until :meth:`resume`."""
        self.paused = True
        if self._resumed is not None:
            self._resumed.clear()

    def resume(self) -> None:
        """Let held and new calls through again."""
        self.paused = False
        if self._resumed is not None:
            self._resumed.set()

    async def drained(self, timeout: float | None = None) -> bool:
        """Wait until no call is in flight; False on timeout."""
        if self._drained is None or self.in_flight == 0:
            return True
        try:
            await asyncio.wait_for(self._drained.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True
