"""``rollwire doctor``: does a chat template keep multi-turn rollouts token-faithful?

Plays synthetic conversations through the template, the way an agent does: render turn k's prompt,
append the assistant tokens as the model would sample them, let a typical client send the reply
back (reasoning dropped, tool-call arguments re-serialized), render turn k+1. Passthrough capture
holds when each prompt extends the previous prompt + completion; where it does not, the fork is
located and classified (:func:`rollwire.data.trajectory.classify_fork`). Tokens mode holds when healing
continues every turn and its rendered suffix equals what the template puts there.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import typer

from rollwire.data.arrays import common_prefix_len
from rollwire.data.trajectory import classify_fork
from rollwire.gateway.tokens.heal import Healer
from rollwire.gateway.tokens.parsers import detect_parser, parse_completion
from rollwire.gateway.tokens.render import ChatRenderer

__all__ = ["CaseReport", "DoctorReport", "diagnose", "doctor_command", "print_report"]


@dataclass
class _Turn:
    before: list[dict[str, Any]]  # messages the agent adds before this call
    sampled: str  # what the model writes (without the closing eos token)
    edit: Callable[[list[dict[str, Any]]], list[dict[str, Any]]] | None = None


@dataclass
class _Case:
    name: str
    description: str
    turns: list[_Turn]
    tools: list[dict[str, Any]] | None = None
    expected_fork: bool = False  # history is edited on purpose: both modes must start a new branch


@dataclass
class CaseReport:
    """How one synthetic conversation fares in passthrough and tokens mode."""

    name: str
    description: str
    turns: int
    passthrough_prefix: bool
    tokens_holds: bool
    expected_fork: bool = False
    fork_turn: int | None = None
    fork_kind: str | None = None
    fork_position: int | None = None
    fork_context: str | None = None
    tokens_detail: str = ""


@dataclass
class DoctorReport:
    """The verdict on one chat template."""

    source: str | None
    parser: str | None
    eos_token: str | None
    cases: list[CaseReport] = field(default_factory=list)

    @property
    def tokens_ok(self) -> bool:
        """True when tokens mode holds for every case."""
        return all(c.tokens_holds for c in self.cases)

    @property
    def passthrough_ok(self) -> bool:
        """True when passthrough re-rendering stays a prefix for every case that should."""
        return all(c.passthrough_prefix for c in self.cases if not c.expected_fork)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "source": self.source,
            "parser": self.parser,
            "eos_token": self.eos_token,
            "tokens_ok": self.tokens_ok,
            "passthrough_ok": self.passthrough_ok,
            "cases": [asdict(c) for c in self.cases],
        }


_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the catalogue.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "filters": {"type": "object"},
                },
                "required": ["query"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "book",
            "description": "Book an item.",
            "parameters": {"type": "object", "properties": {"item": {"type": "integer"}}},
        },
    },
]


def _tool_call(name: str, args: dict[str, Any], compact: bool = False) -> str:
    payload = {"name": name, "arguments": args}
    text = json.dumps(payload, separators=(",", ":") if compact else None, ensure_ascii=False)
    return f"<tool_call>\n{text}\n</tool_call>"


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def _tool(text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": "call_0", "content": text}


def _change_system(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = list(msgs)
    out[0] = {"role": "system", "content": "You are a terse assistant. Today is Tuesday."}
    return out


def _cases() -> list[_Case]:
    nested = {
        "query": "red shoes",
        "filters": {"size": [42, 43], "brand": {"in": ["Ünïcode", "x"]}},
    }
    return [
        _Case(
            "plain multi-turn",
            "three user/assistant turns, no tools, no reasoning",
            [
                _Turn(
                    [{"role": "system", "content": "You are helpful."}, _user("Hi!")],
                    "Hello! How can I help?",
                ),
                _Turn([_user("Name a colour.")], "Blue."),
                _Turn([_user("Another one?")], "Green."),
            ],
        ),
        _Case(
            "tool calls, nested arguments",
            "tool calls with nested JSON arguments, written the way the template prints them",
            [
                _Turn([_user("Find red shoes in size 42 or 43.")], _tool_call("search", nested)),
                _Turn([_tool('[{"id": 7, "name": "Runner"}]')], _tool_call("book", {"item": 7})),
                _Turn([_tool('{"ok": true}')], "Booked the Runner (item 7)."),
            ],
            tools=_TOOLS,
        ),
        _Case(
            "tool-call JSON spacing",
            "the model writes compact JSON; clients and templates re-serialize it with spaces",
            [
                _Turn(
                    [_user("Find red shoes.")],
                    _tool_call("search", {"query": "red shoes"}, compact=True),
                ),
                _Turn([_tool("[]")], "Nothing found."),
            ],
            tools=_TOOLS,
        ),
        _Case(
            "reasoning blocks",
            "<think> reasoning before answers and tool calls; clients drop it from history",
            [
                _Turn(
                    [_user("Find red shoes.")],
                    "<think>\nI should search the catalogue.\n</think>\n\n"
                    + _tool_call("search", {"query": "red shoes"}),
                ),
                _Turn([_tool('[{"id": 7}]')], "<think>\nOne result.\n</think>\n\nI found item 7."),
                _Turn(
                    [_user("Book it.")],
                    "<think>\nBook item 7.\n</think>\n\n" + _tool_call("book", {"item": 7}),
                ),
                _Turn([_tool('{"ok": true}')], "Done."),
            ],
            tools=_TOOLS,
        ),
        _Case(
            "system prompt change",
            "the agent edits its system prompt mid-rollout (history edit: a new branch is expected)",
            [
                _Turn([{"role": "system", "content": "You are helpful."}, _user("Hi!")], "Hello!"),
                _Turn([_user("What day is it?")], "Tuesday.", edit=_change_system),
            ],
            expected_fork=True,
        ),
    ]


def _client_reply(message: dict[str, Any]) -> dict[str, Any]:
    # What agent frameworks send back: no reasoning, arguments re-serialized by json.dumps.
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    calls = message.get("tool_calls") or []
    if calls:
        out["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {
                    "name": c["function"]["name"],
                    "arguments": json.dumps(json.loads(c["function"]["arguments"])),
                },
            }
            for c in calls
        ]
    return out


def _snippet(renderer: ChatRenderer, ids: np.ndarray, pos: int) -> str:
    text = renderer.decode(ids[max(pos - 6, 0) : pos + 10])
    return text.replace("\n", "\\n")


def _run_case(renderer: ChatRenderer, case: _Case) -> CaseReport:
    parser = detect_parser(renderer.chat_template)
    healer = Healer(renderer)
    eos = [] if renderer.eos_id is None else [renderer.eos_id]
    history: list[dict[str, Any]] = []
    report = CaseReport(
        case.name, case.description, len(case.turns), True, True, case.expected_fork
    )
    prev: np.ndarray | None = None
    problems: list[str] = []
    forks = 0
    for k, turn in enumerate(case.turns):
        history = history + turn.before
        if turn.edit is not None:
            history = turn.edit(history)
        full = renderer.render(history, case.tools)
        if prev is not None and report.passthrough_prefix:
            pos = common_prefix_len(prev, full)
            if pos < prev.shape[0]:
                report.passthrough_prefix = False
                report.fork_turn = k
                report.fork_position = pos
                report.fork_kind = classify_fork(prev, full, pos, renderer)
                report.fork_context = (
                    f"sampled: «{_snippet(renderer, prev, pos)}» / re-rendered: "
                    f"«{_snippet(renderer, full, pos)}»"
                )
        heal = healer.prompt(history, case.tools)
        if k > 0:
            if not heal.healed:
                forks += 1
                if not case.expected_fork:
                    problems.append(f"turn {k}: not healed ({heal.fork_reason})")
            elif not np.array_equal(
                full[full.shape[0] - heal.suffix_ids.shape[0] :], heal.suffix_ids
            ):
                problems.append(f"turn {k}: healed suffix differs from the template's rendering")
        completion = np.concatenate([renderer.encode(turn.sampled), np.asarray(eos, np.int32)])
        if case.tools and parser is None:
            problems.append("no tool-call parser matches this template")
            break
        parsed = parse_completion(turn.sampled, parser, case.tools)
        if parsed.ill_formed:
            problems.append(
                f"turn {k}: the {parser.name if parser else 'default'} parser cannot read the completion ({parsed.error})"
            )
        message = parsed.message()
        healer.record(heal, history, case.tools, None, completion, message)
        history = [*history, _client_reply(message)]
        prev = np.concatenate([full, completion])
    if case.expected_fork and forks == 0:
        problems.append("the edited history was healed instead of starting a new branch")
    report.tokens_holds = not problems
    report.tokens_detail = (
        "; ".join(problems)
        if problems
        else ("new branch detected, as expected" if case.expected_fork else "healed every turn")
    )
    return report


def diagnose(renderer: ChatRenderer) -> DoctorReport:
    """Run every synthetic case through ``renderer``'s chat template (pure: no I/O, no printing)."""
    parser = detect_parser(renderer.chat_template)
    eos = None if renderer.eos_id is None else renderer.decode([renderer.eos_id])
    report = DoctorReport(
        source=renderer.source, parser=parser.name if parser else None, eos_token=eos
    )
    for case in _cases():
        report.cases.append(_run_case(renderer, case))
    return report


