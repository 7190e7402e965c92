"""Training through the Tinker API (any Tinker-compatible service, which rollwire's ``tinker``
backend kind also serves from): a supervised warm-up by ``cross_entropy`` on the assistant turns
of conversations, and the reference a weight sync probes against, scored by the training
client's own ``forward``. Shared by every trainer that trains through that API; the SDK is
imported when called.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rollwire.data.warmup import IGNORE, Conversation, assistant_labels

__all__ = ["WarmupResult", "sft_datum", "tinker_reference", "tinker_warmup"]


@dataclass
class WarmupResult:
    """What the warm-up did: steps, the mean loss of its last ten, wall time, every loss."""

    steps: int
    loss: float | None
    seconds: float
    losses: list[float] = field(default_factory=list)


def sft_datum(ids: Sequence[int], labels: Sequence[int]) -> Any:
    """The SDK's ``cross_entropy`` datum of a labelled sequence: weight 1 on labelled targets."""
    from tinker import types

    target = np.asarray(ids[1:], dtype=np.int64)
    weights = np.asarray([0.0 if x == IGNORE else 1.0 for x in labels[1:]], dtype=np.float32)
    return types.Datum(
        model_input=types.ModelInput.from_ints([int(t) for t in ids[:-1]]),
        loss_fn_inputs={
            "target_tokens": types.TensorData.from_numpy(target),
            "weights": types.TensorData.from_numpy(weights),
        },
    )


def tinker_warmup(
    training_client: Any,
    tokenizer: Any,
    conversations: Sequence[Conversation],
    *,
    steps: int,
    batch_size: int = 32,
    learning_rate: float = 3e-3,
    seed: int = 0,
) -> WarmupResult:
    """``steps`` Adam steps of ``cross_entropy`` on batches drawn (seeded) from ``conversations``."""
    from tinker import types

    if steps < 0 or batch_size < 1:
        raise ValueError(f"steps must be >= 0 and batch_size >= 1, got {steps} and {batch_size}")
    t0 = time.perf_counter()
    examples = [assistant_labels(tokenizer, c) for c in conversations]
    if steps and not examples:
        raise ValueError("the warm-up has no conversations to learn from")
    rng = random.Random(seed)
    # AdamW's defaults, as the TRL loop's torch warm-up uses
    adam = types.AdamParams(learning_rate=learning_rate, beta1=0.9, beta2=0.999, eps=1e-8)
    losses: list[float] = []
    for _ in range(steps):
        batch = [examples[rng.randrange(len(examples))] for _ in range(batch_size)]
        datums = [sft_datum(ids, labels) for ids, labels in batch]
        out = training_client.forward_backward(datums, "cross_entropy").result()
        training_client.optim_step(adam).result()
        total = weight = 0.0
        for datum, o in zip(datums, out.loss_fn_outputs):
            w = datum.loss_fn_inputs["weights"].to_numpy()
            total -= float((o["logprobs"].to_numpy() * w).sum())
            weight += float(w.sum())
        losses.append(total / max(weight, 1.0))
    tail = losses[-10:]
    return WarmupResult(
        steps, sum(tail) / len(tail) if tail else None, time.perf_counter() - t0, losses
    )


def tinker_reference(training_client: Any) -> Any:
    """A ``WeightSync`` reference scored by the trainer itself: the log-probs its current weights
    give ``completion_ids`` after ``prompt_ids`` (a ``forward`` with ``cross_entropy``)."""
    from tinker import types

    def score(prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
        tokens = [int(t) for t in (*prompt_ids, *completion_ids)]
        target = np.asarray(tokens[1:], dtype=np.int64)
        datum = types.Datum(
            model_input=types.ModelInput.from_ints(tokens[:-1]),
            loss_fn_inputs={
                "target_tokens": types.TensorData.from_numpy(target),
                "weights": types.TensorData.from_numpy(np.ones(target.shape, np.float32)),
            },
        )
        out = training_client.forward([datum], "cross_entropy").result()
        logprobs = out.loss_fn_outputs[0]["logprobs"].to_numpy()
        return [float(x) for x in logprobs[-len(completion_ids) :]]

    return score
