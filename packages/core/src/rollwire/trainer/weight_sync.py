"""Weight sync: push a new policy into every inference server behind the gateway, verify that
each one really serves it, then stamp the new version (docs/weight-sync.md).

One :meth:`WeightSync.sync` call is the whole step, through the gateway's control plane (the
trainer needs no server's address): pause every gateway on the store and drain their calls,
push by each backend's transport, probe every server with a short greedy request and compare its
log-probs with the trainer's own model, take a server that disagrees out of rotation, set the
policy version, resume. A server is never stamped with a version it was not verified on.

A server whose push or probe failed stays out of rotation as *unverified*, and the next sync
pushes to it again; after ``max_failures`` failed syncs in a row it is quarantined for good (a
person puts it back). A sync succeeds when at least one server was verified.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from rollwire.trainer.gateway_client import GatewayAPIError, GatewayClient, server_weights_path
from rollwire.trainer.sync_report import BackendSync, SyncReport, WeightSyncError, failure_line

__all__ = [
    "DEFAULT_PROBE_IDS",
    "BackendSync",
    "Reference",
    "SyncReport",
    "WeightSync",
    "WeightSyncError",
]

#: scores ``completion_ids`` after ``prompt_ids`` with the trainer's model: one log-prob per
#: completion token (what the server's probe answer is compared with)
Reference = Callable[[Sequence[int], Sequence[int]], Sequence[float]]

#: a short fixed prompt for models whose tokenizer the sync does not know (ids below 200 exist
#: in every vocabulary rollwire serves); a trainer with a tokenizer passes its own
DEFAULT_PROBE_IDS: tuple[int, ...] = (17, 42, 99, 7, 64, 120, 33, 5)

#: backend kinds that have a weight transport (``openai`` is a hosted API: nothing to push)
SYNC_KINDS = ("vllm", "sglang", "tinker")

#: how the gateway begins the out-of-rotation reason of a server a sync pushed to and did not
#: verify (``rollwire.gateway.sync_barrier.UNVERIFIED_PREFIX``): the next sync pushes to it again
UNVERIFIED_PREFIX = "unverified: "

log = logging.getLogger("rollwire.weight_sync")


class WeightSync:
    """Pushes weights to every server the gateway routes to and verifies them.

    ``reference`` scores the probe's tokens with the trainer's model (``None`` with
    ``verify=False`` only: then a server that answers the probe counts as verified).
    ``tolerance`` bounds the largest per-token log-prob difference a verified server may show.
    ``mode="keep"`` lets calls in flight continue across the push (vLLM ``pause?mode=keep``;
    their tokens carry two versions) instead of draining them first (``pause_timeout`` bounds
    the drain). The pause is a ``lease`` (seconds) the sync renews while it runs: if this
    process dies, the gateways resume by themselves after it, with the servers it pushed to out
    of rotation. A server that fails ``max_failures`` syncs in a row is quarantined for good;
    until then each sync pushes to it again.
    """

    def __init__(
        self,
        gateway: GatewayClient | str,
        *,
        admin_key: str | None = None,
        reference: Reference | None = None,
        probe_ids: Sequence[int] = DEFAULT_PROBE_IDS,
        probe_tokens: int = 4,
        tolerance: float = 1e-3,
        verify: bool = True,
        mode: str = "drain",
        pause_timeout: float = 120.0,
        push_timeout: float = 600.0,
        lease: float = 60.0,
        max_failures: int = 3,
    ) -> None:
        if mode not in ("drain", "keep"):
            raise ValueError(f"mode must be 'drain' or 'keep', got {mode!r}")
        if max_failures < 1:
            raise ValueError(f"max_failures must be at least 1, got {max_failures!r}")
        if verify and reference is None:
            raise ValueError(
                "WeightSync needs a reference (the trainer's model scoring the probe's tokens, "
                "e.g. rollwire.trainer.references.engine_reference(folder)) to verify servers; "
                "pass verify=False to trust the reload unchecked"
            )
        if probe_tokens < 1 or not probe_ids:
            raise ValueError("the probe needs at least one prompt id and one token")
        self.gateway = GatewayClient(gateway, admin_key) if isinstance(gateway, str) else gateway
        self.reference = reference
        self.probe_ids = [int(t) for t in probe_ids]
        self.probe_tokens = probe_tokens
        self.tolerance = tolerance
        self.verify = verify
        self.mode = mode
        self.pause_timeout = pause_timeout
        self.push_timeout = push_timeout
        self.lease = lease
        self.max_failures = max_failures
        self.history: list[SyncReport] = []
        #: failed syncs in a row, per backend name (a verified sync forgets it)
        self.failures: dict[str, int] = {}

    # ------------------------------------------------------------------ public
    def backends(self) -> list[dict[str, Any]]:
        """The servers a sync pushes to (every one in rotation, and those an abandoned sync left
        out as unverified); a kind that cannot take weights is an error here, before any step."""
        found = [b for b in self._listed() if _unverified(b) or not b.get("quarantined")]
        if not found:
            raise ValueError(
                f"the gateway at {self.gateway.url} routes to no server in rotation: add one "
                "(POST /api/backends) before syncing weights"
            )
        bad = [b for b in found if b["kind"] not in SYNC_KINDS]
        if bad:
            names = ", ".join(f"{b['name']} ({b['kind']}, {b['url']})" for b in bad)
            raise ValueError(
                f"cannot push weights to {names}: only {SYNC_KINDS} backends take weights; "
                "remove them from the gateway or let their own trainer update them"
            )
        return found

    def _listed(self) -> list[dict[str, Any]]:
        try:
            return self.gateway.backends()
        except httpx.TransportError as exc:
            raise WeightSyncError(
                f"the gateway at {self.gateway.url} does not answer ({type(exc).__name__}: "
                f"{exc}): nothing was paused or pushed; start it (or point WeightSync at another "
                "gateway on the same store) and try again",
                SyncReport(version=None),
            ) from exc

    def check(self, reference: Reference | None = None) -> SyncReport:
        """The start-up probe: every server against the trainer's model before step 1 (a
        tokenizer, dtype or template mismatch is caught here). Raises on a mismatch."""
        report = SyncReport(version=None)
        t0 = time.perf_counter()
        for b in [b for b in self.backends() if not b.get("quarantined")]:
            entry = BackendSync(name=b["name"], url=b["url"], kind=b["kind"], pushed=True)
            report.backends.append(entry)
            try:
                self._verify(entry, reference or self.reference)
                if not entry.verified:  # at start-up, a set-up error: out until a person fixes it
                    self._quarantine(entry, entry.error or "the start-up check failed")
            except httpx.TransportError as exc:
                raise self._gateway_gone(report, "start-up check", exc) from exc
        report.verify_seconds = time.perf_counter() - t0
        report.resumed = True
        self._fail_if_any(report, "start-up check")
        return report

    def sync(
        self,
        weights_path: str | Path,
        version: str,
        *,
        reference: Reference | None = None,
        seq: int | None = None,
    ) -> SyncReport:
        """Push ``weights_path`` (a Hugging Face folder every server can read; a relative one is
        sent absolute), verify, stamp ``version`` (with ordinal ``seq``, e.g. the trainer's step;
        default: one more than the last, which ``max_staleness`` counts in) on the servers
        verified. A server that failed is left out of rotation (logged, and in the report); raises
        :class:`WeightSyncError` when no server was verified, or the gateway stopped answering."""
        targets = self.backends()
        path = server_weights_path(weights_path)
        report = SyncReport(version=str(version))
        self.history.append(report)
        t0 = time.perf_counter()
        self._begin(report)
        t1 = time.perf_counter()
        report.pause_seconds = t1 - t0
        lease = _LeaseKeeper(self.gateway, str(report.epoch), self.lease)
        lease.start()
        step = "push"
        try:
            for b in targets:
                entry = BackendSync(
                    name=b["name"], url=b["url"], kind=b["kind"], retried=_unverified(b)
                )
                report.backends.append(entry)
                self._push(entry, path, str(version), str(report.epoch))
            t2 = time.perf_counter()
            report.push_seconds = t2 - t1
            step = "verification"
            for entry in report.backends:
                if entry.pushed:
                    self._verify(entry, reference or self.reference)
            t3 = time.perf_counter()
            report.verify_seconds = t3 - t2
            step = "end (stamping the version and resuming)"
            if lease.lost is not None:
                raise _EpochOver(lease.lost)
            for entry in report.backends:
                self._count(entry, report)
            if any(e.verified for e in report.backends):
                self._end(report, seq)
            report.resume_seconds = time.perf_counter() - t3
        except httpx.TransportError as exc:
            # the gateway died or is cut off: the pause stays in the store until its lease
            # lapses, so nothing is served under a label whose weights were not verified
            raise self._gateway_gone(report, f"sync to {version!r}", exc, step) from exc
        except _EpochOver as exc:
            raise WeightSyncError(
                f"sync to {version!r}: this sync's pause ended before the {step} was done: "
                f"{exc}. Nothing was stamped; the servers it pushed to are out of rotation as "
                "unverified. Call sync() again (a lease shorter than a push is renewed in the "
                "background; a takeover means another trainer is syncing the same gateways)",
                report,
            ) from exc
        finally:
            lease.stop()
        self._fail_if_none(report, f"sync to {version!r}")
        return report

    def _begin(self, report: SyncReport) -> None:
        try:
            began = self.gateway.sync_begin(
                drain=self.mode == "drain", timeout=self.pause_timeout, lease=self.lease
            )
        except httpx.TransportError as exc:
            raise self._gateway_gone(report, f"sync to {report.version!r}", exc, "pause") from exc
        except GatewayAPIError as exc:
            if exc.code == "sync_pause_timeout":
                raise self._pause_timed_out(report, exc) from exc
            raise
        report.epoch = str(began["epoch"])
        took_over = began.get("took_over")
        report.took_over = took_over.get("epoch") if isinstance(took_over, dict) else None
        report.gateways = list(began.get("gateways", []))

    def _end(self, report: SyncReport, seq: int | None) -> None:
        try:
            self.gateway.sync_end(version=report.version, seq=seq, epoch=report.epoch)
        except GatewayAPIError as exc:
            if exc.code == "sync_epoch_over":
                raise _EpochOver(exc.message) from exc
            raise
        report.resumed = True

    def _pause_timed_out(self, report: SyncReport, exc: GatewayAPIError) -> WeightSyncError:
        """The 504 of a pause that waited ``pause_timeout`` in vain, as a WeightSyncError that
        says what it waited for; the pause is ended at once (nothing was pushed yet)."""
        details = exc.details or {}
        waited = details.get("waited_s", self.pause_timeout)
        report.epoch = details.get("epoch")
        lines = []
        for g in details.get("gateways") or []:
            seen = g.get("last_seen_s")
            line = f"  gateway {g.get('id')}: {g.get('in_flight', '?')} calls in flight"
            if g.get("sessions"):
                line += f" (sessions {', '.join(str(s) for s in g['sessions'])})"
            if seen is not None:
                line += f", last seen {float(seen):.1f} s ago"
            lines.append(line)
        state = "every gateway stays paused (calls wait) until the sync's lease lapses"
        if report.epoch is not None:
            try:
                self.gateway.sync_end(version=None, epoch=report.epoch)
                report.resumed = True
                state = "the gateways were resumed on the old weights, under the old version"
            except (GatewayAPIError, httpx.TransportError) as end_exc:
                state += f" ({self.lease:g} s; ending it failed: {end_exc})"
        waited_for = (
            "It waited for:\n" + "\n".join(lines) if lines else f"The gateway said: {exc.message}"
        )
        return WeightSyncError(
            f"sync to {report.version!r}: the pause waited {float(waited):g} s (pause_timeout) "
            "and not every gateway had drained its calls and acknowledged it; nothing was pushed "
            f"or stamped, and {state}. Give the calls in flight longer "
            "(WeightSync(pause_timeout=...) above your longest model call), or sync with "
            "WeightSync(mode='keep'), which lets calls in flight go on across the push (their "
            "tokens labelled per version); a gateway last seen long ago has stopped heartbeating "
            f"and is dropped once its record expires. {waited_for}",
            report,
        )

    def _gateway_gone(
        self, report: SyncReport, what: str, exc: Exception, step: str = "verification"
    ) -> WeightSyncError:
        url = self.gateway.url
        cause = f"{type(exc).__name__}: {exc}"
        if report.epoch is None:
            state = "nothing was pushed and no version stamped"
        else:
            state = (
                f"nothing was stamped; every gateway on its store stays paused (calls wait) until "
                f"this sync's lease lapses ({self.lease:g} s) or a new sync takes the pause over, "
                "and the servers it pushed to stay out of rotation as unverified until a sync "
                "verifies them"
            )
        return WeightSyncError(
            f"{what}: the gateway at {url} stopped answering during the {step} ({cause}); "
            f"{state}. Restart that gateway, or point WeightSync at another gateway on the same "
            "store, and call sync() again: it pushes to and verifies every server again",
            report,
        )

    # ------------------------------------------------------------------ steps
    def _push(self, entry: BackendSync, weights_path: str, version: str, epoch: str) -> None:
        t0 = time.perf_counter()
        try:
            self.gateway.push_weights(
                entry.name,
                weights_path=weights_path,
                version=version,
                keep=self.mode == "keep",
                timeout=self.push_timeout,
                epoch=epoch,
            )
            entry.pushed = True
        except GatewayAPIError as exc:
            if exc.code == "sync_epoch_over":
                raise _EpochOver(exc.message) from exc
            # the server's state is unknown now: out of rotation (the gateway took it out before
            # the push; _count gives it the failure's reason before the sync ends)
            entry.error = f"push failed: {exc}"
        entry.push_seconds = time.perf_counter() - t0

    def _verify(self, entry: BackendSync, reference: Reference | None) -> None:
        t0 = time.perf_counter()
        try:
            answer = self.gateway.probe_backend(
                entry.name, prompt_ids=self.probe_ids, max_tokens=self.probe_tokens
            )
        except GatewayAPIError as exc:
            entry.error = f"probe failed: {exc}"
            entry.probe_seconds = time.perf_counter() - t0
            return
        ids = [int(t) for t in answer["completion_ids"]]
        served = [float(x) for x in answer["logprobs"]]
        entry.probe_ids = ids
        if reference is not None and self.verify:
            expected = [float(x) for x in reference(self.probe_ids, ids)]
            if len(expected) != len(served):
                entry.error = (
                    f"the reference scored {len(expected)} tokens for a probe of {len(served)}"
                )
                entry.probe_seconds = time.perf_counter() - t0
                return
            diffs = [abs(a - b) for a, b in zip(served, expected, strict=True)]
            entry.max_abs_diff = max(diffs) if diffs else 0.0
            if not all(math.isfinite(d) for d in diffs) or entry.max_abs_diff > self.tolerance:
                entry.error = (
                    f"the server's log-probs differ from the trainer's model by up to "
                    f"{entry.max_abs_diff:.3g} (tolerance {self.tolerance:g}) on the probe "
                    f"{self.probe_ids} -> {ids}: served {_fmt(served)}, trainer {_fmt(expected)}"
                )
                entry.probe_seconds = time.perf_counter() - t0
                return
        entry.verified = True
        entry.probe_seconds = time.perf_counter() - t0

    def _count(self, entry: BackendSync, report: SyncReport) -> None:
        """Count this sync's outcome for ``entry``'s server: verified forgets its failures; a
        failure leaves it out of rotation as unverified (the next sync pushes to it again), or,
        at ``max_failures`` in a row, quarantined for good."""
        if entry.verified:
            self.failures.pop(entry.name, None)
            return
        entry.failures = self.failures.get(entry.name, 0) + 1
        self.failures[entry.name] = entry.failures
        error = entry.error or "weight sync failed"
        if entry.failures >= self.max_failures:
            entry.quarantined = True
            reason = (
                f"quarantined: {entry.failures} weight syncs in a row failed on this server "
                f"(WeightSync max_failures={self.max_failures}), the last to version "
                f"{report.version!r}: {error}. Fix it, then DELETE "
                f"/api/backends/{entry.name}/quarantine: it serves what it holds until the next "
                "sync pushes to it"
            )
            log.error("backend %s (%s) quarantined for good: %s", entry.name, entry.url, reason)
        else:
            # a reason the gateway's release at the sync's end does not match (it looks for
            # "unverified: weight sync <epoch> "), and WeightSync.backends() retries
            reason = (
                f"{UNVERIFIED_PREFIX}failed weight sync to version {report.version!r} "
                f"({entry.failures} of {self.max_failures} in a row before it is quarantined "
                f"for good): {error}. The next WeightSync.sync pushes to it again"
            )
        self._quarantine(entry, reason)

    def _quarantine(self, entry: BackendSync, reason: str) -> None:
        try:
            self.gateway.quarantine_backend(entry.name, reason=reason)
        except GatewayAPIError as exc:
            entry.error = f"{entry.error}; taking it out of rotation failed too: {exc}"

    def _fail_if_none(self, report: SyncReport, what: str) -> None:
        """Raise when no server was verified; otherwise warn of each one that failed (the sync
        goes on, on the verified servers)."""
        if not report.failed:
            return
        if report.resumed:
            log.warning(
                "%s: %d of %d servers failed and are out of rotation; the gateway resumed on "
                "the verified servers:\n%s",
                what,
                len(report.failed),
                len(report.backends),
                "\n".join(failure_line(b, self.max_failures) for b in report.failed),
            )
            return
        self._fail_if_any(report, what)

    def _fail_if_any(self, report: SyncReport, what: str) -> None:
        if not report.failed:
            return
        lines = [failure_line(b, self.max_failures) for b in report.failed]
        state = (
            "the gateway resumed on the verified servers"
            if report.resumed
            else f"no server was verified, so the gateway stays paused (calls wait, none is "
            f"lost) until this sync's lease lapses ({self.lease:g} s; then calls are refused "
            "while no server is in rotation): fix the servers and sync again, or POST /api/resume"
        )
        raise WeightSyncError(
            f"{what}: {len(report.failed)} of {len(report.backends)} servers failed and were "
            f"taken out of rotation; {state}:\n" + "\n".join(lines),
            report,
        )


class _EpochOver(Exception):
    """The sync's pause lapsed or was taken over before the sync ended (the gateway's 409)."""


class _LeaseKeeper(threading.Thread):
    """Renews the sync's pause every quarter lease while the sync runs (its own connection: the
    sync's client is busy with a push that may outlast the lease)."""

    def __init__(self, gateway: GatewayClient, epoch: str, lease: float) -> None:
        super().__init__(name=f"weight-sync-lease-{epoch}", daemon=True)
        self.url, self.admin_key = gateway.url, gateway.admin_key
        self.epoch, self.lease = epoch, lease
        self.lost: str | None = None
        self._done = threading.Event()

    def run(self) -> None:
        with GatewayClient(self.url, self.admin_key, timeout=max(5.0, self.lease / 4)) as c:
            while not self._done.wait(self.lease / 4):
                try:
                    c.sync_renew(epoch=self.epoch, lease=self.lease)
                except GatewayAPIError as exc:
                    if exc.code == "sync_epoch_over":
                        self.lost = exc.message
                        return
                except httpx.TransportError:
                    pass  # the sync's own next request says the gateway is gone

    def stop(self) -> None:
        """Stop renewing (the sync ended, or failed: then the lease lapses by itself)."""
        self._done.set()
        if self.is_alive():
            self.join(self.lease)


def _unverified(backend: dict[str, Any]) -> bool:
    reason = backend.get("quarantined")
    return isinstance(reason, str) and reason.startswith(UNVERIFIED_PREFIX)


def _fmt(values: Sequence[float]) -> str:
    return "[" + ", ".join(f"{v:.5f}" for v in values) + "]"
