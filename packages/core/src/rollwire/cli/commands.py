"""``rollwire export`` and ``rollwire demo`` (registered by :mod:`rollwire.cli.app`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from rollwire.cli.errors import FAILED, check_output_free, fail, print_error
from rollwire.cli.run import import_path, quiet_logs
from rollwire.cli.summary import summary_table

__all__ = ["demo", "export", "export_options", "load_tokenizer"]

console = Console()

#: ``rollwire export`` flags and the adapter option each one sets
_EXPORT_FLAGS = {
    "pad_token_id": "--pad-token-id",
    "max_prompt_length": "--max-prompt-length",
    "max_response_length": "--max-response-length",
    "tokenizer": "--tokenizer",
    "mode": "--mode",
}


class _FileTokenizer:
    """A Hugging Face ``tokenizer.json`` through the ``tokenizers`` library: what adapters need
    (decode, special ids, the pad id) when transformers is not installed."""

    def __init__(self, folder: Path) -> None:
        import json

        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        added = json.loads((folder / "tokenizer.json").read_text()).get("added_tokens", [])
        self.all_special_ids = [int(t["id"]) for t in added if t.get("special")]
        config = folder / "tokenizer_config.json"
        pad = json.loads(config.read_text()).get("pad_token") if config.exists() else None
        pad_text = pad.get("content") if isinstance(pad, dict) else pad
        self.pad_token_id = self._tok.token_to_id(pad_text) if isinstance(pad_text, str) else None

    def decode(self, token_ids: Any, skip_special_tokens: bool = False) -> str:
        return str(self._tok.decode(list(token_ids), skip_special_tokens=skip_special_tokens))

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)


def load_tokenizer(path: Path) -> Any:
    """The tokenizer of a Hugging Face folder: transformers' ``AutoTokenizer`` when installed
    (offline, local files only), else the folder's ``tokenizer.json`` read by ``tokenizers``."""
    if not (path / "tokenizer.json").exists() and not (path / "tokenizer_config.json").exists():
        raise fail(f"--tokenizer {path}: not a Hugging Face tokenizer folder (no tokenizer.json)")
    try:
        from transformers import AutoTokenizer
    except ImportError:
        return _FileTokenizer(path)
    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # transformers raises many kinds for a folder it cannot read
        raise fail(f"--tokenizer {path}: cannot load it: {type(exc).__name__}: {exc}") from exc


def export_options(
    adapter: Any, batch: Any, path: Path, options: dict[str, Any], implicit: tuple[str, ...] = ()
) -> Path:
    """``adapter.export(batch, path, **options)``; an option the adapter does not take ends the
    command naming its flag (adapters take ``**options`` and pass them on to their converter),
    unless it is one of ``implicit`` (filled in from ``--tokenizer``): then it is left out."""
    options = dict(options)
    while True:
        try:
            return Path(adapter.export(batch, path, **options))
        except TypeError as exc:
            rejected = [k for k in options if f"'{k}'" in str(exc)]
            if not rejected:
                raise
            if rejected[0] not in implicit:
                flag = _EXPORT_FLAGS.get(rejected[0], rejected[0])
                raise fail(f"the {adapter.name} adapter takes no {flag} ({exc})") from exc
            options.pop(rejected[0])


def _trainer_names() -> tuple[list[str], list[str]]:
    """Names of the trainer adapters that can export here, and notes on those that cannot."""
    from rollwire.plugins import discover

    ok: list[str] = []
    notes: list[str] = []
    for info in discover("trainers"):
        if info.status == "ok":
            ok.append(info.name)
        else:
            notes.append(f"{info.name} ({info.status}: {info.detail})")
    return ok, notes


