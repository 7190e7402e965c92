"""What one weight sync did, server by server (:class:`SyncReport`), and the error a failed sync
raises (:class:`WeightSyncError`): the records :mod:`rollwire.trainer.weight_sync` writes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["BackendSync", "SyncReport", "WeightSyncError", "failure_line"]


class WeightSyncError(RuntimeError):
    """A sync (or the start-up check) failed; :attr:`report` says what each server did."""

    def __init__(self, message: str, report: SyncReport) -> None:
        super().__init__(message)
        self.report = report


@dataclass
class BackendSync:
    """What one server did in one sync: pushed, probed, verified (or why not)."""

    name: str
    url: str
    kind: str
    pushed: bool = False
    verified: bool = False
    error: str | None = None
    push_seconds: float = 0.0
    #: of the push, the seconds the server spent loading (its reload or adapter-load route);
    #: the rest of ``push_seconds`` is getting the request there and back, labels, unloads
    load_seconds: float = 0.0
    probe_seconds: float = 0.0
    #: the largest |server log-prob - trainer log-prob| over the probe's tokens
    max_abs_diff: float | None = None
    #: the same before the push (``WeightSync(probe_before=True)``): what a missed sync carries
    before_max_abs_diff: float | None = None
    probe_ids: list[int] = field(default_factory=list)
    #: it was out of rotation as unverified when the sync began (an earlier sync failed on it,
    #: or was abandoned after pushing to it): this sync pushed to it again
    retried: bool = False
    #: failed syncs in a row for this server, this one included (0: verified)
    failures: int = 0
    #: this sync's failure was its ``max_failures``-th in a row: quarantined for good
    quarantined: bool = False


@dataclass
class SyncReport:
    """One sync: the version, each server's outcome and the time split."""

    version: str | None
    backends: list[BackendSync] = field(default_factory=list)
    #: ``full`` (a model folder reloaded) or ``adapter`` (a LoRA adapter loaded by name)
    kind: str = "full"
    #: the LoRA adapter name the servers serve the policy under (``<policy>@<version>``)
    adapter: str | None = None
    gateways: list[str] = field(default_factory=list)
    #: the sync's pause in the store (its lease is renewed while the sync runs)
    epoch: str | None = None
    #: the epoch of an earlier sync this one took over (its trainer died mid-sync)
    took_over: str | None = None
    #: the trainer writing what was pushed (the loop's export; 0 when not told)
    save_seconds: float = 0.0
    #: the pause, drained: every gateway acknowledged with no call in flight
    pause_seconds: float = 0.0
    #: the pushes, to every server at once
    push_seconds: float = 0.0
    verify_seconds: float = 0.0
    resume_seconds: float = 0.0
    #: the optional probe before the push (outside the pause)
    probe_before_seconds: float = 0.0
    resumed: bool = False

    @property
    def failed(self) -> list[BackendSync]:
        """The servers that were not verified (taken out of rotation)."""
        return [b for b in self.backends if not b.verified]

    @property
    def retried(self) -> list[BackendSync]:
        """The servers an earlier sync left out of rotation as unverified, pushed to again."""
        return [b for b in self.backends if b.retried]

    @property
    def quarantined(self) -> list[BackendSync]:
        """The servers this sync quarantined for good (``max_failures`` failed syncs in a row)."""
        return [b for b in self.backends if b.quarantined]

    @property
    def total_seconds(self) -> float:
        """Pause + push + verify + resume."""
        return self.pause_seconds + self.push_seconds + self.verify_seconds + self.resume_seconds

    @property
    def load_seconds(self) -> float:
        """The slowest server's load (its reload or adapter-load route)."""
        return max((b.load_seconds for b in self.backends), default=0.0)

    @property
    def transfer_seconds(self) -> float:
        """The push less the slowest load: getting the pushes there and back, labels, unloads."""
        return max(0.0, self.push_seconds - self.load_seconds)

    def summary(self) -> dict[str, Any]:
        """Numbers for a metrics sink: the stages (save, drain, transfer, load, verify), the
        time split of the sync itself (pause, push, verify, resume) and the servers' outcome."""
        out = {
            "sync/save_s": self.save_seconds,
            "sync/drain_s": self.pause_seconds,
            "sync/transfer_s": self.transfer_seconds,
            "sync/load_s": self.load_seconds,
            "sync/adapter": 1.0 if self.kind == "adapter" else 0.0,
            "sync/pause_s": self.pause_seconds,
            "sync/push_s": self.push_seconds,
            "sync/verify_s": self.verify_seconds,
            "sync/resume_s": self.resume_seconds,
            "sync/servers_verified": float(len(self.backends) - len(self.failed)),
            "sync/servers_failed": float(len(self.failed)),
            "sync/servers_retried": float(len(self.retried)),
            "sync/servers_quarantined": float(len(self.quarantined)),
            "sync/probe_max_abs_diff": max(
                (b.max_abs_diff for b in self.backends if b.max_abs_diff is not None),
                default=0.0,
            ),
        }
        before = [b.before_max_abs_diff for b in self.backends if b.before_max_abs_diff is not None]
        if before:
            out["sync/probe_before_max_abs_diff"] = max(before)
            out["sync/probe_before_s"] = self.probe_before_seconds
        return out


def failure_line(b: BackendSync, max_failures: int) -> str:
    """One line of a failed server for an error or a warning: what went wrong, what comes next."""
    if b.quarantined:
        fate = f"quarantined for good after {b.failures} failed syncs in a row"
    elif b.failures:
        fate = f"failure {b.failures} of {max_failures}, the next sync pushes to it again"
    else:
        fate = "out of rotation"
    return f"  {b.name} ({b.url}): {b.error} [{fate}]"
