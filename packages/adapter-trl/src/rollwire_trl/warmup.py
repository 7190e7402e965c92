"""A short supervised warm-up before RL: next-token loss on the assistant turns of conversations.

``rollwire train`` runs it on a task's teacher conversations when the policy starts from a random
model (the embedded engine's), so that RL starts from a policy that has the answer format. Only
assistant tokens (their text and the end-of-turn token) carry loss; user, observation and
template tokens are context, exactly as in an RL row.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import torch

from rollwire.data.warmup import IGNORE, Conversation, assistant_labels

__all__ = ["assistant_labels", "supervised_warmup"]


def supervised_warmup(
    model: Any,
    tokenizer: Any,
    conversations: Sequence[Conversation],
    *,
    steps: int,
    batch_size: int = 32,
    learning_rate: float = 3e-3,
    seed: int = 0,
    micro_batch_size: int = 0,
) -> list[float]:
    """``steps`` AdamW steps on batches drawn from ``conversations``; returns each step's loss
    (the mean over the batch's labelled tokens; ``micro_batch_size`` conversations per
    forward/backward pass, gradients accumulated: 0, the whole batch at once)."""
    if steps < 0 or batch_size < 1:
        raise ValueError(f"steps must be >= 0 and batch_size >= 1, got {steps} and {batch_size}")
    examples = [assistant_labels(tokenizer, c) for c in conversations]
    if steps and not examples:
        raise ValueError("the warm-up has no conversations to learn from")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    rng = random.Random(seed)
    torch.manual_seed(seed)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    size = micro_batch_size or batch_size
    losses: list[float] = []
    for _ in range(steps):
        batch = [examples[rng.randrange(len(examples))] for _ in range(batch_size)]
        labelled = sum(sum(1 for y in labels[1:] if y != IGNORE) for _, labels in batch)
        optimizer.zero_grad()
        total = 0.0
        for start in range(0, batch_size, size):
            loss = _summed_loss(model, batch[start : start + size], pad) / max(labelled, 1)
            loss.backward()
            total += float(loss.detach())
        optimizer.step()
        losses.append(total)
    model.eval()
    return losses


def _summed_loss(model: Any, batch: Sequence[tuple[list[int], list[int]]], pad: int) -> Any:
    """The summed next-token loss of ``batch``'s labelled tokens."""
    width = max(len(ids) for ids, _ in batch)
    ids = torch.tensor([x + [pad] * (width - len(x)) for x, _ in batch])
    labels = torch.tensor([y + [IGNORE] * (width - len(y)) for _, y in batch])
    mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x, _ in batch])
    logits = model(input_ids=ids, attention_mask=mask).logits
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1), reduction="sum"
    )
