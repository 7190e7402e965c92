"""The embedded engine's tokenizer: a byte-level BPE trained locally, plus a ChatML-with-tools template.

The tokenizer is trained from ``corpus.txt`` shipped in this package (no downloads), saved as a
Hugging Face tokenizer folder so ``transformers.AutoTokenizer`` loads it, and cached on disk by a
hash of everything that determines its ids, so every process sees the same ids.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

__all__ = [
    "CONTROL_TOKENS",
    "MARKUP_TOKENS",
    "EngineTokenizer",
    "build_tokenizer",
    "chat_template",
    "render_chat",
    "tokenizer_dir",
    "tokenizer_files",
]

#: Skipped by ``skip_special_tokens`` (like Qwen's ``<|im_end|>``).
CONTROL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
#: Single tokens that stay in decoded text (like Qwen's ``<tool_call>``, ``special: false``).
MARKUP_TOKENS = (
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "<tool_response>",
    "</tool_response>",
)
_VOCAB_SIZE = 2048
#: The shipped Hugging Face folder, relative to this package.
_SHIPPED = "hf_tokenizer"


def chat_template() -> str:
    """The Jinja chat template (ChatML, Hermes/Qwen-style tools, Qwen3-style thinking).

    One file, ``hf_tokenizer/chat_template.jinja``: the engine renders with it and transformers
    reads the same file from the tokenizer folder (``tokenizer_config.json`` carries no copy).
    """
    return (
        resources.files(__package__)
        .joinpath(_SHIPPED)
        .joinpath("chat_template.jinja")
        .read_text("utf-8")
    )


def _corpus() -> str:
    return resources.files(__package__).joinpath("corpus.txt").read_text("utf-8")


def _train() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_VOCAB_SIZE,
        min_frequency=1,
        show_progress=False,
        # Control and markup tokens first so their ids are small and stable.
        special_tokens=[*CONTROL_TOKENS, *MARKUP_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = _corpus()
    # Train on the corpus lines; the markup tokens are added below as whole tokens anyway.
    tok.train_from_iterator(corpus.splitlines(), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CONTROL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    return tok


def _write_folder(folder: Path, tok: Tokenizer) -> None:
    tok.save(str(folder / "tokenizer.json"))
    added: dict[str, Any] = {}
    for t in (*CONTROL_TOKENS, *MARKUP_TOKENS):
        tid = tok.token_to_id(t)
        added[str(tid)] = {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": t in CONTROL_TOKENS,
        }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 32768,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "add_prefix_space": False,
        "errors": "replace",
        "split_special_tokens": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
    special_map = {
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
    }
    (folder / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2))
    (folder / "chat_template.jinja").write_text(chat_template())


def _folder_template(folder: Path) -> str:
    """The chat template a tokenizer folder carries, read the way transformers reads it: a
    ``chat_template`` in ``tokenizer_config.json`` (older folders), else ``chat_template.jinja``;
    the shipped template when the folder has neither."""
    config = folder / "tokenizer_config.json"
    if config.exists():
        embedded = json.loads(config.read_text()).get("chat_template")
        if isinstance(embedded, str):
            return embedded
    if (folder / "chat_template.jinja").exists():
        return (folder / "chat_template.jinja").read_text("utf-8")
    return chat_template()


def build_tokenizer(folder: str | os.PathLike[str]) -> Path:
    """Train the tokenizer from the shipped corpus and write the Hugging Face folder to ``folder``
    (how the shipped ``tokenizer/`` folder was made)."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    _write_folder(out, _train())
    return out


@lru_cache(maxsize=1)
def tokenizer_dir() -> Path:
    """Path of the shipped Hugging Face tokenizer folder (read-only; nothing is built at run time)."""
    folder = Path(str(resources.files(__package__).joinpath(_SHIPPED)))
    if not (folder / "tokenizer.json").exists():
        raise FileNotFoundError(
            f"the engine's tokenizer folder {folder} is missing from the installed package; "
            "reinstall rollwire, or rebuild it with `rollwire engine build-tokenizer "
            f"{folder}`"
        )
    return folder


def _bytes_to_unicode() -> dict[int, str]:
    # The GPT-2 byte <-> printable-char table that ByteLevel uses.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


_UNICODE_TO_BYTE = {v: k for k, v in _bytes_to_unicode().items()}


#: Files of a model folder that are not the tokenizer's (a tokenizer loaded from a Hugging Face
#: model folder shares it with the weights).
_MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors.index.json")
_MODEL_SUFFIXES = (".safetensors", ".npz", ".bin", ".pt", ".pth", ".gguf")


