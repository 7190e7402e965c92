"""Render OpenAI chat messages to token ids with a model's own Hugging Face chat template.

Used by the ``tokens`` capture mode and ``rollwire doctor``. Messages are normalised first, because
agent frameworks send shapes that chat templates do not expect: content part lists, tool-call
messages without ``content``, the ``developer`` role, and tool-call ``arguments`` as a JSON string.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

__all__ = ["ChatRenderer", "MissingTokensExtra", "message_text", "normalize_messages"]


class MissingTokensExtra(ImportError):
    """``transformers`` is not installed, so chat templates cannot be rendered."""


def _auto_tokenizer() -> Any:
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise MissingTokensExtra(
            "capture='tokens' and `rollwire doctor` render chat templates with Hugging Face "
            'transformers, which is not installed: pip install "rollwire[tokens]"'
        ) from exc
    return AutoTokenizer


def message_text(content: Any) -> str:
    """Text of an OpenAI ``content`` value: a string, None, or a list of content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Mapping):
        return str(content.get("text") or "")
    if isinstance(content, Sequence):
        out: list[str] = []
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, Mapping) and part.get("type", "text") == "text":
                out.append(str(part.get("text") or ""))
        return "".join(out)
    return str(content)


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            # Not JSON: the template prints a string as is, which is what the model wrote.
            return value
    return value


def _normalize_message(msg: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(msg)
    role = out.get("role")
    if role == "developer":
        out["role"] = "system"
    out["content"] = message_text(out.get("content"))
    calls = out.get("tool_calls")
    if calls:
        fixed = []
        for call in calls:
            call = dict(call)
            fn = dict(call.get("function") or {})
            fn["arguments"] = _arguments(fn.get("arguments"))
            call["function"] = fn
            call.setdefault("type", "function")
            fixed.append(call)
        out["tool_calls"] = fixed
    elif "tool_calls" in out:
        del out["tool_calls"]
    return out


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages in the shape chat templates expect (see the module docstring)."""
    return [_normalize_message(m) for m in messages]


class ChatRenderer:
    """A Hugging Face tokenizer plus its chat template: messages and tools in, token ids out."""

    def __init__(self, tokenizer: Any, source: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.source = source
        template = getattr(tokenizer, "chat_template", None)
        if isinstance(template, dict):  # several named templates: the default one renders chats
            template = template.get("default") or next(iter(template.values()), None)
        self.chat_template: str = template or ""
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_id: int | None = int(eos) if isinstance(eos, int) else None
        self.special_ids: frozenset[int] = frozenset(int(i) for i in tokenizer.all_special_ids)
        self.all_special_ids: Collection[int] = self.special_ids  # TokenizerLike (trajectory)
        self._special_text = {i: str(tokenizer.convert_ids_to_tokens(i)) for i in self.special_ids}

    @classmethod
    def from_dir(cls, tokenizer_dir: str | os.PathLike[str]) -> ChatRenderer:
        """Load a Hugging Face tokenizer folder (or hub name already in the local cache)."""
        auto = _auto_tokenizer()
        path = str(tokenizer_dir)
        try:
            tok = auto.from_pretrained(path)
        except (OSError, ValueError) as exc:
            raise ValueError(
                f"cannot load a Hugging Face tokenizer from {path!r}: {exc}. Point --tokenizer / "
                "the session's tokenizer at a folder with tokenizer.json and tokenizer_config.json"
            ) from exc
        renderer = cls(tok, source=str(Path(path)))
        if not renderer.chat_template:
            raise ValueError(
                f"the tokenizer in {path!r} has no chat template (tokenizer_config.json "
                "'chat_template' or chat_template.jinja); tokens mode needs one"
            )
        return renderer

    # -- text -----------------------------------------------------------------------------------

    def render_text(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        normalized: bool = False,
    ) -> str:
        """The prompt text the chat template produces for ``messages`` and ``tools``."""
        msgs = list(messages) if normalized else normalize_messages(messages)
        text = self.tokenizer.apply_chat_template(
            msgs,
            tools=list(tools) if tools else None,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **dict(chat_template_kwargs or {}),
        )
        return str(text)

    def encode(self, text: str) -> np.ndarray:
        """Token ids of ``text`` (special tokens written in the text become their single ids)."""
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return np.asarray(ids, dtype=np.int32)

    def decode(
        self, token_ids: Sequence[int] | np.ndarray, skip_special_tokens: bool = False
    ) -> str:
        """Text of ``token_ids`` (TokenizerLike for fork classification)."""
        ids = token_ids.tolist() if isinstance(token_ids, np.ndarray) else list(token_ids)
        return str(self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))

    def token_text(self, token_id: int) -> str:
        """Text of one token (for OpenAI ``logprobs.content[].token``)."""
        return self.decode([token_id])

    def special_text(self, token_id: int) -> str | None:
        """The literal text of a special token id, or None when it is not special."""
        return self._special_text.get(token_id)

    # -- ids ------------------------------------------------------------------------------------

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> np.ndarray:
        """Token ids of the rendered chat (int32)."""
        return self.encode(
            self.render_text(
                messages,
                tools,
                add_generation_prompt=add_generation_prompt,
                chat_template_kwargs=chat_template_kwargs,
            )
        )
