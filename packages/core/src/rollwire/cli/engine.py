"""``rollwire engine``: serve the embedded engine, or write its model to a folder."""

from __future__ import annotations

from pathlib import Path

import typer

from rollwire.cli.checks import bind_port
from rollwire.cli.errors import fail

__all__ = ["engine_app"]

engine_app = typer.Typer(
    rich_markup_mode=None,
    name="engine",
    help="The embedded engine: a tiny random-weight model with vLLM/SGLang-compatible HTTP APIs (CPU only).",
    no_args_is_help=False,
)


def _serve(
    host: str,
    port: int,
    model_dir: Path | None,
    seed: int,
    logprobs_mode: str,
    return_routed_experts: bool,
    scripted: str | None,
    weight_version: str,
    fault_error_rate: float,
    fault_throttle_rate: float,
    fault_latency_ms: float,
    fault_truncate_stream_rate: float,
    fault_drop_token_ids_rate: float,
    fault_seed: int,
    log_level: str,
    served_model_name: list[str] | None = None,
    strict_model_name: bool = True,
    openai_ids_style: str = "vllm",
    max_model_len: int | None = None,
    tool_call_parser: str = "hermes",
) -> None:
    import uvicorn

    from rollwire.engine.config import EngineConfig, FaultConfig
    from rollwire.engine.server import create_app

    if logprobs_mode not in ("raw", "processed"):
        raise typer.BadParameter(f"--logprobs-mode must be raw or processed, got {logprobs_mode!r}")
    if tool_call_parser not in ("hermes", "mistral"):
        raise typer.BadParameter(
            f"--tool-call-parser must be hermes or mistral, got {tool_call_parser!r}"
        )
    if openai_ids_style not in ("vllm", "sglang"):
        raise typer.BadParameter(
            f"--openai-ids-style must be vllm or sglang, got {openai_ids_style!r}"
        )
    config = EngineConfig(
        model_dir=model_dir,
        seed=seed,
        logprobs_mode=logprobs_mode,  # type: ignore[arg-type]
        return_routed_experts=return_routed_experts,
        scripted=scripted,
        weight_version=weight_version,
        served_model_names=served_model_name or ["rollwire-tiny"],
        strict_model_name=strict_model_name,
        openai_ids_style=openai_ids_style,  # type: ignore[arg-type]
        max_model_len=max_model_len,
        tool_call_parser=tool_call_parser,  # type: ignore[arg-type]
        faults=FaultConfig(
            error_rate=fault_error_rate,
            throttle_rate=fault_throttle_rate,
            latency_ms=fault_latency_ms,
            truncate_stream_rate=fault_truncate_stream_rate,
            drop_token_ids_rate=fault_drop_token_ids_rate,
            seed=fault_seed,
        ),
    )
    try:
        app = create_app(config)
    except (ValueError, OSError, ImportError) as exc:
        raise fail(f"cannot start the engine: {type(exc).__name__}: {exc}") from exc
    sock = bind_port(host, port, "rollwire engine")
    typer.echo(
        f"rollwire engine: serving {config.model_name} on http://{host}:{port} (OpenAI base /v1)"
    )
    server = uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False)
    )
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # Ctrl-C / SIGINT after a clean shutdown, as uvicorn.run treats it
        pass


_HOST = typer.Option("127.0.0.1", metavar="HOST", help="Interface to bind.")
_PORT = typer.Option(8000, metavar="PORT", help="TCP port (vLLM's default).")
_MODEL_DIR = typer.Option(
    None,
    metavar="DIR",
    help="Folder written by `rollwire engine save-model`, or a Hugging Face Mixtral, Llama, "
    "Mistral, Qwen2 or Qwen3 folder (default: seeded model).",
)
_SEED = typer.Option(0, metavar="INT", help="Weight seed of the default model.")
_MODE = typer.Option(
    "raw",
    metavar="MODE",
    help="Log-probs: raw (vLLM default) or processed (temperature-scaled, SGLang default).",
)
_EXPERTS = typer.Option(
    False,
    help="Return routed experts on every response (like vLLM's --enable-return-routed-experts).",
)
_SCRIPTED = typer.Option(
    None,
    metavar="FILE|MODULE:FN",
    help="Script file (JSON/YAML) or module:function forcing the assistant text.",
)
_VERSION = typer.Option("0", metavar="VERSION", help="Initial weight version.")
_ERR = typer.Option(0.0, metavar="P", help="Probability of an injected 500 per generation request.")
_THROTTLE = typer.Option(
    0.0, metavar="P", help="Probability of an injected 429 (with Retry-After)."
)
_LATENCY = typer.Option(0.0, metavar="MS", help="Latency added to every generation request, in ms.")
_TRUNC = typer.Option(0.0, metavar="P", help="Probability that a stream is cut before [DONE].")
_DROP = typer.Option(
    0.0,
    metavar="P",
    help="Probability that token_ids/prompt_token_ids are missing from a response.",
)
_FSEED = typer.Option(0, metavar="INT", help="Seed of the fault draws.")
_LOG = typer.Option("warning", metavar="LEVEL", help="uvicorn log level.")
_NAMES = typer.Option(
    None,
    "--served-model-name",
    metavar="NAME",
    help="Model name served by /v1/models (repeatable; default rollwire-tiny).",
)
_STRICT = typer.Option(
    True,
    "--strict-model-name/--any-model-name",
    help="Answer vLLM's 404 to requests naming another model, as vLLM does (the gateway sends "
    "the served name); --any-model-name accepts and echoes any name.",
)
_IDS_STYLE = typer.Option(
    "vllm",
    "--openai-ids-style",
    metavar="STYLE",
    help="Token ids on the OpenAI routes: vllm (return_token_ids: prompt_token_ids, token_ids) "
    "or sglang (chat choices carry prompt_token_ids/response_token_ids; streams use "
    "return_output_ids_in_sglext).",
)