def export(
    src: Path = typer.Option(
        ...,
        "--in",
        "-i",
        exists=True,
        dir_okay=False,
        metavar="FILE",
        help="Rollouts JSONL written by `rollwire run`.",
    ),
    to: str = typer.Option(
        ...,
        "--to",
        metavar="NAME",
        help="jsonl, or an installed trainer adapter (verl, slime, rllm; see `rollwire plugins`).",
    ),
    out: Path = typer.Option(..., "--out", "-o", metavar="PATH", help="Output path."),
    pad_token_id: int = typer.Option(
        None,
        "--pad-token-id",
        metavar="ID",
        help="verl, slime: the pad id (default: the tokenizer's, else 0).",
    ),
    max_prompt_length: int = typer.Option(
        None,
        "--max-prompt-length",
        min=1,
        metavar="N",
        help="verl: prompt width (data.max_prompt_length).",
    ),
    max_response_length: int = typer.Option(
        None,
        "--max-response-length",
        min=1,
        metavar="N",
        help="verl: response width (data.max_response_length).",
    ),
    tokenizer: Path = typer.Option(
        None,
        "--tokenizer",
        file_okay=False,
        exists=True,
        metavar="DIR",
        help="Hugging Face tokenizer folder: response text (slime), fork classes, pad id.",
    ),
    mode: str = typer.Option(
        None, "--mode", metavar="MODE", help="merge (one row per prefix chain) or per_call."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite --out if it exists."),
) -> None:
    """Convert rollouts to a trainer's batch format (verl, slime, rLLM, ...) or rollwire JSONL."""
    from rollwire.data.dataset import read_jsonl, write_jsonl
    from rollwire.plugins import PluginError, load_trainer

    quiet_logs(False)
    ok, notes = _trainer_names()
    if to != "jsonl" and to not in ok:
        usable = ", ".join(["jsonl", *ok])
        unusable = f"; not usable here: {'; '.join(notes)}" if notes else ""
        raise fail(
            f"--to {to}: no such trainer adapter is usable; choose one of {usable}{unusable}"
        )
    if mode is not None and mode not in ("merge", "per_call"):
        raise fail(f"--mode must be merge or per_call, got {mode!r}")
    check_output_free(out, force)
    try:
        rollouts = read_jsonl(src)
    except ValueError as exc:
        raise fail(f"--in {src}: {exc}") from exc
    if to == "jsonl":
        n = write_jsonl(out, rollouts)
        console.print(f"wrote {n} rollouts to {out}")
        return
    options: dict[str, Any] = {
        "pad_token_id": pad_token_id,
        "max_prompt_length": max_prompt_length,
        "max_response_length": max_response_length,
        "mode": mode,
    }
    implicit: tuple[str, ...] = ()
    if tokenizer is not None:
        tok = load_tokenizer(tokenizer)
        options["tokenizer"] = tok
        if pad_token_id is None and getattr(tok, "pad_token_id", None) is not None:
            options["pad_token_id"] = int(tok.pad_token_id)
            implicit = ("pad_token_id",)
    options = {k: v for k, v in options.items() if v is not None}
    try:
        adapter = load_trainer(to)
    except PluginError as exc:
        raise fail(str(exc)) from exc
    try:
        path = export_options(adapter, rollouts, out, options, implicit)
    except typer.Exit:
        raise
    except Exception as exc:  # an adapter's own error: say which and why, no traceback
        raise fail(
            f"the {to} adapter could not export {src}: {type(exc).__name__}: {exc}", FAILED
        ) from exc
    console.print(f"exported {len(rollouts)} rollouts for {to} to {path}")


def demo(
    agent: str = typer.Option(
        "openai", "--agent", metavar="NAME", help="openai | strands | langgraph"
    ),
    tasks: int = typer.Option(16, "--tasks", min=1, metavar="N", help="Wordle games (tasks)."),
    group_size: int = typer.Option(
        4, "--group-size", min=1, metavar="N", help="Rollouts per game."
    ),
    unsteered: bool = typer.Option(
        False, "--unsteered", help="Let the raw (random-weight) model sample."
    ),
    out: Path = typer.Option(Path("rollwire-demo"), "--out", metavar="DIR", help="Output folder."),
    force: bool = typer.Option(
        False, "--force", help="Overwrite the rollouts of an earlier demo in --out."
    ),
    concurrency: int = typer.Option(
        32, "--concurrency", min=1, metavar="N", help="Rollouts in flight at most."
    ),
    seed: int = typer.Option(
        0, "--seed", metavar="INT", help="Seed of the tasks, the solver and the engine."
    ),
) -> None:
    """Wordle end to end on this machine: embedded engine, gateway, agent, and trainer exports."""
    from rollwire.cli.demo import DemoError, run_demo

    quiet_logs(False)
    import_path()
    check_output_free(out / "rollouts.jsonl", force, "--out")
    mode = (
        "unsteered: the raw random-weight model samples"
        if unsteered
        else "steered by a scripted Wordle solver"
    )
    console.print(
        f"[bold]rollwire demo[/bold]: Wordle, {tasks} tasks x {group_size} rollouts, agent "
        f"[cyan]{agent}[/cyan], embedded engine {mode}, routed experts on"
    )
    try:
        result = run_demo(
            agent=agent,
            tasks=tasks,
            group_size=group_size,
            unsteered=unsteered,
            out=out,
            concurrency=concurrency,
            seed=seed,
        )
    except DemoError as exc:
        raise fail(str(exc)) from exc
    s = result.summary()
    extra = [
        ("turns per rollout", f"{s['turns_per_rollout']:.2f}"),
        ("calls/s", "n/a" if s["calls_per_s"] != s["calls_per_s"] else f"{s['calls_per_s']:.1f}"),
    ]
    console.print(summary_table(s, "rollwire demo", extra))
    console.print(f"rollouts: {result.rollouts_path}")
    for name, path in sorted(result.exports.items()):
        console.print(f"export for {name}: {path}")
    for name, err in sorted(result.export_errors.items()):
        console.print(f"[yellow]export for {name} failed:[/yellow] {escape(err)}")
    for name, why in sorted(result.export_skipped.items()):
        console.print(escape(f"{name}: skipped — {why}"))
    if s["routed_calls"] < s["calls"] and s["streamed_calls"]:
        console.print(
            f"[bold yellow]note:[/bold yellow] {s['streamed_calls']} of {s['calls']} calls were "
            "streamed by the agent's framework; the embedded engine returns routed experts on "
            "non-streamed answers only, so those calls carry none."
        )
    if result.steered:
        console.print(
            "[bold yellow]note:[/bold yellow] the embedded engine is a tiny random-weight model; "
            "every guess was chosen by a scripted Wordle solver and teacher-forced, while the "
            "recorded log-probs and routed experts are the model's own. Run with --unsteered to "
            "see the raw model (it makes no valid guesses). docs/real-run.md goes from here to "
            "vLLM and a trainer."
        )
    else:
        console.print(
            "[bold yellow]note:[/bold yellow] unsteered: the raw random-weight model sampled every "
            "token, so rewards reflect a model that cannot play."
        )
    if s["failed"]:
        print_error(
            f"{s['failed']} of {s['rollouts']} demo rollouts did not complete "
            f"({', '.join(f'{k} {v}' for k, v in sorted(s['statuses'].items()))}); their errors are "
            f"in {result.rollouts_path}"
        )
    if result.export_errors or s["failed"]:
        raise typer.Exit(FAILED)
