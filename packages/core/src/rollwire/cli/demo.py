"""``rollwire demo``: Wordle end to end on a laptop — embedded engine, gateway, agent, trainer exports.

No GPU, no downloads. The embedded engine is a small random-weight model, so by default it is
*steered*: a scripted Wordle solver chooses each guess and the engine teacher-forces it, while the
log-probs recorded stay the model's own for those tokens. ``--unsteered`` lets the raw model
sample (expect no valid guesses and a reward of -1.5 everywhere).
"""

from __future__ import annotations

import importlib
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollwire.data.protocol import Group, Row

__all__ = ["AGENTS", "DemoError", "DemoResult", "load_demo_agent", "run_demo"]

#: Demo agents by name: ``module:attr`` of a RolloutApp. Adding an agent is one line here.
AGENTS: dict[str, str] = {
    "openai": "rollwire.envs.wordle.agent_openai:app",
    "strands": "rollwire.envs.wordle.agent_strands:app",
    "langgraph": "rollwire.envs.wordle.agent_langgraph:app",
}
#: Sampling for every session: a cap on tokens keeps the unsteered (random) model quick.
DEMO_SAMPLING: dict[str, Any] = {"temperature": 1.0, "max_tokens": 48}
#: What a trainer adapter's framework needs beyond ``pip install rollwire[NAME]``, by adapter.
_FRAMEWORK_HINTS = {
    "verl": (
        "install them in a venv of their own, CPU torch first: pip install torch "
        '--index-url https://download.pytorch.org/whl/cpu && pip install "rollwire[verl]" '
        "(inside a uv project, `uv add`/`uv pip install` of torch pulls a multi-GB CUDA build)"
    ),
}
_NOT_INSTALLED = re.compile(r"(\S+) is not installed")


class DemoError(RuntimeError):
    """The demo cannot run as asked (unknown agent, its framework missing)."""


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
        """The numbers of the summary table (:func:`rollwire.cli.summary.summarize`, plus turns
        and calls per second)."""
        from rollwire.cli.summary import summarize

        s = summarize(self.groups, self.rows, self.wall_s)
        n = max(1, s["rollouts"])
        s["turns_per_rollout"] = s["calls"] / n
        s["rows_per_rollout"] = s["rows"] / n
        s["calls_per_s"] = s["calls"] / self.rollout_s if self.rollout_s > 0 else float("nan")
        return s


def load_demo_agent(name: str) -> Any:
    """The RolloutApp of demo agent ``name``; raises :class:`DemoError` saying what is missing."""
    from rollwire.plugins import PluginError, load_agent

    target = AGENTS.get(name)
    if target is None:
        raise DemoError(f"unknown demo agent {name!r}; choose one of: {', '.join(sorted(AGENTS))}")
    try:
        load_agent(name)  # the framework and rollwire's adapter for it are installed
    except PluginError as exc:
        raise DemoError(
            f"the {name!r} demo agent needs its framework and adapter: "
            f'pip install "rollwire[{name}]" ({exc})'
        ) from exc
    module, _, attr = target.partition(":")
    mod = importlib.import_module(module)
    try:
        return getattr(mod, attr)
    except AttributeError as exc:
        raise DemoError(f"{module} defines no {attr!r} (expected a RolloutApp)") from exc


def _trainers() -> Iterable[tuple[str, str | None]]:
    """Every trainer adapter, with None when it can export here, else what to install."""
    from rollwire.plugins import discover

    for info in discover("trainers"):
        if info.status == "ok":
            yield info.name, None
        elif info.status == "missing":
            missing = _NOT_INSTALLED.findall(info.detail)
            how = _FRAMEWORK_HINTS.get(info.name, f'pip install "rollwire[{info.name}]"')
            yield info.name, f"needs {', '.join(missing) or 'its framework'}: {how}"
        else:
            yield info.name, info.detail or info.status


def _export(adapter: Any, groups: list[Group], path: Path, options: dict[str, Any]) -> Path:
    """``adapter.export`` with the engine's tokenizer and pad id, minus the options it does not
    take (each adapter passes ``**options`` to its own converter)."""
    options = dict(options)
    while True:
        try:
            return Path(adapter.export(groups, path, **options))
        except TypeError as exc:
            rejected = [k for k in options if f"'{k}'" in str(exc)]
            if not rejected:
                raise
            options.pop(rejected[0])


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
    config = EngineConfig(scripted=solver, seed=seed, return_routed_experts=True)
    with (
        EmbeddedEngine(config) as engine,
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
            # Frameworks that stream (Strands, LangGraph) still get routing: the gateway asks
            # the engine non-streamed and re-streams the answer.
            session_options={"routed_experts": True},
        )
        groups = client.run(make_tasks(tasks, "train", seed=seed))
        wall = time.monotonic() - started
        rows = build_rows(groups, tokenizer=engine.tokenizer)
        tokenizer = engine.tokenizer
    export_options = {"tokenizer": tokenizer, "pad_token_id": tokenizer.pad_id}
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
                path = out_dir / f"{name}{suffix}"
                result.exports[name] = _export(adapter, groups, path, export_options)
            except Exception as exc:  # one broken adapter must not hide the others' exports
                result.export_errors[name] = f"{type(exc).__name__}: {exc}"
    return result
