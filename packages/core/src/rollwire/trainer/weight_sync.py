"""Weight sync: push a new policy into every inference server behind the gateway, verify that
each one really serves it, then stamp the new version (docs/weight-sync.md).

One :meth:`WeightSync.sync` call is the whole step, through the gateway's control plane (the
trainer needs no server's address): pause every gateway on the store and drain their calls,
push by each backend's transport, probe every server with a short greedy request and compare its
log-probs with the trainer's own model, take a server that disagrees out of rotation, set the
policy version, resume. A server is never stamped with a version it was not verified on.

A sync pushes a model folder (``kind="full"``: each server reloads it) or a LoRA adapter
(``kind="adapter"``: a PEFT folder each server loads under ``<policy>@<version>`` beside the
adapters ``max_staleness`` still allows, older ones unloaded; the gateway's calls name it from
then on). Every server is pushed to and probed at once.

A server whose push or probe failed stays out of rotation as *unverified*, and the next sync
pushes to it again; after ``max_failures`` failed syncs in a row it is quarantined for good (a
person puts it back). A sync succeeds when at least one server was verified.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from rollwire.trainer.gateway_client import GatewayAPIError, GatewayClient, server_weights_path
from rollwire.trainer.sync_report import BackendSync, SyncReport, WeightSyncError, failure_line
from rollwire.trainer.sync_servers import (
    EpochOver,
    LeaseKeeper,
    Push,
    each,
    mismatch,
    probe,
    push,
    unloads,
)

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
#: backend kinds that load a LoRA adapter by name (vLLM's runtime LoRA routes; the engine)
ADAPTER_KINDS = ("vllm",)
#: what a sync pushes: a model folder, or a PEFT LoRA adapter folder
EXPORT_KINDS = ("full", "adapter")

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
    until then each sync pushes to it again. An adapter sync loads ``<policy>@<version>`` and
    keeps the adapters of the ``max_staleness`` versions before it loaded. ``probe_before``
    probes each server before the push too (outside the pause): how far the old weights are
    from the new, a diagnostic the verification does not need.
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
        policy: str = "policy",
        max_staleness: int = 0,
        probe_before: bool = False,
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
        if not policy or "@" in policy or max_staleness < 0:
            raise ValueError(
                f"policy must be a name without '@' and max_staleness 0 or more; got {policy!r} "
                f"and {max_staleness!r}"
            )
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
        self.policy = policy
        self.max_staleness = max_staleness
        self.probe_before = probe_before
        self.history: list[SyncReport] = []
        #: failed syncs in a row, per backend name (a verified sync forgets it)
        self.failures: dict[str, int] = {}

    # ------------------------------------------------------------------ public
    def backends(self, kind: str = "full") -> list[dict[str, Any]]:
        """The servers a sync pushes to (every one in rotation, and those an abandoned sync left
        out as unverified); a kind that cannot take weights (or, for ``kind="adapter"``, a LoRA
        adapter) is an error here, before any step."""
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
        bad = [b for b in found if kind == "adapter" and b["kind"] not in ADAPTER_KINDS]
        if bad:
            names = ", ".join(f"{b['name']} ({b['kind']}, {b['url']})" for b in bad)
            raise ValueError(
                f"cannot load a LoRA adapter into {names}: only {ADAPTER_KINDS} backends load "
                "adapters by name (vLLM with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True --enable-lora, "
                "or the embedded engine); push the merged model instead"
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
            self._verify(report.backends, reference or self.reference, self.verify)
        except httpx.TransportError as exc:
            raise self._gateway_gone(report, "start-up check", exc) from exc
        for entry in report.backends:
            if not entry.verified:  # at start-up, a set-up error: out until a person fixes it
                self._quarantine(entry, entry.error or "the start-up check failed")
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
        kind: str = "full",
        verify: bool | None = None,
    ) -> SyncReport:
        """Push ``weights_path`` (a Hugging Face folder every server can read, or with
        ``kind="adapter"`` a PEFT LoRA folder; a relative one is sent absolute), verify, stamp
        ``version`` (with ordinal ``seq``, e.g. the trainer's step; default: one more than the
        last, which ``max_staleness`` counts in) on the servers verified (``verify=False``: a
        server that answers the probe counts). A server that failed is left out of rotation
        (logged, and in the report); raises :class:`WeightSyncError` when no server was
        verified, or the gateway stopped answering."""
        if kind not in EXPORT_KINDS:
            raise ValueError(f"kind must be one of {EXPORT_KINDS}, got {kind!r}")
        targets = self.backends(kind)
        adapter = f"{self.policy}@{version}" if kind == "adapter" else None
        if adapter is not None and seq is None:  # as the gateway would number it
            now = self.gateway.staleness()
            seq = int(now.get("policy_seq") or 0) + (now.get("policy_version") != str(version))
        report = SyncReport(version=str(version), kind=kind, adapter=adapter)
        self.history.append(report)
        entries = [
            BackendSync(name=b["name"], url=b["url"], kind=b["kind"], retried=_unverified(b))
            for b in targets
        ]
        reference = reference or self.reference
        if self.probe_before:
            self._probe_before(report, entries, reference)
        t0 = time.perf_counter()
        self._begin(report)
        t1 = time.perf_counter()
        report.pause_seconds = t1 - t0
        lease = LeaseKeeper(self.gateway, str(report.epoch), self.lease)
        lease.start()
        step = "push"
        try:
            what = Push(
                weights_path=server_weights_path(weights_path), version=str(version),
                epoch=str(report.epoch), keep=self.mode == "keep", timeout=self.push_timeout,
                adapter=adapter, seq=seq,
            )  # fmt: skip
            # what max_staleness allows stays loaded (and, across a keep-mode push, the adapter
            # the calls in flight still decode with)
            keep_from = (seq or 0) - max(self.max_staleness, int(self.mode == "keep"))
            report.backends.extend(entries)
            drop = [unloads(b, self.policy, keep_from, adapter) if adapter else [] for b in targets]
            each(lambda i: push(self.gateway, entries[i], what, drop[i]), range(len(entries)))
            t2 = time.perf_counter()
            report.push_seconds = t2 - t1
            step = "verification"
            # through the adapter just loaded (calls asking for the policy's name get it)
            model = self.policy if adapter else None
            self._verify([e for e in entries if e.pushed], reference, verify, model)
            t3 = time.perf_counter()
            report.verify_seconds = t3 - t2
            step = "end (stamping the version and resuming)"
            if lease.lost is not None:
                raise EpochOver(lease.lost)
            for entry in report.backends:
                self._count(entry, report)
            if any(e.verified for e in report.backends):
                self._end(report, seq)
            report.resume_seconds = time.perf_counter() - t3
        except httpx.TransportError as exc:
            # the gateway died or is cut off: the pause stays in the store until its lease
            # lapses, so nothing is served under a label whose weights were not verified
            raise self._gateway_gone(report, f"sync to {version!r}", exc, step) from exc
        except EpochOver as exc:
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
                raise EpochOver(exc.message) from exc
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
    def _verify(
        self, entries: list[BackendSync], reference: Reference | None, verify: bool | None,
        model: str | None = None,
    ) -> None:  # fmt: skip
        """Probe every server at once, then score each answer with ``reference`` (in this
        thread: a trainer's model is not shared across threads; equal answers scored once)."""
        check = self.verify if verify is None else verify
        t0 = time.perf_counter()
        answers = each(
            lambda e: probe(self.gateway, e, self.probe_ids, self.probe_tokens, model), entries
        )
        probed = time.perf_counter() - t0
        scored: dict[tuple[int, ...], list[float]] = {}
        for entry, answer in zip(entries, answers, strict=True):
            t1 = time.perf_counter()
            if answer is not None:
                ids, served = answer
                entry.probe_ids = ids
                entry.verified = True
                if reference is not None and check:
                    if tuple(ids) not in scored:
                        scored[tuple(ids)] = [float(x) for x in reference(self.probe_ids, ids)]
                    expected = scored[tuple(ids)]
                    entry.max_abs_diff, entry.error = mismatch(
                        served, expected, self.tolerance, self.probe_ids, ids
                    )
                    entry.verified = entry.error is None
            entry.probe_seconds = probed + time.perf_counter() - t1

    def _probe_before(
        self, report: SyncReport, entries: list[BackendSync], reference: Reference | None
    ) -> None:
        """The probe against the new weights while the servers still serve the old ones (a
        diagnostic: what a missed sync would carry); it changes nothing."""
        t0 = time.perf_counter()
        try:
            answers = each(
                lambda e: probe(self.gateway, e, self.probe_ids, self.probe_tokens), entries
            )
        except httpx.TransportError as exc:
            raise self._gateway_gone(report, f"probe before {report.version!r}", exc) from exc
        for entry, answer in zip(entries, answers, strict=True):
            entry.error = None  # the push and the verification decide the outcome
            if answer is not None and reference is not None:
                ids, served = answer
                expected = [float(x) for x in reference(self.probe_ids, ids)]
                entry.before_max_abs_diff, _ = mismatch(served, expected, 0.0, [], [])
        report.probe_before_seconds = time.perf_counter() - t0

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


def _unverified(backend: dict[str, Any]) -> bool:
    reason = backend.get("quarantined")
    return isinstance(reason, str) and reason.startswith(UNVERIFIED_PREFIX)
