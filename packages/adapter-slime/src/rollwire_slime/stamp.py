"""slime's weights as the gateway's policy version (issue 24.5).

slime pushes its own weights: ``actor_model.update_weights()`` after each rollout's training
(``train.py``; ``train_async.py`` every ``--update-weights-interval``), and the Megatron actor's
updater (``weight_updater.weight_version``, +1 per push) hands SGLang the new
``weight_version``, which SGLang reports on every ``/generate`` (``meta_info["weight_version"]``,
what ``Sample.weight_versions`` collects). The rollout process, where the hooks run, sees neither
the counter nor the push; it sees ``rollout_id`` (``generate_rollout(args, rollout_id, ...)``;
for the per-sample ``generate``, the id slime's ``RolloutManager.generate`` / ``eval`` record in
``slime.rollout.sample_hooks``) and SGLang itself.

So at the first hook call of each rollout id (and of each evaluation), the process reads the
version SGLang serves the way slime's own rollout code finds its engines (``GET {router}/workers``,
then each worker's ``GET /get_weight_version``; a router without ``/workers`` is asked itself)
and stamps it on the gateway with ``rollout_id`` as the ordinal
(:class:`~rollwire.trainer.step_stamp.StepStamp`): the label is SGLang's, so tokens-mode calls,
which keep what SGLang reports, agree with the gateway (no ``policy_version_mismatch``), and
passthrough calls get it too; the ordinal is slime's step, which stays monotonic when a resumed
run restarts the updater's counter. An evaluation after a push keeps the ordinal and moves the
label. When SGLang cannot be read, the label is ``str(rollout_id)`` (logged once).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import httpx

from rollwire.trainer.step_stamp import StepStamp, stamp_client

__all__ = [
    "SlimeStamp",
    "current_rollout_id",
    "served_weight_version",
    "slime_stamp",
    "stamp_setting",
]

log = logging.getLogger("rollwire.slime")

#: what SGLang reports before anyone set a version
_UNSET = frozenset({"default", ""})


def stamp_setting(value: Any) -> bool:
    """``--rollwire-stamp-version`` / ``$ROLLWIRE_STAMP_VERSION``: a bool, or ``1``/``true``/``yes``
    (``0``/``false``/``no``)."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text not in ("1", "true", "yes", "0", "false", "no"):
            raise ValueError(f"ROLLWIRE_STAMP_VERSION must be true or false, got {value!r}")
        return text in ("1", "true", "yes")
    return bool(value)


def current_rollout_id() -> int | None:
    """The rollout id slime's ``RolloutManager.generate`` / ``eval`` set for the sample hooks
    (``slime.rollout.sample_hooks``); None outside slime or on a slime without it."""
    try:
        from slime.rollout import sample_hooks
    except ImportError:
        return None
    value = getattr(sample_hooks, "_current_rollout_id", None)
    return value if type(value) is int else None


async def _json(http: httpx.AsyncClient, url: str) -> Any:
    resp = await http.get(url)
    resp.raise_for_status()
    return resp.json()


def _worker_urls(listed: Any) -> list[str]:
    if not isinstance(listed, dict):
        return []
    workers = listed.get("workers") or []
    urls = [str(w["url"]) for w in workers if isinstance(w, dict) and w.get("url")]
    return urls or [str(u) for u in listed.get("urls") or []]


def _age(version: str) -> tuple[bool, int, str]:
    """Sort key: integer versions first, oldest first (slime counts pushes from 1)."""
    return (not version.isdigit(), int(version) if version.isdigit() else 0, version)


async def served_weight_version(router_url: str, timeout: float = 10.0) -> str | None:
    """The weight version slime's SGLang engines serve, or None when none can be read.

    Workers from the router's ``/workers`` (``{"workers": [{"url": ...}]}``, as slime's own
    rollout reads it; ``{"urls": [...]}`` too), each asked ``/get_weight_version``; a router
    without ``/workers`` is asked itself. Engines that disagree (one missed a push) give the
    oldest version, logged.
    """
    base = router_url.rstrip("/")
    async with httpx.AsyncClient(timeout=timeout) as http:
        try:
            urls = _worker_urls(await _json(http, f"{base}/workers"))
        except (httpx.HTTPError, ValueError):
            urls = []
        versions: list[str] = []
        for url in urls or [base]:
            try:
                got = (await _json(http, f"{str(url).rstrip('/')}/get_weight_version")).get(
                    "weight_version"
                )
            except (httpx.HTTPError, ValueError, AttributeError) as exc:
                log.debug("no weight version from %s: %r", url, exc)
                continue
            if got is not None and str(got) not in _UNSET:
                versions.append(str(got))
    if not versions:
        return None
    distinct = sorted(set(versions), key=_age)
    if len(distinct) > 1:
        log.warning(
            "rollwire: slime's SGLang engines serve different weight versions %s; stamping the "
            "oldest, %r",
            distinct,
            distinct[0],
        )
    return distinct[0]


class SlimeStamp:
    """One process's stamps of one gateway from slime's hooks (see the module docstring)."""

    def __init__(self) -> None:
        self.stamp = StepStamp()
        #: ``(rollout_id, evaluation)`` of the last hook call that stamped (or tried to)
        self.last: tuple[int, bool] | None = None
        self._locks: dict[int, asyncio.Lock] = {}
        self._warned = False

    async def after_sync(
        self, gateway: Any, router_url: str | None, rollout_id: int, evaluation: bool = False
    ) -> bool:
        """At the first hook call of ``rollout_id`` (or of its evaluation) in this process:
        stamp SGLang's weight version, ordinal ``rollout_id``; whether the gateway moved. The
        step's other samples wait for that one stamp, then return at once."""
        key = (int(rollout_id), bool(evaluation))
        if key == self.last:
            return False
        loop_key = id(asyncio.get_running_loop())
        lock = self._locks.setdefault(loop_key, asyncio.Lock())
        async with lock:
            if key == self.last:
                return False
            self.last = key
            version = await served_weight_version(router_url) if router_url else None
            if version is None:
                version = str(rollout_id)
                if not self._warned:
                    self._warned = True
                    log.warning(
                        "rollwire: could not read the weight version slime's SGLang serves "
                        "(router %s); stamping rollout ids as policy versions, so tokens-mode "
                        "calls that report SGLang's own are flagged policy_version_mismatch",
                        router_url,
                    )
            # an evaluation runs after the step's push: same ordinal, the new label
            step = key[0] if not evaluation or self.stamp.step is None else self.stamp.step
            client = stamp_client(gateway)
            if client is None:
                return False
            try:
                return await self.stamp.astamp(client, step, version)
            finally:
                await client.aclose()


_STAMPS: dict[str, SlimeStamp] = {}
_LOCK = threading.Lock()


def slime_stamp(gateway: Any) -> SlimeStamp:
    """This process's :class:`SlimeStamp` for ``gateway`` (by its URL): hooks are plain
    functions, so the state lives here, like the in-process gateways of :mod:`rollwire_slime.hooks`."""
    key = str(getattr(gateway, "url", id(gateway)))
    with _LOCK:
        stamp = _STAMPS.get(key)
        if stamp is None:
            stamp = _STAMPS[key] = SlimeStamp()
        return stamp
