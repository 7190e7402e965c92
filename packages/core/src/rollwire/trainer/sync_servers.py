"""One weight sync's work on each server, through the gateway's control plane: the push by the
server's transport (a model folder reloaded, or a LoRA adapter loaded under a versioned name)
and the greedy probe whose log-probs are compared with the trainer's model. Every server's push
and probe run at once (:func:`each`), while :class:`LeaseKeeper` renews the sync's pause;
:mod:`rollwire.trainer.weight_sync` orders the steps."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from rollwire.trainer.gateway_client import GatewayAPIError, GatewayClient
from rollwire.trainer.sync_report import BackendSync

__all__ = [
    "LOAD_ROUTES",
    "EpochOver",
    "LeaseKeeper",
    "Push",
    "each",
    "mismatch",
    "probe",
    "push",
    "unloads",
]

#: the routes (and Tinker's step) in which a server loads what was pushed: the push's load time
LOAD_ROUTES = frozenset(
    {
        "/collective_rpc",
        "/v1/load_lora_adapter",
        "/update_weights_from_disk",
        "create_sampling_client",
    }
)

_T = TypeVar("_T")
_R = TypeVar("_R")


class EpochOver(Exception):
    """The sync's pause lapsed or was taken over before the sync ended (the gateway's 409)."""


def each(fn: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
    """``fn`` on every item at once (one thread each: the work is waiting on servers); the
    first exception raised is raised here once all have finished."""
    if len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=len(items), thread_name_prefix="weight-sync") as pool:
        futures = [pool.submit(fn, x) for x in items]
    return [f.result() for f in futures]


@dataclass(frozen=True)
class Push:
    """What one sync pushes to every server: a folder (or a LoRA adapter under ``adapter``)."""

    weights_path: str
    version: str
    epoch: str
    keep: bool
    timeout: float
    #: the LoRA adapter name (``<policy>@<version>``); None: a full reload
    adapter: str | None = None
    seq: int | None = None


def push(gateway: GatewayClient, entry: BackendSync, what: Push, unload: list[str]) -> None:
    """Push ``what`` to ``entry``'s server (unloading the adapters ``unload``); a refusal is
    recorded in ``entry``, a lost pause raises :class:`EpochOver`."""
    t0 = time.perf_counter()
    try:
        answer = gateway.push_weights(
            entry.name,
            weights_path=what.weights_path,
            version=what.version,
            keep=what.keep,
            timeout=what.timeout,
            epoch=what.epoch,
            adapter=what.adapter,
            unload=unload or None,
            seq=what.seq if what.adapter is not None else None,
        )
        entry.pushed = True
        steps = answer.get("steps") or []
        entry.load_seconds = sum(
            float(s.get("seconds", 0.0)) for s in steps if s.get("route") in LOAD_ROUTES
        )
    except GatewayAPIError as exc:
        if exc.code == "sync_epoch_over":
            raise EpochOver(exc.message) from exc
        # the server's state is unknown now: out of rotation (the gateway took it out before
        # the push; the sync gives it the failure's reason before it ends)
        entry.error = f"push failed: {exc}"
    entry.push_seconds = time.perf_counter() - t0


def probe(
    gateway: GatewayClient, entry: BackendSync, prompt_ids: list[int], tokens: int,
    model: str | None = None,
) -> tuple[list[int], list[float]] | None:  # fmt: skip
    """The server's greedy ids and log-probs after ``prompt_ids`` (as it serves the policy:
    under its adapter's name when it has one; ``model``: the adapter of the policy of that name,
    e.g. a role's); None, with ``entry.error`` set, if it failed."""
    try:
        if model is None:
            answer = gateway.probe_backend(entry.name, prompt_ids=prompt_ids, max_tokens=tokens)
        else:
            answer = gateway.probe_backend(
                entry.name, prompt_ids=prompt_ids, max_tokens=tokens, model=model
            )
    except GatewayAPIError as exc:
        entry.error = f"probe failed: {exc}"
        return None
    return [int(t) for t in answer["completion_ids"]], [float(x) for x in answer["logprobs"]]


def mismatch(
    served: Sequence[float],
    expected: Sequence[float],
    tolerance: float,
    prompt_ids: Sequence[int],
    ids: Sequence[int],
) -> tuple[float | None, str | None]:
    """The largest per-token |served - expected|, and what is wrong when it is past
    ``tolerance`` (or not finite, or the two disagree in length); None when all is well."""
    if len(expected) != len(served):
        return None, f"the reference scored {len(expected)} tokens for a probe of {len(served)}"
    diffs = [abs(a - b) for a, b in zip(served, expected, strict=True)]
    worst = max(diffs) if diffs else 0.0
    if all(math.isfinite(d) for d in diffs) and worst <= tolerance:
        return worst, None
    return worst, (
        f"the server's log-probs differ from the trainer's model by up to {worst:.3g} "
        f"(tolerance {tolerance:g}) on the probe {list(prompt_ids)} -> {list(ids)}: "
        f"served {_fmt(served)}, trainer {_fmt(expected)}"
    )


def unloads(backend: dict[str, Any], policy: str, keep_from: int, loading: str) -> list[str]:
    """The adapters of ``policy`` on ``backend`` (as the gateway lists them) that a sync loading
    ``loading`` unloads: those whose ordinal is below ``keep_from`` (or unknown)."""
    out = []
    for a in backend.get("adapters") or []:
        name, seq = a.get("name"), a.get("seq")
        if not isinstance(name, str) or name == loading or not name.startswith(policy + "@"):
            continue
        if type(seq) is not int or seq < keep_from:
            out.append(name)
    return out


class LeaseKeeper(threading.Thread):
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


def _fmt(values: Sequence[float]) -> str:
    return "[" + ", ".join(f"{v:.5f}" for v in values) + "]"
