"""One policy per role (``rollwire train --roles planner,executor``).

A multi-agent system marks each call with its role through the ``model`` it asks for (an
unmodified framework agent does so with its model setting); the gateway keeps the request as
received, so ``call.request["model"]`` is the role. Each role is its own LoRA adapter in the
trainer, with its own optimizer state: a step splits every rollout's calls by role
(:func:`role_rollouts`), builds each role's rows with
:func:`~rollwire.trainer.train_batch.build_train_batch` (rewards per rollout, advantages per
group, as for one policy), updates that role's adapter on them alone, exports it, pushes it as
``<role>@<version>``, verifies it by a probe through that adapter and stamps the version. The
gateway then routes the calls asking for ``<role>`` to the newest ``<role>@...`` adapter.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from rollwire.data.protocol import Group, ModelCall, Rollout, group_rollouts
from rollwire.trainer.steps import StepRecord
from rollwire.trainer.train_batch import Algorithm, TrainBatch, build_train_batch
from rollwire.trainer.weight_sync import SyncReport, WeightSync

__all__ = ["RoleTrainer", "Roles", "call_role", "check_roles", "merged_sync", "role_rollouts"]


@runtime_checkable
class RoleTrainer(Protocol):
    """A trainer that holds one adapter per role: ``use_role`` makes ``role``'s adapter (and
    its optimizer) the one ``update``, ``export`` and ``reference`` act on."""

    def use_role(self, role: str) -> None:
        """Act on ``role``'s adapter from now on."""
        ...


def check_roles(roles: Sequence[str]) -> list[str]:
    """``roles`` as a list of distinct policy names; a name that cannot be one is an error."""
    out = [r.strip() for r in roles if r.strip()]
    bad = [r for r in out if "@" in r or "/" in r or r == "default" or " " in r]
    if len(out) < 1 or bad or len(set(out)) != len(out):
        raise ValueError(
            f"--roles {','.join(roles)!r}: give distinct role names (the model names the agent's "
            "calls ask for), without '@', '/' or spaces and not 'default', e.g. planner,executor"
        )
    return out


def call_role(call: ModelCall) -> str | None:
    """The role of ``call``: the ``model`` its request asked for (None: it named none)."""
    model = call.request.get("model")
    return model if isinstance(model, str) else None


def role_rollouts(batch: Sequence[Group | Rollout], role: str) -> list[Rollout]:
    """Every rollout of ``batch`` with only the calls of ``role`` (reward, group and status
    kept): the rows built from them hold that role's tokens alone."""
    rollouts = [r for g in group_rollouts(batch) for r in g.rollouts]
    return [
        r.model_copy(update={"calls": [c for c in r.calls if call_role(c) == role]})
        for r in rollouts
    ]


