"""Plugin discovery: trainer adapters (``rollwire.trainers``) and agent adapters (``rollwire.agents``).

Adapters are separate distributions found through entry points. Nothing here imports an adapter
at ``import rollwire``; :func:`discover` imports each adapter's light entry module (which must
not import its framework) to read its declared requirements, checks them against installed
metadata, and reports — it never raises for a broken plugin. :func:`load_trainer` /
:func:`load_agent` raise :class:`PluginError` naming the extra to install.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Literal

from packaging.requirements import InvalidRequirement, Requirement

from rollwire.plugins.protocols import AgentAdapter, TrainerAdapter

__all__ = [
    "GROUPS",
    "PluginError",
    "PluginInfo",
    "check_requirements",
    "discover",
    "load_agent",
    "load_trainer",
]

log = logging.getLogger(__name__)

PluginKind = Literal["trainers", "agents"]
GROUPS: dict[PluginKind, str] = {"trainers": "rollwire.trainers", "agents": "rollwire.agents"}
DISABLE_ENV = "ROLLWIRE_DISABLED_PLUGINS"


class PluginError(RuntimeError):
    """A plugin is unknown, disabled, broken, or its framework is missing."""


@dataclass(frozen=True)
class PluginInfo:
    """One discovered plugin and whether it can be loaded."""

    name: str
    kind: PluginKind
    distribution: str
    version: str
    status: Literal["ok", "missing", "incompatible", "disabled", "error"]
    detail: str = ""
    #: an ``ok`` trainer adapter whose framework (its ``framework`` attribute) is not installed:
    #: it converts to the framework's documented dict form and writes it, nothing more
    export_only: bool = False


def _disabled() -> set[str]:
    raw = os.environ.get(DISABLE_ENV, "")
    return {p.strip() for p in raw.split(",") if p.strip()}


def check_requirements(requires: Iterable[str]) -> list[str]:
    """Problems with ``requires`` in the installed environment (empty when all are met)."""
    missing, incompatible = _requirement_problems(requires)
    return missing + incompatible


def _requirement_problems(requires: Iterable[str]) -> tuple[list[str], list[str]]:
    missing: list[str] = []
    incompatible: list[str] = []
    for spec in requires:
        try:
            req = Requirement(spec)
        except InvalidRequirement as exc:
            incompatible.append(f"invalid requirement {spec!r}: {exc}")
            continue
        if req.marker is not None and not req.marker.evaluate():
            continue
        try:
            installed = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            missing.append(f"{req.name} is not installed (needs {spec})")
            continue
        if req.specifier and not req.specifier.contains(installed, prereleases=True):
            incompatible.append(f"{req.name} {installed} is installed but {spec} is required")
    return missing, incompatible


def _entry_points(kind: PluginKind) -> list[metadata.EntryPoint]:
    eps = list(metadata.entry_points(group=GROUPS[kind]))
    seen: dict[str, metadata.EntryPoint] = {}
    for ep in eps:
        prev = seen.get(ep.name)
        if prev is not None and _dist_name(prev) != _dist_name(ep):
            raise PluginError(
                f"two distributions register the {kind[:-1]} plugin {ep.name!r}: "
                f"{_dist_name(prev)} and {_dist_name(ep)}; uninstall one of them"
            )
        seen[ep.name] = ep
    return list(seen.values())


def _dist_name(ep: metadata.EntryPoint) -> str:
    dist = ep.dist
    return dist.metadata["Name"] if dist is not None else "?"


def _dist_version(ep: metadata.EntryPoint) -> str:
    dist = ep.dist
    return dist.version if dist is not None else "?"


def _inspect(kind: PluginKind, ep: metadata.EntryPoint) -> tuple[PluginInfo, Any]:
    dist, version = _dist_name(ep), _dist_version(ep)
    if ep.name in _disabled():
        return PluginInfo(
            ep.name, kind, dist, version, "disabled", f"listed in {DISABLE_ENV}"
        ), None
    try:
        obj = ep.load()
    except Exception as exc:  # a broken plugin must not break discovery of the others
        log.warning("rollwire plugin %s (%s) failed to load: %s", ep.name, dist, exc)
        return PluginInfo(
            ep.name, kind, dist, version, "error", f"{type(exc).__name__}: {exc}"
        ), None
    missing, incompatible = _requirement_problems(getattr(obj, "requires", ()))
    if incompatible:
        # An install hint would not help here: a version has to change.
        detail = "; ".join(incompatible + missing) + "; install a version that satisfies it"
        return PluginInfo(ep.name, kind, dist, version, "incompatible", detail), obj
    if missing:
        extra = getattr(obj, "extra", None) or ep.name
        hint = f'; install it with: pip install "rollwire[{extra}]"'
        return PluginInfo(ep.name, kind, dist, version, "missing", "; ".join(missing) + hint), obj
    framework = getattr(obj, "framework", None)
    if isinstance(framework, str) and check_requirements([framework]):
        detail = (
            f"export only: {framework} is not installed, so batches are written in its "
            f"documented dict form (JSONL); install {framework} to convert in-process"
        )
        return PluginInfo(ep.name, kind, dist, version, "ok", detail, export_only=True), obj
    return PluginInfo(ep.name, kind, dist, version, "ok"), obj


def discover(kind: PluginKind | None = None) -> list[PluginInfo]:
    """Every installed plugin of ``kind`` (or both kinds), with its status; never raises for one."""
    kinds: list[PluginKind] = [kind] if kind else ["trainers", "agents"]
    out: list[PluginInfo] = []
    for k in kinds:
        for ep in sorted(_entry_points(k), key=lambda e: e.name):
            info, _ = _inspect(k, ep)
            out.append(info)
    return out


def _load(kind: PluginKind, name: str) -> Any:
    eps = {ep.name: ep for ep in _entry_points(kind)}
    ep = eps.get(name)
    if ep is None:
        known = ", ".join(sorted(eps)) or "none"
        raise PluginError(
            f"no {kind[:-1]} plugin named {name!r} is installed (installed: {known}); "
            f'install it with: pip install "rollwire[{name}]"'
        )
    info, obj = _inspect(kind, ep)
    if info.status != "ok":
        raise PluginError(
            f"{kind[:-1]} plugin {name!r} ({info.distribution}) is {info.status}: {info.detail}"
        )
    return obj


def load_trainer(name: str) -> TrainerAdapter:
    """The trainer adapter registered as ``name`` (e.g. ``verl``), checked and ready."""
    obj = _load("trainers", name)
    if not isinstance(obj, TrainerAdapter):
        raise PluginError(f"trainer plugin {name!r} does not provide the TrainerAdapter interface")
    return obj


def load_agent(name: str) -> AgentAdapter:
    """The agent adapter registered as ``name`` (e.g. ``strands``), checked and ready."""
    obj = _load("agents", name)
    if not isinstance(obj, AgentAdapter):
        raise PluginError(f"agent plugin {name!r} does not provide the AgentAdapter interface")
    return obj
