"""``rollwire demo``: Wordle end to end on a laptop — embedded engine, gateway, agent, trainer exports.

No GPU, no downloads. The embedded engine is a small random-weight model, so by default it is
*steered*: a scripted Wordle solver chooses each guess and the engine teacher-forces it, while the
log-probs recorded stay the model's own for those tokens. ``--unsteered`` lets the raw model
sample (expect no valid guesses and a reward of -1.5 everywhere).
"""

from __future__ import annotations

import importlib
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollwire.data.protocol import Group, Row

__all__ = ["AGENTS", "DemoError", "DemoResult", "load_demo_agent", "run_demo"]

#: Demo agents by name: ``module:attr`` of a RolloutApp. Adding an agent is one line here.
AGENTS: dict[str, str] = {
    "openai": "rollwire.envs.wordle.agent_openai:app",
    "strands": "examples.wordle.agent_strands:app",
    "langgraph": "examples.wordle.agent_langgraph:app",
}
_AGENT_EXTRAS = {"strands": "rollwire[strands]", "langgraph": "rollwire[langgraph]"}
#: Sampling for every session: a cap on tokens keeps the unsteered (random) model quick.
DEMO_SAMPLING: dict[str, Any] = {"temperature": 1.0, "max_tokens": 48}


class DemoError(RuntimeError):
    """The demo cannot run as asked (unknown agent, agent module missing)."""


@dataclass
class DemoResult:
    """What the demo produced: the groups, their rows, files written and timing."""

    groups: list[Group]
    rows: list[Row]
    out_dir: Path
    rollouts_path: Path
    exports: dict[str, Path] = field(default_factory=dict)
    export_errors: dict[str, str] = field(default_factory=dict)
    #: trainer adapters installed but not usable here (framework missing), and why
    export_skipped: dict[str, str] = field(default_factory=dict)
    wall_s: float = 0.0
    rollout_s: float = 0.0
    steered: bool = True

    def summary(self) -> dict[str, Any]:
        """The numbers of the summary table."""
        rollouts = [r for g in self.groups for r in g.rollouts]
        rewards = [r.reward for r in rollouts if r.reward is not None]
        n = max(1, len(rollouts))
        mean = sum(rewards) / len(rewards) if rewards else float("nan")
        std = (
            math.sqrt(sum((x - mean) ** 2 for x in rewards) / len(rewards))
            if rewards
            else float("nan")
        )
        calls = sum(len(r.calls) for r in rollouts)
        forks = Counter(row.fork.kind for row in self.rows if row.fork is not None)
        return {
            "rollouts": len(rollouts),
            "groups": len(self.groups),
            "completed": sum(r.status == "completed" for r in rollouts),
            "failed": sum(r.status != "completed" for r in rollouts),
            "solved": sum(r.metrics.get("solved", 0.0) > 0 for r in rollouts),
            "reward_mean": mean,
            "reward_std": std,
            "turns_per_rollout": calls / n,
            "rows_per_rollout": len(self.rows) / n,
            "trainable_tokens": int(sum(int(row.loss_mask.sum()) for row in self.rows)),
            "forks": dict(forks),
            "calls": calls,
            "calls_per_s": calls / self.rollout_s if self.rollout_s > 0 else float("nan"),
            "wall_s": self.wall_s,
        }


def load_demo_agent(name: str) -> Any:
    """The RolloutApp of demo agent ``name``; raises :class:`DemoError` saying what is missing."""
    target = AGENTS.get(name)
    if target is None:
        raise DemoError(f"unknown demo agent {name!r}; choose one of: {', '.join(sorted(AGENTS))}")
    module, _, attr = target.partition(":")
    if module.startswith("examples.") and Path("examples").is_dir() and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # the examples live in the repository, not in the wheel
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        where = module.replace(".", "/") + ".py"
        extra = _AGENT_EXTRAS.get(name)
        hint = f' and install its framework with pip install "{extra}"' if extra else ""
        raise DemoError(
            f"the {name!r} demo agent could not be imported ({exc}); it lives in {where} of the "
            f"rollwire repository: run `rollwire demo` from the repository root{hint}"
        ) from exc
    try:
        return getattr(mod, attr)
    except AttributeError as exc:
        raise DemoError(f"{module} defines no {attr!r} (expected a RolloutApp)") from exc


def _trainers() -> Iterable[tuple[str, str | None]]:
    """Every trainer adapter, with None when it can export here, else what to install."""
    from rollwire.plugins import discover

    for info in discover("trainers"):
        if info.name.startswith("fixture-"):
            continue
        if info.status == "ok":
            yield info.name, None
        elif info.status == "missing":
            yield info.name, f"install rollwire[{info.name}]"
        else:
            yield info.name, info.detail or info.status


def run_demo(
    *,
    agent: str = "openai",
    tasks: int = 16,
    group_size: int = 4,
    unsteered: bool = False,
    out: str | Path = "rollwire-demo",
    concurrency: int = 32,
    seed: int = 0,
    progress: bool = True,
    exports: bool = True,
) -> DemoResult:
    """Run the demo and write ``out/rollouts.jsonl`` plus one export per installed trainer."""
    from rollwire.data.dataset import write_jsonl
    from rollwire.data.trajectory import build_rows
    from rollwire.engine import EmbeddedEngine, EngineConfig
    from rollwire.envs.wordle import WordleSolver, make_tasks
    from rollwire.gateway import serve_in_thread
    from rollwire.plugins import load_trainer
    from rollwire.trainer.client import RolloutClient
    from rollwire.trainer.runners import LocalRunner

    if tasks < 1 or group_size < 1:
        raise DemoError(
            f"--tasks and --group-size must be at least 1, got {tasks} and {group_size}"
        )
    app = load_demo_agent(agent)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    solver = None if unsteered else WordleSolver(seed=seed)
    started = time.monotonic()
    with (
        EmbeddedEngine(EngineConfig(scripted=solver, seed=seed)) as engine,
        serve_in_thread(backends=[(engine.url, "vllm")]) as gateway,
    ):
        client = RolloutClient(
            gateway,
            runner=LocalRunner(app),
            group_size=group_size,
            sampling=DEMO_SAMPLING,
            concurrency=concurrency,
            deadline=300.0,
            progress=progress,
        )
        groups = client.run(make_tasks(tasks, "train", seed=seed))
        wall = time.monotonic() - started
        rows = build_rows(groups, tokenizer=engine.tokenizer)
    rollouts_path = out_dir / "rollouts.jsonl"
    write_jsonl(rollouts_path, groups)
    result = DemoResult(
        groups,
        rows,
        out_dir,
        rollouts_path,
        wall_s=wall,
        rollout_s=client.stats.wall_s,
        steered=not unsteered,
    )
    if exports:
        for name, skipped in _trainers():
            if skipped is not None:
                result.export_skipped[name] = skipped
                continue
            try:
                adapter = load_trainer(name)
                suffix = getattr(adapter, "export_suffix", ".jsonl")
                result.exports[name] = adapter.export(groups, out_dir / f"{name}{suffix}")
            except Exception as exc:  # one broken adapter must not hide the others' exports
                result.export_errors[name] = f"{type(exc).__name__}: {exc}"
    return result
