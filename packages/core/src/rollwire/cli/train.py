"""``rollwire train``: online RL on one machine — rollouts through the gateway, an update by the
trainer you choose, weights pushed back to the servers and verified after every step, held-out
pass@1 before and after.

The loop is :mod:`rollwire.trainer.loop`, one for every trainer. ``--trainer NAME`` loads that
trainer's plugin (entry point group ``rollwire.trainers``) through the registry, so a machine
without its framework gets one line saying what to install; the plugin's own options follow the
shared ones on the command line (``--help-trainer`` lists them).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from rollwire.cli.errors import fail
from rollwire.cli.run import quiet_logs

__all__ = ["parse_trainer_options", "train"]

console = Console()


def _adapter(trainer: str) -> Any:
    from rollwire.plugins import PluginError, check_requirements, load_trainer

    try:
        adapter = load_trainer(trainer)
    except PluginError as exc:
        raise fail(str(exc)) from exc
    if not callable(getattr(adapter, "policy_trainer", None)):
        raise fail(
            f"the {trainer} plugin converts batches but does not train: rollwire train needs a "
            "trainer plugin with policy_trainer() (rollwire's: trl, verl, tinker, rllm)"
        )
    problems = check_requirements(getattr(adapter, "train_requires", ()))
    if problems:
        hint = getattr(adapter, "install_hint", "")
        raise fail(f"{'; '.join(problems)}. {hint}".strip())
    return adapter


def parse_trainer_options(
    trainer: str, declared: Sequence[Any], args: Sequence[str]
) -> dict[str, Any]:
    """The trainer's own options from the words the shared options left over: ``--flag VALUE``,
    ``--flag=VALUE``, ``--flag``/``--no-flag`` for a switch; the declared defaults for the rest."""
    by_flag = {o.flag: o for o in declared}
    out: dict[str, Any] = {o.name: o.default for o in declared}
    words = list(args)
    while words:
        word = words.pop(0)
        flag, _, inline = word.partition("=")
        negated = flag.startswith("--no-") and f"--{flag[5:]}" in by_flag
        option = by_flag.get(f"--{flag[5:]}" if negated else flag)
        if option is None:
            known = ", ".join(sorted(by_flag)) or "none"
            raise fail(
                f"no such option {word!r} for --trainer {trainer} (its own options: {known}; "
                "rollwire train --help lists the shared ones)"
            )
        if option.kind is bool:
            out[option.name] = not negated
            continue
        if not inline:
            if not words:
                raise fail(f"{flag} needs a value")
            inline = words.pop(0)
        try:
            value = option.kind(inline)
        except ValueError:
            raise fail(f"{flag} {inline!r}: expected {option.kind.__name__}") from None
        if option.choices and value not in option.choices:
            raise fail(f"{flag} {inline!r}: choose one of {', '.join(option.choices)}")
        out[option.name] = value
    return out


def _trainer_help(trainer: str, adapter: Any) -> None:
    console.print(f"options of --trainer {trainer}:", highlight=False)
    for o in getattr(adapter, "train_options", ()):
        choices = f" ({' | '.join(o.choices)})" if o.choices else ""
        console.print(f"  {o.flag:<22} {o.help}{choices} [default: {o.default}]", highlight=False)


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
    table.add_row("rollouts trained on", str(out / "rollouts"))
    table.add_row("report (curves)", str(out / "report.html"))
    return table


def train(
    ctx: typer.Context,
    trainer: str = typer.Option(
        "trl",
        "--trainer",
        metavar="NAME",
        help="The trainer plugin: trl (TRL's GRPO loss in this process), verl (verl's own actor "
        "in this process), tinker (a Tinker service) or rllm (rLLM's Tinker-backend trainer). "
        "Its own options follow the shared ones (--help-trainer lists them).",
    ),
    help_trainer: bool = typer.Option(
        False, "--help-trainer", help="List the options of --trainer NAME and exit."
    ),
    out: Path = typer.Option(
        Path("rollwire-train"),
        "--out",
        "-o",
        metavar="DIR",
        help="Run folder: checkpoints, steps.jsonl, summary.json, final/.",
    ),
    task: str = typer.Option(
        None,
        "--task",
        metavar="NAME",
        help="Built-in task (entry point group rollwire.tasks): lockbox, the default (the "
        "embedded model learns it in minutes), calculator (a two-turn arithmetic task with a "
        "calculator tool, for a real --model), vault (a LangGraph agent with two OpenAI tools, "
        "read a code and open a box with it; for a real --model, with --sft teacher) or relay "
        "(two roles). With --agent: your agent plays the task's tasks and warm-up.",
    ),
    agent: str = typer.Option(
        None,
        "--agent",
        metavar="MODULE:APP",
        help="Your agent's RolloutApp (with --tasks and --eval-tasks, or on a built-in --task).",
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
        help="Hugging Face model folder to start from (default: the embedded engine's model "
        "after a supervised warm-up). Without --backend the embedded engine serves it: Mixtral, "
        "Llama (SmolLM2), Mistral, Qwen2 and Qwen3 folders.",
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
        None,
        "--lr",
        metavar="LR",
        help="AdamW learning rate of the RL phase. Default: 1e-3 for the embedded engine's model; "
        "with --model 1e-5 (full weights) or 1e-4 (--lora-rank).",
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
        help="Train LoRA adapters of rank R (alpha 2R); trl syncs the adapter alone, loaded by "
        "name (--lora-sync merged: the merged model). Default: the trainer's (trl: 0, the full "
        "weights; tinker: 8).",
    ),
    roles: str = typer.Option(
        None,
        "--roles",
        metavar="A,B",
        help="One policy per role: the model name each call asks for is its role; each role "
        "trains its own LoRA adapter on its own calls, served as ROLE@VERSION (needs "
        "--lora-rank; steps.jsonl records each role under 'roles').",
    ),
    temperature: float = typer.Option(
        1.0,
        "--temperature",
        metavar="T",
        help="Sampling temperature of every call (the trainer scores at the same one).",
    ),
    max_tokens: int = typer.Option(
        None,
        "--max-tokens",
        min=1,
        metavar="N",
        help="Max tokens per model call (default: what the agent asks for).",
    ),
    top_p: float = typer.Option(
        None, "--top-p", metavar="P", help="top_p of every call (default: the agent's)."
    ),
    sft: Path = typer.Option(
        None,
        "--sft",
        dir_okay=False,
        metavar="PATH",
        help='Supervised warm-up on these conversations (JSONL: {"messages": [...], "tools": '
        "[...]} per line, OpenAI format, tool calls included) before RL, for any model; "
        "--warmup-steps steps. `--sft teacher`: the built-in task's teacher conversations "
        "(written to OUT/sft.jsonl).",
    ),
    warmup_steps: int = typer.Option(
        150,
        "--warmup-steps",
        min=0,
        metavar="N",
        help="Supervised warm-up steps: on --sft's conversations, else on the built-in task's "
        "teacher (the embedded model only).",
    ),
    warmup_learning_rate: float = typer.Option(
        None,
        "--warmup-lr",
        metavar="LR",
        help="AdamW learning rate of the warm-up. Default: 3e-3 for the embedded engine's "
        "model, 1e-4 with --model.",
    ),
    warmup_batch_size: int = typer.Option(
        None,
        "--warmup-batch-size",
        min=1,
        metavar="N",
        help="Conversations per warm-up step. Default: 32 for the embedded engine's model, 8 "
        "with --model (--micro-batch-size splits either).",
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
    concurrency: int = typer.Option(
        64,
        "--concurrency",
        min=1,
        metavar="N",
        help="Rollouts run at once (training and held-out evaluation).",
    ),
    deadline: float = typer.Option(
        300.0,
        "--deadline",
        min=1.0,
        metavar="S",
        help="Seconds one rollout may take; a rollout past it fails (in an evaluation it "
        "counts as a miss, and the run says how many did).",
    ),
    scale_advantages: bool = typer.Option(
        True,
        "--scale-advantages/--no-scale-advantages",
        help="Divide each rollout's advantage (reward minus its group's mean) by the group's "
        "standard deviation.",
    ),
    failed_rollouts: str = typer.Option(
        "baseline",
        "--failed-rollouts",
        metavar="HOW",
        help="A rollout that did not complete trains no token; baseline: its reward (0) counts "
        "in its group's mean; drop: it is left out of the group.",
    ),
    micro_batch_size: int = typer.Option(
        0,
        "--micro-batch-size",
        min=0,
        metavar="N",
        help="Rows per forward/backward pass, gradients accumulated over the step (0: all).",
    ),
    bf16: bool = typer.Option(
        False, "--bf16", help="Train in bfloat16 (the probe's tolerance widens to match)."
    ),
    verify_tolerance: float = typer.Option(
        None,
        "--verify-tolerance",
        metavar="X",
        help="Largest |server - trainer| log-prob a verified push may show (default: from the "
        "serving and training dtypes).",
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
    metrics: str = typer.Option(
        None, "--metrics", metavar="SINK", help="tensorboard:DIR, mlflow:URI or wandb:DIR."
    ),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
    verbose: bool = typer.Option(
        False, "--verbose", "-v", help="Log rollwire's and TRL's messages."
    ),
) -> None:
    """Train the policy with GRPO on rollouts captured by the gateway (TRL in this process, a
    Tinker service, or any trainer plugin), pushing and verifying the servers' weights after
    every step; report held-out pass@1 before step 1 and after the last."""
    if not help_trainer:
        own_tasks = tasks is not None or eval_tasks is not None
        if own_tasks and (agent is None or tasks is None or eval_tasks is None):
            raise fail(
                "--agent, --tasks and --eval-tasks go together (the built-in --task needs none)"
            )
        if agent is not None and not own_tasks and task is None:
            raise fail(
                "--agent plays --tasks and --eval-tasks, or a built-in --task's tasks: give "
                "--tasks and --eval-tasks, or --task"
            )
        if failed_rollouts not in ("baseline", "drop"):
            raise fail(f"--failed-rollouts {failed_rollouts!r}: choose baseline or drop")
    task = task or "lockbox"
    adapter = _adapter(trainer)
    if help_trainer:
        _trainer_help(trainer, adapter)
        raise typer.Exit()
    own = parse_trainer_options(trainer, getattr(adapter, "train_options", ()), ctx.args)
    if not verbose:  # the step lines say what happens; library chatter would bury them
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        warnings.filterwarnings("ignore", category=FutureWarning)
    quiet_logs(verbose)
    from rollwire.trainer.loop import RunSpec, default_rates, run
    from rollwire.trainer.roles import check_roles
    from rollwire.trainer.weight_sync import WeightSyncError

    if sft is not None and str(sft) != "teacher" and not sft.is_file():
        raise fail(f"--sft {sft}: no such file (or `--sft teacher` for the task's teacher)")
    shared = {k: v for k, v in locals().items() if k in RunSpec.__dataclass_fields__}
    for key, value in default_rates(model, lora_rank).items():
        if shared.get(key) is None:
            shared[key] = value
    shared["tasks"], shared["eval_tasks"] = _tasks(tasks), _tasks(eval_tasks)
    try:
        shared["roles"] = check_roles(roles.split(",")) if roles else None
    except ValueError as exc:
        raise fail(str(exc)) from exc
    spec = RunSpec(
        **shared,
        options=own,
        log=lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True),
    )
    try:
        result = run(spec, adapter.policy_trainer(spec))
    except ValueError as exc:
        raise fail(str(exc)) from exc
    except WeightSyncError as exc:
        first = str(exc).splitlines()
        detail = first[1].strip() if len(first) > 1 else ""
        raise fail(
            f"weight sync failed: {first[0]} {detail} (steps.jsonl and the checkpoints so far are "
            f"in {out}; --resume continues from the newest)",
            code=1,
        ) from exc
    console.print(_summary(result, out))
