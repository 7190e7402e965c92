"""Each relay role's own held-out measure, served by a model alone or with one adapter per role:
``note_correct`` (the planner's: its note names the secret), ``action_follows_note`` (the
executor's, over the rollouts whose note named a digit: it acts on the note it was given, right
or wrong) and ``solved`` (both right, the reward). ``benchmarks/roles.py`` and the TRL adapter's
learning test of ``--roles`` measure with it, before RL and after."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["MEASURES", "ROLE_MEASURES", "measure_roles"]

#: every measure in a relay rollout's metrics :func:`measure_roles` counts
MEASURES = ("note_correct", "action_follows_note", "solved")
#: each role's own measure
ROLE_MEASURES = {"planner": "note_correct", "executor": "action_follows_note"}


def measure_roles(
    model_dir: Path,
    tasks: Sequence[dict[str, Any]],
    k: int,
    adapters: Mapping[str, Path] | None = None,
    *,
    seed: int = 1,
    temperature: float = 1.0,
    deadline: float = 300.0,
) -> dict[str, tuple[int, int]]:
    """``{measure: (hits, count)}`` over ``k`` rollouts of every task of ``tasks``, on the
    embedded engine serving ``model_dir``; ``adapters`` (``{role: PEFT folder}``) are loaded as
    ``<role>@final``, each verified against ``model_dir`` with it merged in (in NumPy), so each
    role's calls are answered by its own (None: the model alone)."""
    import tempfile

    from rollwire.agent.app import load_app
    from rollwire.engine import EmbeddedEngine, EngineConfig
    from rollwire.envs.relay import AGENT
    from rollwire.gateway import serve_in_thread
    from rollwire.testing.lora_adapters import merged_folder
    from rollwire.trainer.client import RolloutClient
    from rollwire.trainer.references import engine_reference
    from rollwire.trainer.runners import LocalRunner
    from rollwire.trainer.weight_sync import WeightSync

    config = EngineConfig(model_dir=Path(model_dir), seed=seed)
    with EmbeddedEngine(config) as engine, serve_in_thread(backends=[(engine.url, "vllm")]) as gw:
        if adapters:
            with gw.client() as control, tempfile.TemporaryDirectory() as tmp:
                for role, folder in adapters.items():
                    merged = merged_folder(model_dir, folder, Path(tmp) / role)
                    sync = WeightSync(control, reference=engine_reference(merged), policy=role)
                    sync.sync(str(folder), "final", seq=1, kind="adapter")
        client = RolloutClient(gw, runner=LocalRunner(load_app(AGENT)), group_size=k,
                               sampling={"temperature": temperature}, deadline=deadline)  # fmt: skip
        try:
            rollouts = [r for g in client.run(list(tasks)) for r in g.rollouts]
        finally:
            client.close()
    metrics = [r.metrics for r in rollouts if r.status == "completed"]
    out: dict[str, tuple[int, int]] = {}
    for name in MEASURES:
        values = [m[name] for m in metrics if name in m]
        out[name] = (int(sum(values)), len(values))
    return out
