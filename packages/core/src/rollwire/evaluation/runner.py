"""Run a task set ``k`` times per task at each sampling setting, and score it.

Evaluate the way you serve: a model judged at temperature 0 can look far worse (or better) than
the same model at its serving temperature. Every rollout of an evaluation is marked so that no
trainer takes it for training data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from rollwire.data.protocol import Group
from rollwire.evaluation.scoring import (
    EVAL_FLAG,
    EvalResult,
    EvalSetting,
    score_setting,
)

__all__ = ["GroupRunner", "arun_eval", "mark_eval", "run_eval"]


class GroupRunner(Protocol):
    """What evaluation needs of a client: ``RolloutClient`` fits."""

    sampling: dict[str, Any]
    group_size: int

    def run(self, tasks: Sequence[Mapping[str, Any]]) -> list[Group]:
        """Run every task as one group of ``group_size`` rollouts."""
        ...

    async def arun(self, tasks: Sequence[Mapping[str, Any]]) -> list[Group]:
        """Async :meth:`run`."""
        ...


def _eval_mark(setting: EvalSetting) -> dict[str, Any]:
    return {"setting": setting.name, "sampling": dict(setting.sampling)}


class _Configured:
    """The client set up for one setting (sampling, group size, session metadata), then restored."""

    def __init__(self, client: GroupRunner, setting: EvalSetting, k: int) -> None:
        self.client, self.setting, self.k = client, setting, k

    def __enter__(self) -> None:
        c = self.client
        self.saved = dict(c.sampling), c.group_size, getattr(c, "session_options", None)
        c.sampling = {**self.saved[0], **self.setting.sampling}
        c.group_size = self.k
        options = self.saved[2]
        if isinstance(options, dict):
            # The gateway's record of each session says it is an evaluation too (/ui, the store).
            meta = {**options.get("metadata", {}), "eval": _eval_mark(self.setting)}
            c.session_options = {**options, "metadata": meta}  # type: ignore[attr-defined]

    def __exit__(self, *exc: object) -> None:
        c = self.client
        c.sampling, c.group_size = self.saved[0], self.saved[1]
        if isinstance(self.saved[2], dict):
            c.session_options = self.saved[2]  # type: ignore[attr-defined]


def mark_eval(groups: Sequence[Group], setting: EvalSetting) -> None:
    """Mark every call non-trainable (flag ``eval``) and note the setting on each rollout."""
    for group in groups:
        for rollout in group.rollouts:
            rollout.metadata["eval"] = _eval_mark(setting)
            for call in rollout.calls:
                call.trainable = False
                if EVAL_FLAG not in call.flags:
                    call.flags.append(EVAL_FLAG)


def _check(settings: Sequence[EvalSetting], k: int, ks: Sequence[int] | None) -> list[int]:
    if not settings:
        raise ValueError("evaluation needs at least one sampling setting")
    names = [s.name for s in settings]
    if len(set(names)) != len(names):
        raise ValueError(f"sampling settings must have distinct names, got {names}")
    if k < 1:
        raise ValueError(f"k (attempts per task) must be at least 1, got {k}")
    chosen = sorted(set(ks)) if ks else sorted({1, k})
    bad = [x for x in chosen if not 1 <= x <= k]
    if bad:
        raise ValueError(f"pass@k needs 1 <= k <= {k} (the attempts per task), got {bad}")
    return chosen


def _score(
    runs: Sequence[tuple[EvalSetting, list[Group]]],
    k: int,
    ks: list[int],
    success_threshold: float,
    failure_reward: float,
    confidence: float,
) -> EvalResult:
    results = [
        score_setting(
            setting,
            groups,
            success_threshold=success_threshold,
            ks=ks,
            failure_reward=failure_reward,
            confidence=confidence,
        )
        for setting, groups in runs
    ]
    return EvalResult(results, k, ks, success_threshold, confidence)


def run_eval(
    client: GroupRunner,
    tasks: Sequence[Mapping[str, Any]],
    settings: Sequence[EvalSetting],
    *,
    k: int = 8,
    ks: Sequence[int] | None = None,
    success_threshold: float = 1.0,
    failure_reward: float = 0.0,
    confidence: float = 0.95,
    groups_out: dict[str, list[Group]] | None = None,
) -> EvalResult:
    """Run ``tasks`` ``k`` times each per setting through ``client`` and score every setting.

    The client's sampling, group size and session metadata (``eval``: the setting) are set for
    each setting and restored afterwards. The
    groups of each setting, marked by :func:`mark_eval`, go into ``groups_out`` when given.
    """
    chosen = _check(settings, k, ks)
    runs = []
    for setting in settings:
        with _Configured(client, setting, k):
            groups = client.run(list(tasks))
        mark_eval(groups, setting)
        if groups_out is not None:
            groups_out[setting.name] = groups
        runs.append((setting, groups))
    return _score(runs, k, chosen, success_threshold, failure_reward, confidence)


async def arun_eval(
    client: GroupRunner,
    tasks: Sequence[Mapping[str, Any]],
    settings: Sequence[EvalSetting],
    *,
    k: int = 8,
    ks: Sequence[int] | None = None,
    success_threshold: float = 1.0,
    failure_reward: float = 0.0,
    confidence: float = 0.95,
    groups_out: dict[str, list[Group]] | None = None,
) -> EvalResult:
    """Async :func:`run_eval`."""
    chosen = _check(settings, k, ks)
    runs = []
    for setting in settings:
        with _Configured(client, setting, k):
            groups = await client.arun(list(tasks))
        mark_eval(groups, setting)
        if groups_out is not None:
            groups_out[setting.name] = groups
        runs.append((setting, groups))
    return _score(runs, k, chosen, success_threshold, failure_reward, confidence)
