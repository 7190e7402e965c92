"""The embedded engine's tokenizer: a byte-level BPE trained locally, plus a ChatML-with-tools template.

The tokenizer is trained from ``corpus.txt`` shipped in this package (no downloads), saved as a
Hugging Face tokenizer folder so ``transformers.AutoTokenizer`` loads it, and cached on disk by a
hash of everything that determines its ids, so every process sees the same ids.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from datetime import datetime
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
    "template_messages",
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


def _folder_template(folder: Path) -> str | None:
    """The chat template a tokenizer folder carries, read the way transformers reads it: a
    ``chat_template`` in ``tokenizer_config.json`` (older folders), else ``chat_template.jinja``;
    None when the folder has neither."""
    config = folder / "tokenizer_config.json"
    if config.exists():
        embedded = json.loads(config.read_text()).get("chat_template")
        if isinstance(embedded, list):  # named templates: the default one renders chats
            named = {t.get("name"): t.get("template") for t in embedded if isinstance(t, dict)}
            embedded = named.get("default")
        if isinstance(embedded, str):
            return embedded
    if (folder / "chat_template.jinja").exists():
        return (folder / "chat_template.jinja").read_text("utf-8")
    return None


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


#: The special-token attributes of a transformers tokenizer, in ``all_special_ids`` order.
_SPECIAL_ATTRS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        raw = json.loads(path.read_text("utf-8"))
    except ValueError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from exc
    return raw if isinstance(raw, dict) else {}


def _token_text(value: Any) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: a string or ``{"content": ...}``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _ids(value: Any) -> list[int]:
    """``eos_token_id`` as configs write it: an int, a list of ints, or nothing."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [int(v) for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _is_byte_level(spec: dict[str, Any]) -> bool:
    """Whether the vocabulary is GPT-2 byte-level (``Ġthe``) rather than SentencePiece-style
    (``▁the``, ``<0x0A>``): a ByteLevel pre-tokenizer or decoder anywhere in tokenizer.json."""

    def has(node: Any) -> bool:
        if isinstance(node, dict):
            return node.get("type") == "ByteLevel" or any(has(v) for v in node.values())
        if isinstance(node, list):
            return any(has(v) for v in node)
        return False

    return has(spec.get("pre_tokenizer")) or has(spec.get("decoder"))