def print_report(report: DoctorReport, console: Any = None) -> None:
    """Print ``report`` as a Rich table with a one-line verdict per mode."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title=f"rollwire doctor: {report.source}", show_lines=True)
    table.add_column("case")
    table.add_column("passthrough (re-render)")
    table.add_column("tokens mode (healing)")
    for c in report.cases:
        if c.passthrough_prefix:
            pt = "[green]prefix holds[/green]"
        else:
            tag = "[yellow]" if c.expected_fork else "[red]"
            pt = (
                f"{tag}forks at turn {c.fork_turn}: {c.fork_kind}[/] at token {c.fork_position}\n"
                f"{c.fork_context}"
            )
        tk = (
            f"[green]{c.tokens_detail}[/green]"
            if c.tokens_holds
            else f"[red]{c.tokens_detail}[/red]"
        )
        table.add_row(f"{c.name}\n[dim]{c.description}[/dim]", pt, tk)
    console.print(table)
    console.print(
        f"tool-call parser: {report.parser or '[red]none[/red]'}; eos token: {report.eos_token!r}"
    )
    drift = sorted({c.fork_kind for c in report.cases if c.fork_kind and not c.expected_fork})
    if drift:
        console.print(
            f"[yellow]passthrough drifts ({', '.join(drift)}):[/yellow] multi-turn rollouts fork "
            "into several rows; use capture='tokens' to keep one row per rollout"
        )
    if report.tokens_ok:
        console.print("[green]tokens mode holds for this template[/green]")
    else:
        console.print("[red]tokens mode cannot hold for this template[/red]")


def doctor_command(
    tokenizer: str | None = typer.Option(
        None,
        "--tokenizer",
        "-t",
        metavar="DIR",
        help="Hugging Face tokenizer folder to check (default: the embedded engine's).",
    ),
    json_output: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Check whether a chat template keeps multi-turn rollouts token-faithful."""
    from rich.console import Console
    from rich.markup import escape

    console = Console()
    if tokenizer is None:
        from rollwire.engine.tokenizer import tokenizer_dir

        tokenizer = str(tokenizer_dir())
    try:
        renderer = ChatRenderer.from_dir(tokenizer)
    except (ValueError, ImportError) as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from exc
    report = diagnose(renderer)
    if json_output:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    else:
        print_report(report, console)
    if not report.tokens_ok:
        raise typer.Exit(1)
