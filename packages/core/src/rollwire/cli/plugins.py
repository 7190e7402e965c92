"""``rollwire plugins``: the installed trainer and agent adapters and what each can do here.

Plain lines, not a table: the reason and the install hint wrap onto their own indented lines, so
nothing is cut at 80 columns or when piped; ``--json`` gives the same facts to scripts.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import textwrap

import typer

from rollwire.cli.errors import fail

__all__ = ["plugins", "state_of"]

_COLORS = {"ok": "green", "export only": "cyan", "disabled": "white"}


def state_of(info: object) -> str:
    """What a plugin can do here: ``ok``, ``export only``, or its problem (``missing``...)."""
    status = str(getattr(info, "status", "error"))
    return "export only" if status == "ok" and getattr(info, "export_only", False) else status


def plugins(
    as_json: bool = typer.Option(False, "--json", help="Print the plugins as a JSON list."),
) -> None:
    """List trainer and agent adapters, and whether their frameworks are installed."""
    from rollwire.plugins import DISABLE_ENV, PluginError, discover

    try:
        found = discover()
    except PluginError as exc:
        raise fail(str(exc)) from exc
    if as_json:
        rows = [{**dataclasses.asdict(info), "state": state_of(info)} for info in found]
        typer.echo(json.dumps(rows, indent=2))
        return
    width = max(60, min(shutil.get_terminal_size((80, 24)).columns, 120))
    name_w = max((len(i.name) for i in found), default=4) + 2
    state_w = max((len(state_of(i)) for i in found), default=2) + 2
    indent = " " * (2 + name_w + state_w)
    for kind in ("trainers", "agents"):
        typer.secho(kind, bold=True)
        infos = [i for i in found if i.kind == kind]
        if not infos:
            typer.echo("  (none installed)")
        for info in infos:
            state = state_of(info)
            styled = typer.style(state.ljust(state_w), fg=_COLORS.get(state, "yellow"))
            typer.echo(f"  {info.name.ljust(name_w)}{styled}{info.distribution} {info.version}")
            for part in filter(None, (p.strip() for p in info.detail.split("; "))):
                typer.echo(
                    textwrap.fill(
                        part,
                        width=width,
                        initial_indent=indent,
                        subsequent_indent=indent + "  ",
                        break_long_words=False,
                        break_on_hyphens=False,
                    )
                )
    typer.echo(f"\nturn a plugin off with {DISABLE_ENV}=name[,name]")
