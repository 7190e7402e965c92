"""Plugins: the adapter protocols (:mod:`.protocols`) and their discovery (:mod:`.registry`).

Trainer adapters register under the ``rollwire.trainers`` entry-point group, agent adapters under
``rollwire.agents``; nothing here imports an adapter until it is asked for by name.
"""

from __future__ import annotations

from rollwire.plugins.protocols import AgentAdapter, ExportedRow, TrainerAdapter
from rollwire.plugins.registry import (
    DISABLE_ENV,
    GROUPS,
    PluginError,
    PluginInfo,
    PluginKind,
    check_requirements,
    discover,
    load_agent,
    load_trainer,
)

__all__ = [
    "DISABLE_ENV",
    "GROUPS",
    "AgentAdapter",
    "ExportedRow",
    "PluginError",
    "PluginInfo",
    "PluginKind",
    "TrainerAdapter",
    "check_requirements",
    "discover",
    "load_agent",
    "load_trainer",
]
