"""The two plugin interfaces: what a trainer adapter and an agent adapter must provide.

An adapter distribution registers one object per entry point. The module the entry point names
must stay light: it may not import its framework at import time (``requires`` is read first).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from rollwire.data.protocol import Group, Rollout

__all__ = ["AgentAdapter", "Batch", "ExportedRow", "TrainerAdapter", "TrainerOption"]

Batch = Iterable[Group] | Iterable[Rollout] | Iterable[Group | Rollout]


@dataclass
class ExportedRow:
    """A trainer-neutral view of one row as a trainer will see it (used by conformance tests)."""

    rollout_id: str
    group_id: str | None
    prompt_ids: np.ndarray
    response_ids: np.ndarray
    loss_mask: np.ndarray
    logprobs: np.ndarray
    reward: float | None
    #: ``[len(prompt_ids) + len(response_ids) - 1, layers, top_k]`` when the trainer format keeps
    #: the routing of every position (DESIGN §6); None when it has none or cannot carry it.
    routed_experts: np.ndarray | None = None
    #: the advantage the row's sampled tokens train with (``train_rows``; None in exports)
    advantage: float | None = None


@dataclass(frozen=True)
class TrainerOption:
    """One option a trainer plugin adds to ``rollwire train`` (after the shared ones); its value
    reaches the trainer as ``RunSpec.options[name]``."""

    flag: str
    name: str
    default: Any
    help: str
    kind: type = str
    choices: tuple[Any, ...] = ()


@runtime_checkable
class TrainerAdapter(Protocol):
    """Turns rollwire rollouts into a trainer's own batch format."""

    name: str
    #: requirement strings of the trainer framework, e.g. ``("verl>=0.9.1",)``; empty when the
    #: conversion needs no framework (a dict form is produced instead).
    requires: Sequence[str]

    # An adapter may also set ``extra`` (the rollwire extra that installs its framework, when it
    # is not the plugin's name) and ``export_suffix`` (e.g. ``".dataproto.pkl"``): the file suffix
    # ``rollwire demo`` gives its export; ``.jsonl`` when absent. An adapter with empty
    # ``requires`` may set ``framework`` (the trainer's distribution name, e.g. ``"slime"``): when
    # it is not installed, ``rollwire plugins`` reports the adapter "export only". A plugin that
    # trains (``rollwire train --trainer NAME``) adds ``policy_trainer(spec)`` (a
    # :class:`rollwire.trainer.loop.PolicyTrainer`), ``train_requires``, ``install_hint`` and
    # ``train_options`` (a sequence of :class:`TrainerOption`).

    def convert(self, batch: Batch, **options: Any) -> Any:
        """The trainer's native batch (or its documented dict form when the trainer is absent)."""
        ...

    def export(self, batch: Batch, path: str | Path, **options: Any) -> Path:
        """Write the converted batch to ``path`` in the trainer's on-disk form; returns the path."""
        ...

    def flatten(self, converted: Any) -> list[ExportedRow]:
        """The rows of a converted batch, in order, as the trainer will train on them."""
        ...


@runtime_checkable
class AgentAdapter(Protocol):
    """Builds an agent framework's model client for a rollout session (or for production)."""

    name: str
    #: requirement strings of the agent framework, e.g. ``("strands-agents>=1.0",)``.
    requires: Sequence[str]

    def model(self, payload: Mapping[str, Any], **production_kwargs: Any) -> Any:
        """The framework's model object wired to the session in ``payload["_rollwire"]``;
        built from ``production_kwargs`` alone when the payload has no ``_rollwire`` key."""
        ...
