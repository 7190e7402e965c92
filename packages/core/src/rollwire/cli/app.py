"""The ``rollwire`` command line: engine, gateway, run, export, demo, doctor, plugins."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rollwire import __version__
from rollwire.cli import commands
from rollwire.cli.doctor import doctor_command
from rollwire.cli.engine import engine_app
from rollwire.cli.eval import evaluate as eval_command
from rollwire.cli.gateway import gateway_app
from rollwire.cli.inspect import inspect as inspect_command

app = typer.Typer(
    name="rollwire",
    help="Online RL for production LLM agents: capture every model call, train with verl/slime/rLLM.",
    no_args_is_help=True,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        Console().print(f"rollwire {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """rollwire: online RL for production LLM agents."""


@app.command()
def plugins() -> None:
    """List trainer and agent adapters, and whether their frameworks are installed."""
    from rollwire.plugins import PluginError, discover

    console = Console()
    try:
        found = discover()
    except PluginError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from exc
    table = Table(title="rollwire plugins")
    for col in ("name", "kind", "distribution", "version", "status"):
        table.add_column(col, no_wrap=True)
    table.add_column("detail", overflow="fold")
    for info in found:
        status = "[green]ok[/green]" if info.status == "ok" else f"[yellow]{info.status}[/yellow]"
        table.add_row(
            info.name, info.kind[:-1], info.distribution, info.version, status, escape(info.detail)
        )
    console.print(table)


# Sub-commands live next to the code they drive; each module exposes a typer app or a command.
app.add_typer(engine_app, name="engine")
app.add_typer(gateway_app, name="gateway")
app.command("run")(commands.run)
app.command("export")(commands.export)
app.command("demo")(commands.demo)
app.command("doctor")(doctor_command)
app.command("inspect")(inspect_command)
app.command("eval")(eval_command)


def main() -> None:
    """Console-script entry point."""
    app()
