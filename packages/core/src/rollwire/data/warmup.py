"""Supervised warm-up examples: a conversation's tokens with labels on its assistant turns only.

``rollwire train`` warms a policy up on a task's teacher conversations before RL (TRL's torch
loop, or a Tinker service's ``cross_entropy``). Only assistant tokens (their text and the
end-of-turn token) carry loss; user, observation and template tokens are context, exactly as in
an RL row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeAlias

__all__ = ["IGNORE", "Conversation", "assistant_labels", "read_conversations", "split_conversation"]

#: the label of a token that carries no loss (PyTorch's ``ignore_index``)
IGNORE = -100

#: a conversation: its OpenAI-format messages, or ``{"messages": [...], "tools": [...]}`` when the
#: model was offered tools (rendered into the prompt by the chat template, as at inference)
Conversation: TypeAlias = Sequence[dict[str, Any]] | Mapping[str, Any]


def split_conversation(
    conversation: Conversation,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """``(messages, tools)`` of a conversation (``tools`` None when it offers none)."""
    if isinstance(conversation, Mapping):
        return list(conversation["messages"]), conversation.get("tools") or None
    return list(conversation), None


def _render(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    generation: bool,
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    extra = {"tools": tools} if tools else {}
    ids = tokenizer.apply_chat_template(
        list(messages), add_generation_prompt=generation, tokenize=True, **extra
    )
    if not isinstance(ids, list):  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def assistant_labels(tokenizer: Any, conversation: Conversation) -> tuple[list[int], list[int]]:
    """``(input_ids, labels)`` of a conversation; labels are ``-100`` except on each assistant
    message's tokens (text and tool calls) up to and including its end-of-turn token
    (``tokenizer`` is a Hugging Face tokenizer with a chat template)."""
    messages, tools = split_conversation(conversation)
    ids = _render(tokenizer, messages, generation=False, tools=tools)
    labels = [IGNORE] * len(ids)
    end = tokenizer.eos_token_id
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        before = _render(tokenizer, messages[:i], generation=True, tools=tools)
        start = len(before)
        stop = len(_render(tokenizer, messages[: i + 1], generation=False, tools=tools))
        if ids[:start] != before:
            raise ValueError(
                f"the chat template does not render message {i} as an extension of the ones "
                "before it; assistant tokens cannot be located for the warm-up"
            )
        for j in range(start, stop):
            labels[j] = ids[j]
            if ids[j] == end:
                break
    return ids, labels


def read_conversations(path: str | Path) -> list[Conversation]:
    """Chat conversations for a supervised warm-up (``rollwire train --sft``): JSON lines, each
    ``{"messages": [...], "tools": [...]}`` (``tools`` optional: the OpenAI tools the model was
    offered) or a bare list of OpenAI-format messages (tool calls and tool results included).
    Each needs at least one assistant message; a bad line is an error naming it."""
    import orjson

    out: list[Conversation] = []
    for n, line in enumerate(Path(path).read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"{path}:{n}: not JSON ({exc})") from None
        messages = item.get("messages") if isinstance(item, dict) else item
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages
        ):
            raise ValueError(
                f'{path}:{n}: expected {{"messages": [{{"role": ..., "content": ...}}, ...]}} '
                "or a list of such messages"
            )
        if not any(m["role"] == "assistant" for m in messages):
            raise ValueError(f"{path}:{n}: no assistant message to learn from")
        tools = item.get("tools") if isinstance(item, dict) else None
        if tools is not None and not (
            isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
        ):
            raise ValueError(f'{path}:{n}: "tools" must be a list of OpenAI tool objects')
        out.append({"messages": messages, "tools": tools} if tools else messages)
    if not out:
        raise ValueError(f"{path} holds no conversations: write one JSON object per line")
    return out