_MAX_LEN = typer.Option(
    None,
    "--max-model-len",
    help="Context length served, like vLLM's --max-model-len (default: the model's, 8192). "
    "Unlike vLLM, a request without max_tokens stops at 512 tokens, not at the end of the context.",
)


_PARSER = typer.Option(
    "hermes",
    "--tool-call-parser",
    help="How tool calls are read from the model's text, like vLLM's --tool-call-parser: hermes "
    "(<tool_call> JSON blocks) or mistral ([TOOL_CALLS] JSON, non-streamed answers).",
)


@engine_app.callback(invoke_without_command=True)
def main(
    ctx: typer.Context,
    host: str = _HOST,
    port: int = _PORT,
    model_dir: Path | None = _MODEL_DIR,
    seed: int = _SEED,
    logprobs_mode: str = _MODE,
    return_routed_experts: bool = _EXPERTS,
    scripted: str | None = _SCRIPTED,
    weight_version: str = _VERSION,
    fault_error_rate: float = _ERR,
    fault_throttle_rate: float = _THROTTLE,
    fault_latency_ms: float = _LATENCY,
    fault_truncate_stream_rate: float = _TRUNC,
    fault_drop_token_ids_rate: float = _DROP,
    fault_seed: int = _FSEED,
    log_level: str = _LOG,
    served_model_name: list[str] | None = _NAMES,
    strict_model_name: bool = _STRICT,
    openai_ids_style: str = _IDS_STYLE,
    max_model_len: int | None = _MAX_LEN,
    tool_call_parser: str = _PARSER,
) -> None:
    """Serve the engine (same as `rollwire engine serve`) when no subcommand is given."""
    if ctx.invoked_subcommand is None:
        _serve(**{k: v for k, v in locals().items() if k != "ctx"})


@engine_app.command()
def serve(
    host: str = _HOST,
    port: int = _PORT,
    model_dir: Path | None = _MODEL_DIR,
    seed: int = _SEED,
    logprobs_mode: str = _MODE,
    return_routed_experts: bool = _EXPERTS,
    scripted: str | None = _SCRIPTED,
    weight_version: str = _VERSION,
    fault_error_rate: float = _ERR,
    fault_throttle_rate: float = _THROTTLE,
    fault_latency_ms: float = _LATENCY,
    fault_truncate_stream_rate: float = _TRUNC,
    fault_drop_token_ids_rate: float = _DROP,
    fault_seed: int = _FSEED,
    log_level: str = _LOG,
    served_model_name: list[str] | None = _NAMES,
    strict_model_name: bool = _STRICT,
    openai_ids_style: str = _IDS_STYLE,
    max_model_len: int | None = _MAX_LEN,
    tool_call_parser: str = _PARSER,
) -> None:
    """Serve the engine's HTTP APIs (vLLM OpenAI routes, /inference/v1/generate, SGLang /generate)."""
    _serve(**locals())


@engine_app.command("save-model")
def save_model(
    directory: Path = typer.Argument(
        ..., help="Folder to write the model into (created if missing)."
    ),
    seed: int = _SEED,
    format: str = typer.Option(
        "engine",
        "--format",
        help="engine: config.json, weights.npz and tokenizer/ (for --model-dir); hf: a "
        "MixtralForCausalLM folder (safetensors, tokenizer, chat template) that transformers "
        "and vLLM load, with the very same weights.",
    ),
) -> None:
    """Write the seeded model to DIRECTORY, for the engine itself or as a Hugging Face folder."""
    from rollwire.engine.model import ModelConfig, TinyModel

    if format not in ("engine", "hf"):
        raise typer.BadParameter(f"--format must be engine or hf, got {format!r}")
    model = TinyModel(ModelConfig(seed=seed))
    if format == "hf":
        from rollwire.engine.hf_export import save_hf

        out = save_hf(model, directory)
        typer.echo(f"wrote {out}: MixtralForCausalLM (config.json, model.safetensors, tokenizer)")
        return
    out = model.save(directory)
    typer.echo(f"wrote {out}/config.json, weights.npz and tokenizer/")


@engine_app.command("build-tokenizer")
def build_tokenizer_cmd(
    directory: Path = typer.Argument(..., help="Folder to write the Hugging Face tokenizer into."),
) -> None:
    """Retrain the engine's tokenizer from the shipped corpus into DIRECTORY (how the shipped
    tokenizer folder was made)."""
    from rollwire.engine.tokenizer import build_tokenizer

    out = build_tokenizer(directory)
    typer.echo(f"wrote {out}/tokenizer.json, tokenizer_config.json and special_tokens_map.json")
