"""Supervised warm-up examples: a conversation's tokens with labels on its assistant turns only.

``rollwire train`` warms a policy up on a task's teacher conversations before RL (TRL's torch
loop, or a Tinker service's ``cross_entropy``). Only assistant tokens (their text and the
end-of-turn token) carry loss; user, observation and template tokens are context, exactly as in
an RL row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["IGNORE", "assistant_labels"]

#: the label of a token that carries no loss (PyTorch's ``ignore_index``)
IGNORE = -100


def _render(tokenizer: Any, messages: Sequence[dict[str, Any]], generation: bool) -> list[int]:
    ids = tokenizer.apply_chat_template(
        list(messages), add_generation_prompt=generation, tokenize=True
    )
    if not isinstance(ids, list):  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def assistant_labels(
    tokenizer: Any, messages: Sequence[dict[str, Any]]
) -> tuple[list[int], list[int]]:
    """``(input_ids, labels)`` of a conversation; labels are ``-100`` except on each assistant
    message's tokens up to and including its end-of-turn token (``tokenizer`` is a Hugging Face
    tokenizer with a chat template)."""
    ids = _render(tokenizer, messages, generation=False)
    labels = [IGNORE] * len(ids)
    end = tokenizer.eos_token_id
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        start = len(_render(tokenizer, messages[:i], generation=True))
        stop = len(_render(tokenizer, messages[: i + 1], generation=False))
        if ids[:start] != _render(tokenizer, messages[:i], generation=True):
            raise ValueError(
                f"the chat template does not render message {i} as an extension of the ones "
                "before it; assistant tokens cannot be located for the warm-up"
            )
        for j in range(start, stop):
            labels[j] = ids[j]
            if ids[j] == end:
                break
    return ids, labels
