"""The ``rollwire`` command line: engine, gateway, run, export, demo, doctor, inspect, eval,
train, plugins.

Each command lives next to the code it drives and is registered below, one line each. Help is
plain click formatting (readable at 80 columns and when piped); expected errors end in one line
(:mod:`rollwire.cli.errors`).
"""

from __future__ import annotations

import os

import typer

from rollwire import __version__
from rollwire.cli import commands, plugins, run, train
from rollwire.cli.doctor import doctor_command
from rollwire.cli.engine import engine_app
from rollwire.cli.errors import run_app
from rollwire.cli.eval import evaluate as eval_command
from rollwire.cli.gateway import gateway_app
from rollwire.cli.inspect import inspect as inspect_command
from rollwire.models.cli import models_app

__all__ = ["app", "main"]

app = typer.Typer(
    name="rollwire",
    help="Online RL for production LLM agents: capture every model call, train with "
    "TRL, verl, slime or rLLM.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"max_content_width": 100},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"rollwire {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """rollwire: online RL for production LLM agents."""


app.add_typer(engine_app, name="engine")
app.add_typer(gateway_app, name="gateway")
app.add_typer(models_app, name="models")
app.command("run")(run.run)
app.command("export")(commands.export)
app.command("demo")(commands.demo)
app.command("doctor")(doctor_command)
app.command("inspect")(inspect_command)
app.command("eval")(eval_command)
# a trainer plugin's own options follow the shared ones: parsed by train() against the plugin
app.command("train", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(
    train.train
)
app.command("plugins")(plugins.plugins)


def main() -> None:
    """Console-script entry point."""
    # transformers prints a "PyTorch was not found" banner on import; rollwire never needs torch
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    run_app(app)
