"""``rollwire train``: online RL on one machine — rollouts through the gateway, GRPO updates by TRL,
weights pushed back to the server after every step, held-out pass@1 before and after.

The loop itself lives in the trainer's adapter (``--trainer trl``: ``rollwire-trl``, installed
with ``rollwire[trl]``; ``--trainer tinker``: ``rollwire-tinker``, a Tinker service):
this module only reads the options and loads that adapter through the plugin registry, so a
machine without torch gets one line saying what to install.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from rollwire.cli.errors import fail
from rollwire.cli.run import quiet_logs

__all__ = ["INSTALL_HINT", "train"]

console = Console()

#: how to get TRL and a CPU-only torch (printed when the trl plugin cannot load)
INSTALL_HINT = (
    "rollwire train needs TRL and torch. CPU-only torch first, then the extra: "
    "pip install torch --index-url https://download.pytorch.org/whl/cpu && "
    'pip install "rollwire[trl]"; in a rollwire checkout, bash '
    "packages/adapter-trl/ci/setup-venv.sh builds .venv-trl (then run .venv-trl/bin/rollwire train)"
)


#: the same for ``--trainer tinker``
TINKER_HINT = (
    "rollwire train --trainer tinker needs the Tinker SDK (and SkyRL for a server started "
    'here): pip install "rollwire[tinker]" "tinker==0.18.2" "skyrl[tinker,jax]==0.3.0"; in a '
    "rollwire checkout, bash packages/adapter-tinker/ci/setup-venv.sh builds .venv-tinker"
)
_HINTS = {"trl": INSTALL_HINT, "tinker": TINKER_HINT}


def _adapter(trainer: str) -> Any:
    from rollwire.plugins import PluginError, check_requirements, load_trainer

    hint = _HINTS.get(trainer)
    if hint is None:
        raise fail(f"--trainer {trainer!r}: choose one of {sorted(_HINTS)}")
    try:
        adapter = load_trainer(trainer)
    except PluginError as exc:
        raise fail(f"{exc}. {hint}") from exc
    if not callable(getattr(adapter, "train", None)):
        raise fail(f"the installed {trainer} plugin has no train(): upgrade rollwire-{trainer}")
    problems = check_requirements(getattr(adapter, "train_requires", ()))
    if problems:
        raise fail(f"{'; '.join(problems)}. {hint}")
    return adapter


def _tasks(path: Path | None) -> list[dict[str, Any]] | None:
    if path is None:
        return None
    from rollwire.data.tasks import read_tasks

    try:
        tasks = read_tasks(path)
    except ValueError as exc:
        raise fail(str(exc)) from exc
    if not tasks:
        raise fail(f"{path} holds no tasks: write one JSON object per line")
    return tasks


def _summary(result: Any, out: Path) -> Table:
    b, f = result.baseline, result.final
    table = Table(title=f"rollwire train → {out}", show_header=False)
    table.add_row(
        "held-out pass@1 before",
        f"{b.pass_at_1:.3f}  [{b.pass_at_1_low:.3f}, {b.pass_at_1_high:.3f}]",
    )
    table.add_row(
        "held-out pass@1 after",
        f"{f.pass_at_1:.3f}  [{f.pass_at_1_low:.3f}, {f.pass_at_1_high:.3f}]",
    )
    table.add_row("held-out mean reward", f"{b.mean_reward:.3f} → {f.mean_reward:.3f}")
    table.add_row("attempts per evaluation", f"{f.attempts} ({f.tasks} tasks)")
    table.add_row("steps", str(len(result.steps)))
    if result.policy.warmup_steps:
        table.add_row("supervised warm-up", f"{result.policy.warmup_steps} steps before RL")
    table.add_row("wall time", f"{result.wall_s:.0f} s")
    table.add_row("trained policy", str(result.final_dir))
    table.add_row("per-step log", str(out / "steps.jsonl"))
    table.add_row("report (curves)", str(out / "report.html"))
    return table


def train(
    trainer: str = typer.Option(
        "trl",
        "--trainer",
        metavar="NAME",
        help="trl (GRPO in this process) or tinker (a Tinker service: --base-url, or SkyRL's "
        "server started here).",
    ),
    base_url: str = typer.Option(
        None,
        "--base-url",
        metavar="URL",
        help="--trainer tinker: the Tinker service (default: start SkyRL's server here).",
    ),
    base_model: str = typer.Option(
        None,
        "--base-model",
        metavar="NAME",
        help="--trainer tinker: the service's model to train (with --base-url).",
    ),
    loss_fn: str = typer.Option(
        "importance_sampling",
        "--loss-fn",
        metavar="NAME",
        help="--trainer tinker: importance_sampling or ppo.",
    ),
    out: Path = typer.Option(
        Path("rollwire-train"),
        "--out",
        "-o",
        metavar="DIR",
        help="Run folder: checkpoints, steps.jsonl, summary.json, final/.",
    ),
    task: str = typer.Option(
        "lockbox",
        "--task",
        metavar="NAME",
        help="Built-in task: lockbox (the embedded model learns it in minutes) or calculator "
        "(a two-turn arithmetic task with a calculator tool, for a real --model).",
    ),
    agent: str = typer.Option(
        None,
        "--agent",
        metavar="MODULE:APP",
        help="Your agent's RolloutApp (with --tasks and --eval-tasks).",
    ),
    tasks: Path = typer.Option(
        None,
        "--tasks",
        exists=True,
        metavar="PATH",
        help="Training tasks (JSONL, JSON, CSV, Parquet).",
    ),
    eval_tasks: Path = typer.Option(
        None,
        "--eval-tasks",
        exists=True,
        metavar="PATH",
        help="Held-out tasks evaluated every --eval-every steps.",
    ),
    model: Path = typer.Option(
        None,
        "--model",
        exists=True,
        file_okay=False,
        metavar="DIR",
        help="Hugging Face model folder to start from (default: the embedded engine's model after a supervised warm-up).",
    ),
    backend: str = typer.Option(
        None,
        "--backend",
        metavar="URL",
        help="A vLLM server (VLLM_SERVER_DEV_MODE=1) serving --model, instead of the embedded engine.",
    ),
    steps: int = typer.Option(40, "--steps", min=1, metavar="N", help="Optimizer steps."),
    tasks_per_step: int = typer.Option(
        4, "--tasks-per-step", min=1, metavar="N", help="Task groups rolled out per step."
    ),
    group_size: int = typer.Option(
        8, "--group-size", "-n", min=2, metavar="N", help="Rollouts per task (the GRPO group)."
    ),
    learning_rate: float = typer.Option(
        1e-3, "--lr", metavar="LR", help="AdamW learning rate of the RL phase."
    ),
    beta: float = typer.Option(
        0.0,
        "--beta",
        metavar="B",
        help="KL penalty to the starting policy (0: none, as TRL's default).",
    ),
    lora_rank: int = typer.Option(
        None,
        "--lora-rank",
        min=0,
        metavar="R",
        help="Train LoRA adapters of rank R on every linear layer (TRL: needs peft, alpha 2R, the "
        "servers get the merged weights; default 0, the full weights. Tinker: default 8).",
    ),
    temperature: float = typer.Option(
        1.0, "--temperature", metavar="T", help="Sampling temperature (TRL scores at the same one)."
    ),
    max_tokens: int = typer.Option(
        8, "--max-tokens", metavar="N", help="Max tokens per model call."
    ),
    warmup_steps: int = typer.Option(
        150,
        "--warmup-steps",
        min=0,
        metavar="N",
        help="Supervised warm-up steps on the task's teacher conversations (the embedded model only).",
    ),
    teacher_accuracy: float = typer.Option(
        0.3,
        "--teacher-accuracy",
        min=0.0,
        max=1.0,
        metavar="P",
        help="How often the warm-up's teacher is right.",
    ),
    eval_every: int = typer.Option(
        5,
        "--eval-every",
        min=0,
        metavar="N",
        help="Held-out evaluation every N steps (0: only before and after).",
    ),
    eval_size: int = typer.Option(
        64, "--eval-size", min=1, metavar="N", help="Held-out tasks of the built-in task."
    ),
    eval_k: int = typer.Option(
        4, "--eval-k", min=1, metavar="K", help="Attempts per held-out task."
    ),
    importance_sampling: str = typer.Option(
        "token_truncate",
        "--importance-sampling",
        metavar="MODE",
        help="TRL's correction against the captured log-probs: token_truncate, token_mask, sequence_truncate, sequence_mask or off.",
    ),
    async_rollouts: bool = typer.Option(
        False,
        "--async",
        help="Roll out the next step's batch while this one trains (off-policy by up to "
        "--max-staleness versions; TRL's importance sampling corrects for it).",
    ),
    max_staleness: int = typer.Option(
        1,
        "--max-staleness",
        min=0,
        metavar="N",
        help="With --async: rollouts start at most N policy versions behind the trainer (the "
        "gateway holds the rest).",
    ),
    save_every: int = typer.Option(
        5, "--save-every", min=1, metavar="N", help="Checkpoint every N steps."
    ),
    seed: int = typer.Option(
        0, "--seed", metavar="INT", help="Seed of the model, the tasks and the trainer."
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue the run in --out from its newest checkpoint."
    ),
    threads: int = typer.Option(
        1,
        "--threads",
        min=1,
        metavar="N",
        help="torch threads: the embedded model's ops are too small to gain from more (and lose "
        "a lot on a busy machine); raise it for a real --model.",
    ),
    metrics: str = typer.Option(
        None, "--metrics", metavar="SINK", help="tensorboard:DIR, mlflow:URI or wandb:DIR."
    ),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
    verbose: bool = typer.Option(
        False, "--verbose", "-v", help="Log rollwire's and TRL's messages."
    ),
) -> None:
    """Train the policy with GRPO (TRL, or a Tinker service with --trainer tinker) on rollouts
    captured by the gateway, syncing the server's weights after every step; report held-out
    pass@1 before step 1 and after the last."""
    if (agent is None) != (tasks is None) or (agent is not None and eval_tasks is None):
        raise fail("--agent, --tasks and --eval-tasks go together (the built-in --task needs none)")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func's notice, every run
    if not verbose:  # the step lines say what happens; library chatter would bury them
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        warnings.filterwarnings("ignore", category=FutureWarning)
    quiet_logs(verbose)
    if trainer == "trl" and (base_url is not None or base_model is not None):
        raise fail("--base-url and --base-model go with --trainer tinker")
    if trainer == "tinker" and lora_rank == 0:
        raise fail("--trainer tinker trains LoRA adapters: --lora-rank must be at least 1")
    if trainer == "tinker" and async_rollouts:
        raise fail("--async goes with --trainer trl (the Tinker loop samples on-policy)")
    lora_rank = (8 if trainer == "tinker" else 0) if lora_rank is None else lora_rank
    adapter = _adapter(trainer)
    tinker_only = {"base_url": base_url, "base_model": base_model, "loss_fn": loss_fn}
    if trainer == "trl":
        import torch

        torch.set_num_threads(threads)
    skip = {"adapter", "threads", "torch", "trainer", "tinker_only", "skip"}
    if trainer == "trl":
        skip.update(tinker_only)
    else:
        skip.update({"async_rollouts", "max_staleness"})
    options = {k: v for k, v in locals().items() if k not in skip}
    options["tasks"], options["eval_tasks"] = _tasks(tasks), _tasks(eval_tasks)
    options["log"] = lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True)
    try:
        result = adapter.train(**options)
    except ValueError as exc:
        raise fail(str(exc)) from exc
    console.print(_summary(result, out))
