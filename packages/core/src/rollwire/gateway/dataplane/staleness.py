"""Staleness admission: a rollout is not sampled more than ``max_staleness`` policy versions
behind the trainer (docs/design-notes.md, "Staleness bound").

Policy versions are opaque strings, so the gateway keeps an ordinal beside them: every new
version set (``set_policy_version``, the end of a weight sync) bumps the store-wide
``gateway:policy_seq``, or takes the ``seq`` the trainer gives. The trainer says where it is with
``POST /api/trainer_version {"seq": N}`` (``gateway:trainer_seq``); the lag is
``trainer_seq - policy_seq``. A session with ``max_staleness`` and ``on_stale="hold"`` whose first
call would be sampled more than that far behind waits (held, not refused, and not in flight, so a
sync's drain does not wait for it) until the servers catch up or its TTL passes. A call already
under way is never held: one that commits beyond the bound is flagged ``stale`` and not trained.
Every gateway on the store follows both ordinals like the pause.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from typing import TYPE_CHECKING, Any

from rollwire.data.protocol import ModelCall

if TYPE_CHECKING:
    from rollwire.gateway.dataplane.sessions import SessionState
    from rollwire.gateway.ports import GatewayPort
    from rollwire.store import SessionRecord

__all__ = [
    "ON_STALE",
    "POLICY_SEQ",
    "STALE_FLAG",
    "TRAINER_SEQ",
    "StalenessGate",
    "next_policy_seq",
]

log = logging.getLogger("rollwire.gateway")

#: store settings every gateway on the store shares
POLICY_SEQ = "gateway:policy_seq"  # int: the ordinal of the served policy version
TRAINER_SEQ = "gateway:trainer_seq"  # {"seq": int, "version": str | None}: where the trainer is
#: flag of a call sampled more than its session's ``max_staleness`` versions behind the trainer
STALE_FLAG = "stale"
#: what a session does when its first call would be stale: wait, or run and have calls flagged
ON_STALE = ("hold", "mark")
_HISTORY = 64  # ordinal changes remembered, to date a call by when it started


def next_policy_seq(current: int, old_version: str | None, new_version: str | None) -> int:
    """The ordinal a newly set version gets when the trainer gave none: one more for a new
    version, the same for the version already served."""
    return current if new_version == old_version else current + 1


def _seq(value: Any) -> int | None:
    return value if type(value) is int else None


class StalenessGate:
    """This gateway's view of the served and the trainer's ordinals, and the calls it holds."""

    def __init__(self, gw: GatewayPort) -> None:
        self.gw = gw
        self.policy_seq = 0
        self.trainer_seq: int | None = None
        self.trainer_version: str | None = None
        self.held = 0  # calls waiting here now
        # (wall time it took effect here, ordinal): what was served when a call started
        self._since: list[float] = [0.0]
        self._seqs: list[int] = [0]
        self._changed: asyncio.Event | None = None

    # ------------------------------------------------------------------ ordinals
    @property
    def lag(self) -> int:
        """How many versions the served policy is behind the trainer (0 when it never said)."""
        if self.trainer_seq is None:
            return 0
        return max(0, self.trainer_seq - self.policy_seq)

    def info(self) -> dict[str, Any]:
        """The JSON form ``/api/trainer_version`` returns."""
        return {
            "trainer_seq": self.trainer_seq,
            "trainer_version": self.trainer_version,
            "policy_seq": self.policy_seq,
            "policy_version": self.gw.policy_version,
            "lag": self.lag,
            "held": self.held,
        }

    def follow(self, policy_seq: Any, trainer: Any) -> None:
        """Take the ordinals read from the store (or just set here); wake held calls on a change."""
        seq = _seq(policy_seq)
        new_policy = self.policy_seq if seq is None else seq
        t = trainer if isinstance(trainer, dict) else {}
        new_trainer = _seq(t.get("seq"))
        version = t.get("version")
        self.trainer_version = version if isinstance(version, str) else None
        if new_policy == self.policy_seq and new_trainer == self.trainer_seq:
            return
        if new_policy != self.policy_seq:
            self._since.append(time.time())
            self._seqs.append(new_policy)
            if len(self._seqs) > _HISTORY:
                del self._since[0], self._seqs[0]
        self.policy_seq, self.trainer_seq = new_policy, new_trainer
        self.gw.metrics.policy_seq = new_policy
        self.gw.metrics.trainer_seq = new_trainer
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def seq_at(self, when: float) -> int:
        """The ordinal this gateway served at wall time ``when`` (the oldest one remembered for a
        time before it)."""
        i = bisect.bisect_right(self._since, when) - 1
        return self._seqs[max(0, i)]

    # ------------------------------------------------------------------ admission
    async def admit(self, st: SessionState) -> None:
        """Hold the first call of a ``hold`` session while it would be sampled beyond its bound,
        until the servers catch up or the session's TTL passes; return at once otherwise."""
        rec = st.record
        bound = rec.max_staleness
        if bound is None or rec.on_stale != "hold" or self.lag <= bound:
            return
        if rec.num_calls or st.in_flight or await self._started_elsewhere(rec):
            return  # a started rollout is never held mid-way
        metrics = self.gw.metrics
        metrics.stale_held += 1
        self.held += 1
        metrics.stale_waiting = self.held
        began = time.monotonic()
        try:
            while self.lag > bound:
                left = None if rec.expires_at is None else rec.expires_at - time.time()
                if left is not None and left <= 0:
                    metrics.stale_hold_expired += 1
                    return  # the budget check that follows answers "session expired"
                if self._changed is None:
                    self._changed = asyncio.Event()
                try:
                    await asyncio.wait_for(self._changed.wait(), left)
                except asyncio.TimeoutError:
                    continue
        finally:
            self.held -= 1
            metrics.stale_waiting = self.held
            metrics.stale_hold_seconds.observe(time.monotonic() - began)

    async def _started_elsewhere(self, rec: SessionRecord) -> bool:
        """Whether another gateway (or this one before a restart) committed a call of it: the
        record here may predate its first call."""
        try:
            fresh = await self.gw.store.get_session(rec.session_id)
        except Exception as exc:  # unknown: do not hold a rollout that may be under way
            log.debug("could not re-read session %r: %r", rec.session_id, exc)
            return True
        return fresh is not None and fresh.num_calls > 0

    def mark(self, rec: SessionRecord, call: ModelCall) -> None:
        """Flag ``call`` ``stale`` (and not trainable) when it was sampled more than its session's
        ``max_staleness`` versions behind where the trainer is now."""
        bound = rec.max_staleness
        if bound is None or self.trainer_seq is None or call.status != "ok":
            return
        if self.trainer_seq - self.seq_at(call.started_at) > bound:
            call.trainable = False
            call.off_policy = True
            if STALE_FLAG not in call.flags:
                call.flags.append(STALE_FLAG)
            self.gw.metrics.stale_marked += 1