def tokenizer_files(folder: str | os.PathLike[str]) -> list[Path]:
    """The tokenizer's own files in ``folder`` (no weights or model config), to copy elsewhere."""
    return [
        p
        for p in sorted(Path(folder).iterdir())
        if p.is_file() and p.name not in _MODEL_FILES and not p.name.endswith(_MODEL_SUFFIXES)
    ]


class EngineTokenizer:
    """Byte-level BPE tokenizer of the embedded engine (a thin wrapper over ``tokenizers.Tokenizer``)."""

    def __init__(self, folder: str | os.PathLike[str] | None = None) -> None:
        self.folder = Path(folder) if folder is not None else tokenizer_dir()
        self._tok = Tokenizer.from_file(str(self.folder / "tokenizer.json"))
        self.vocab_size: int = self._tok.get_vocab_size(with_added_tokens=True)
        self.eos_id: int = self._require("<|im_end|>")
        self.pad_id: int = self._require("<|endoftext|>")
        #: ids removed by ``skip_special_tokens`` (the ChatML control tokens).
        self.special_ids: set[int] = {self._require(t) for t in CONTROL_TOKENS}
        #: ids of the markup tokens (``<tool_call>``, ``<think>``...), kept in decoded text.
        self.markup_ids: set[int] = {self._require(t) for t in MARKUP_TOKENS}
        #: The control tokens, exactly what ``AutoTokenizer(...).all_special_ids`` reports for
        #: this folder: the markup tokens are plain added tokens (``special: false``, as in
        #: Qwen2.5), so they are not special. Fork classification reads this.
        self.all_special_ids: list[int] = list(
            dict.fromkeys([self.eos_id, self.pad_id, self._require("<|im_start|>")])
        )
        self._token_bytes: list[bytes] = [self._bytes_of(i) for i in range(self.vocab_size)]
        self._template_text = _folder_template(self.folder)

    def _require(self, token: str) -> int:
        tid = self._tok.token_to_id(token)
        if tid is None:
            raise ValueError(f"tokenizer in {self.folder} has no {token!r} token")
        return int(tid)

    def _bytes_of(self, tid: int) -> bytes:
        piece = self._tok.id_to_token(tid)
        if piece is None:
            return b""
        if tid in self.special_ids or tid in self.markup_ids:
            return piece.encode()
        return bytes(_UNICODE_TO_BYTE.get(ch, 0) for ch in piece)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; control/markup tokens written in the text become single ids."""
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; invalid UTF-8 at the edges decodes to U+FFFD, like HF tokenizers."""
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def id_to_token(self, tid: int) -> str:
        """The vocabulary entry (byte-level form, e.g. ``Ġthe``) of ``tid``."""
        piece = self._tok.id_to_token(tid)
        if piece is None:
            raise ValueError(f"token id {tid} is outside the vocabulary (size {self.vocab_size})")
        return str(piece)

    def token_bytes(self, tid: int) -> bytes:
        """The raw bytes a token stands for (what OpenAI's ``logprobs[].bytes`` lists)."""
        return self._token_bytes[tid]

    def token_text(self, tid: int) -> str:
        """A token's text for ``logprobs[].token`` (lossy for tokens that split a UTF-8 character)."""
        return self._token_bytes[tid].decode("utf-8", errors="replace")

    def render_chat(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """Render a chat with this tokenizer's template (see :func:`render_chat`)."""
        return _render(self._template_text, messages, tools, add_generation_prompt, **kwargs)

    def apply_chat_template(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> list[int]:
        """Token ids of the rendered chat."""
        return self.encode(self.render_chat(messages, tools, add_generation_prompt, **kwargs))


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: Any = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    # Same as transformers' chat-template ``tojson``: no HTML escaping, no key sorting.
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


@lru_cache(maxsize=8)
def _compiled(template: str) -> jinja2.Template:
    # Mirrors transformers' environment (trim_blocks, lstrip_blocks, loopcontrols) so both
    # renderers produce identical strings.
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    return env.from_string(template)


def _render(
    template: str,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None,
    add_generation_prompt: bool,
    **kwargs: Any,
) -> str:
    if not messages:
        raise ValueError("messages must not be empty")
    return _compiled(template).render(
        messages=list(messages),
        tools=list(tools) if tools else None,
        add_generation_prompt=add_generation_prompt,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        **kwargs,
    )


def render_chat(
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    **kwargs: Any,
) -> str:
    """Render OpenAI-style ``messages`` (and ``tools``) to the engine's prompt text.

    ChatML with Hermes/Qwen2.5 tool markup; ``<think>`` blocks of assistant turns before the last
    user query are dropped (Qwen3). Extra keyword arguments (``enable_thinking``...) reach the template.
    """
    return _render(chat_template(), messages, tools, add_generation_prompt, **kwargs)