class Roles:
    """One run's roles: a :class:`WeightSync` per role (``policy=role``) and each step's
    per-role update, export, push and verification (module docstring)."""

    def __init__(self, spec: Any, trainer: Any, sync: WeightSync) -> None:
        if not isinstance(trainer, RoleTrainer):
            raise ValueError(
                f"--roles needs a trainer that holds one LoRA adapter per role; "
                f"{type(trainer).__name__} trains one policy (a trainer that has "
                "use_role(role), with --lora-rank R)"
            )
        if spec.async_rollouts:
            raise ValueError("--roles trains each role after its rollouts: drop --async")
        self.names = check_roles(spec.roles)
        self.log = spec.log
        self.trainer: Any = trainer
        self.syncs = {role: _role_sync(sync, trainer, role) for role in self.names}

    def push(self, adapters: dict[str, str], version: str, seq: int) -> list[SyncReport]:
        """Load each role's adapter folder of ``adapters`` on the servers as
        ``<role>@<version>``, verified through that role's adapter in the trainer (a resumed
        run's, before its next step)."""
        unknown = sorted(set(adapters) - set(self.names))
        if unknown:
            raise ValueError(
                f"adapters for {unknown}, which are no role of --roles {','.join(self.names)}: "
                "resume with the roles the run was started with"
            )
        reports = []
        for role, folder in adapters.items():
            self.trainer.use_role(role)
            reports.append(self.syncs[role].sync(folder, version, seq=seq, kind="adapter"))
        return reports

    def step(
        self, step: int, groups: list[Group], algorithm: Algorithm, tokenizer: Any
    ) -> tuple[dict[str, float], list[SyncReport], dict[str, dict[str, Any]], float]:
        """Train, export, push and verify each role's adapter on its own rows: the merged
        trainer statistics (``<role>/<name>``), the syncs, the per-role records and the
        seconds the exports took."""
        trainer, stats, reports = self.trainer, {}, []
        records: dict[str, dict[str, Any]] = {}
        export_s = 0.0
        for role in self.names:
            rollouts = role_rollouts(groups, role)
            record: dict[str, Any] = {"calls": sum(len(r.calls) for r in rollouts), "rows": 0}
            if not record["calls"]:  # nothing of this role this step: its adapter stays
                records[role] = record
                continue
            batch = build_train_batch(rollouts, algorithm, tokenizer=tokenizer)
            record.update(_batch_figures(batch))
            if batch.rows:
                trainer.use_role(role)
                own = trainer.update(batch)
                exported = trainer.export(step)
                export_s += exported.seconds
                report = self.syncs[role].sync(
                    exported.weights, exported.version, seq=step, kind=exported.kind
                )
                report.save_seconds = exported.seconds
                reports.append(report)
                record.update(own)
                record.update(_sync_figures(report))
                stats.update({f"{role}/{k}": v for k, v in own.items()})
            records[role] = record
        stats["loss"] = sum(v for k, v in stats.items() if k.endswith("/loss"))
        others = _other_models(groups, self.names)
        if others:
            self.log(
                f"    step {step}: {sum(others.values())} calls asked for a model that is no role "
                f"({', '.join(f'{m!r}: {n}' for m, n in others.items())}); they train nothing "
                f"(--roles {','.join(self.names)})"
            )
        return stats, reports, records, export_s

    def fill(
        self, record: StepRecord, roles: dict[str, dict[str, Any]], reports: list[SyncReport]
    ) -> None:
        """Put the roles' records and syncs into the step's ``record``: its rows and trained
        tokens are the roles' (a call naming no role trains nothing)."""
        record.roles, record.sync = roles, merged_sync(reports)
        record.rows = sum(int(r.get("rows", 0)) for r in roles.values())
        record.trained_tokens = sum(int(r.get("trained_tokens", 0)) for r in roles.values())


def _other_models(groups: Sequence[Group], roles: Sequence[str]) -> dict[str, int]:
    """The models the step's calls asked for that are no role, with their call counts."""
    out: dict[str, int] = {}
    for rollout in (r for g in group_rollouts(groups) for r in g.rollouts):
        for call in rollout.calls:
            role = call_role(call)
            if role not in roles:
                out[str(role)] = out.get(str(role), 0) + 1
    return out


def _role_sync(sync: WeightSync, trainer: Any, role: str) -> WeightSync:
    """``sync``'s settings for ``role``'s adapter (``<role>@<version>``)."""
    return WeightSync(
        sync.gateway,
        reference=trainer.reference(),
        probe_ids=sync.probe_ids,
        probe_tokens=sync.probe_tokens,
        tolerance=sync.tolerance,
        policy=role,
    )


def _batch_figures(batch: TrainBatch) -> dict[str, Any]:
    rewards = [float(r.reward) for r in batch.rollouts if r.calls and r.reward is not None]
    return {
        "rows": len(batch.rows),
        "rollouts": sum(1 for r in batch.rollouts if r.calls),
        "sampled_tokens": batch.sampled_tokens,
        "trained_tokens": batch.trained_tokens,
        "reward_mean": float(np.mean(rewards)) if rewards else 0.0,
    }


def _sync_figures(report: SyncReport) -> dict[str, Any]:
    diffs = [b.max_abs_diff for b in report.backends if b.max_abs_diff is not None]
    return {
        "version": report.version,
        "adapter": report.adapter,
        "verified": bool(report.backends) and not report.failed,
        "probe_max_abs_diff": max(diffs) if diffs else None,
    }


def merged_sync(reports: Sequence[SyncReport]) -> dict[str, float]:
    """The step's ``sync`` figures over every role's sync: times add up, the servers verified
    are those verified for every role, the rest (failures, probe differences) the largest."""
    out: dict[str, float] = {}
    for report in reports:
        for key, value in report.summary().items():
            if key not in out:
                out[key] = float(value)
            elif key.endswith("_s"):
                out[key] += float(value)
            else:
                pick = min if key == "sync/servers_verified" else max
                out[key] = pick(out[key], float(value))
    return out
