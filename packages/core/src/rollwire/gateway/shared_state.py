"""What every gateway on one store shares, the pause state and the policy version (followed from
the store), and the pause / drain of this process's calls."""

from __future__ import annotations

import asyncio
import logging

from rollwire.gateway.config import GatewayConfig
from rollwire.store import Store

__all__ = ["SharedState"]

log = logging.getLogger("rollwire.gateway")

# Settings in the store that every gateway on it shares.
_PAUSED = "gateway:paused"
_POLICY_VERSION = "gateway:policy_version"


class SharedState:
    """The pause / policy-version half of :class:`~rollwire.gateway.app.Gateway` (a mixin: it sets
    the fields)."""

    config: GatewayConfig
    store: Store
    policy_version: str | None
    paused: bool
    in_flight: int
    _resumed: asyncio.Event | None
    _drained: asyncio.Event | None
    _shared_seen: tuple[bool, str | None]

    async def load_shared_state(self) -> None:
        """Take the pause state and policy version from the store (set by any gateway on it,
        and kept across restarts)."""
        paused = bool(await self.store.get_setting(_PAUSED))
        raw = await self.store.get_setting(_POLICY_VERSION)
        version = None if raw is None else str(raw)
        # Follow changes only (what this process set itself stays until someone changes it).
        last_paused, last_version = self._shared_seen
        if paused != last_paused and paused != self.paused:
            self.pause() if paused else self.resume()
        if version != last_version:
            self.policy_version = version
        self._shared_seen = (paused, version)

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
        await self.store.set_setting(_PAUSED, True if paused else None)
        self._shared_seen = (paused, self._shared_seen[1])
        self.pause() if paused else self.resume()

    async def set_policy_version(self, version: str | None) -> None:
        """Set the policy version stamped on captured calls, for every gateway on this store."""
        await self.store.set_setting(_POLICY_VERSION, version)
        self._shared_seen = (self._shared_seen[0], version)
        self.policy_version = version

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