class EngineTokenizer:
    """A Hugging Face ``tokenizer.json`` folder (the shipped byte-level BPE, or a model folder's
    own) with its chat template and the special tokens of its ``tokenizer_config.json``."""

    def __init__(self, folder: str | os.PathLike[str] | None = None) -> None:
        self.folder = Path(folder) if folder is not None else tokenizer_dir()
        spec = _read_json(self.folder / "tokenizer.json")
        self._tok = Tokenizer.from_file(str(self.folder / "tokenizer.json"))
        self.vocab_size: int = self._tok.get_vocab_size(with_added_tokens=True)
        config = _read_json(self.folder / "special_tokens_map.json")
        config |= _read_json(self.folder / "tokenizer_config.json")
        #: The special tokens by transformers attribute name (``eos_token``...): their text.
        self.special_tokens: dict[str, str] = {}
        for attr in _SPECIAL_ATTRS:
            text = _token_text(config.get(attr))
            if text is not None and self._tok.token_to_id(text) is not None:
                self.special_tokens[attr] = text
        model_config = _read_json(self.folder / "config.json")
        generation = _read_json(self.folder / "generation_config.json")
        eos_ids = _ids(generation.get("eos_token_id")) or _ids(model_config.get("eos_token_id"))
        eos = self.special_tokens.get("eos_token")
        #: The id that ends an assistant turn (``<|im_end|>`` in ChatML).
        self.eos_id: int = (
            self._require(eos)
            if eos is not None
            else (eos_ids[0] if eos_ids else self._require("<|im_end|>"))
        )
        pad = self.special_tokens.get("pad_token")
        pad_ids = _ids(generation.get("pad_token_id")) or _ids(model_config.get("pad_token_id"))
        self.pad_id: int = (
            self._require(pad) if pad is not None else (pad_ids[0] if pad_ids else self.eos_id)
        )
        #: Ids that end a generation, as vLLM's: the tokenizer's eos plus the generation
        #: config's ``eos_token_id`` (the model config's without one). A tokenizer folder with
        #: neither file (the shipped one) stops on eos and pad, as the engine always did.
        self.stop_ids: frozenset[int] = frozenset(
            [self.eos_id, *eos_ids] if generation or model_config else [self.eos_id, self.pad_id]
        )
        added = self._tok.get_added_tokens_decoder()
        #: ids removed by ``skip_special_tokens`` (added tokens marked ``special``).
        self.special_ids: set[int] = {int(i) for i, t in added.items() if t.special}
        #: ids of every added token (control and markup alike): their bytes are their text.
        self.added_ids: set[int] = {int(i) for i in added}
        extra = config.get("additional_special_tokens") or config.get("extra_special_tokens")
        extra_texts = [_token_text(t) for t in extra] if isinstance(extra, list) else []
        #: What ``AutoTokenizer(...).all_special_ids`` reports for this folder: the special-token
        #: attributes, then the additional ones (for the shipped folder, the ChatML control
        #: tokens; the markup tokens are plain added tokens, as in Qwen2.5). Fork
        #: classification reads this.
        self.all_special_ids: list[int] = list(
            dict.fromkeys(
                self._require(t)
                for t in [*self.special_tokens.values(), *extra_texts]
                if t is not None and self._tok.token_to_id(t) is not None
            )
        )
        self._byte_level = _is_byte_level(spec)
        self._token_bytes: list[bytes] = [self._bytes_of(i) for i in range(self.vocab_size)]
        template = _folder_template(self.folder)
        if template is None and all(self._tok.token_to_id(t) is not None for t in CONTROL_TOKENS):
            template = chat_template()  # a ChatML vocabulary without a template: the shipped one
        self._template_text = template

    def _require(self, token: str) -> int:
        tid = self._tok.token_to_id(token)
        if tid is None:
            raise ValueError(f"tokenizer in {self.folder} has no {token!r} token")
        return int(tid)

    def _bytes_of(self, tid: int) -> bytes:
        piece = self._tok.id_to_token(tid)
        if piece is None:
            return b""
        if tid in self.added_ids:
            return piece.encode()
        if self._byte_level:
            return bytes(_UNICODE_TO_BYTE.get(ch, 0) for ch in piece)
        # SentencePiece-style: byte-fallback pieces are <0xHH>, and "\u2581" is a space
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            try:
                return bytes([int(piece[3:5], 16)])
            except ValueError:
                pass
        return piece.replace("\u2581", " ").encode()

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
        """Render a chat with this tokenizer's template (see :func:`render_chat`); the template
        sees the special tokens (``bos_token``, ``eos_token``...) as transformers passes them."""
        if self._template_text is None:
            raise ValueError(
                f"the tokenizer in {self.folder} has no chat template (chat_template.jinja, or "
                "chat_template in tokenizer_config.json): add one, or send token ids or text to "
                "/v1/completions"
            )
        return _render(
            self._template_text,
            messages,
            tools,
            add_generation_prompt,
            **{**self.special_tokens, **kwargs},
        )

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


def _strftime_now(format: str) -> str:
    # transformers' template global (Llama 3.x templates print today's date with it)
    return datetime.now().strftime(format)


@lru_cache(maxsize=8)
def _compiled(template: str) -> jinja2.Template:
    # Mirrors transformers' environment (trim_blocks, lstrip_blocks, loopcontrols) so both
    # renderers produce identical strings.
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
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
    variables: dict[str, Any] = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    variables |= kwargs
    variables |= {
        "messages": list(messages),
        "tools": list(tools) if tools else None,
        "add_generation_prompt": add_generation_prompt,
    }
    return _compiled(template).render(**variables)


def template_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI request messages in the shape chat templates expect, as vLLM hands them over:
    ``content: null`` becomes ``""`` (templates such as SmolLM2's concatenate it), a tool call's
    ``arguments`` JSON string becomes the object (``| tojson`` templates), and an empty
    ``tool_calls`` list is dropped. Arguments that are not JSON stay as written."""
    out: list[dict[str, Any]] = []
    for message in messages:
        msg = dict(message)
        if "content" in msg and msg["content"] is None:
            msg["content"] = ""
        calls = msg.get("tool_calls")
        if msg.get("role") == "assistant" and isinstance(calls, list):
            if not calls:
                del msg["tool_calls"]
            else:
                msg["tool_calls"] = [_template_call(c) for c in calls]
        out.append(msg)
    return out


def _template_call(call: Any) -> Any:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        return call
    fn = dict(call["function"])
    args = fn.get("arguments")
    if not args:
        fn["arguments"] = {}
    elif isinstance(args, str):
        try:
            fn["arguments"] = json.loads(args)
        except ValueError:
            pass
    return {**call, "function": fn}


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
