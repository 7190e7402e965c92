"""``rollwire train --async``: the next step's rollouts run while TRL trains on this step's.

TRL calls ``rollout_func`` once per optimizer step and trains on what it returns. :class:`AsyncRollouts`
answers each call and at once starts rolling out the batch the sampler will ask for next (its
order is read from the trainer's sampler, :class:`SamplerOrder`), on a second client, in a
thread. That batch is sampled by the policy before the update under way and, once the step's
sync lands, by the one after it — up to one version behind the weights that train on it, which
TRL's importance-sampling correction accounts for (the captured log-probs are the behaviour
policy). The gateway enforces the bound (``max_staleness``, on the trainer's version posted after
each step): a rollout that would start further behind is held until the servers catch up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from rollwire_trl.rollout import RolloutBatch, RolloutFunction, prompt_key

__all__ = ["AsyncRollouts", "SamplerOrder"]

log = logging.getLogger("rollwire.train")


class SamplerOrder:
    """Wraps the trainer's sampler and keeps the order of each epoch it hands out, so the
    prompts of the next generation batch are known before the trainer asks for them."""

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler
        self.epochs: list[list[int]] = []

    def __iter__(self) -> Iterator[int]:
        order = [int(i) for i in self.sampler]
        self.epochs.append(order)
        return iter(order)

    def __len__(self) -> int:
        return len(self.sampler)

    def __getattr__(self, name: str) -> Any:  # set_epoch and the like
        return getattr(self.sampler, name)


class _Ahead:
    """One batch rolling out in a thread."""

    def __init__(
        self, rollouts: RolloutFunction, prompts: list[Any], trainer: Any, client: Any
    ) -> None:
        self.keys = [prompt_key(p) for p in prompts]
        self.result: tuple[dict[str, list[Any]], RolloutBatch] | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(rollouts, prompts, trainer, client), daemon=True
        )
        self._thread.start()

    def _run(self, rollouts: RolloutFunction, prompts: list[Any], trainer: Any, c: Any) -> None:
        try:
            self.result = rollouts.collect(prompts, trainer, client=c)
        except BaseException as exc:  # re-raised in the trainer's thread
            self.error = exc

    def wait(self) -> tuple[dict[str, list[Any]], RolloutBatch]:
        self._thread.join()
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


class AsyncRollouts:
    """A ``rollout_func`` one batch ahead of the trainer (module docstring).

    ``rollouts`` turns prompts into TRL's dict; ``client`` is the RolloutClient the batches
    ahead run on (not the one evaluations use: each runs its own event loop). Call
    :meth:`bind` with the trainer once it is built; :meth:`close` waits for a batch still
    rolling out. ``hits`` counts the steps whose batch was ready or under way.
    """

    def __init__(self, rollouts: RolloutFunction, client: Any) -> None:
        self.rollouts = rollouts
        self.client = client
        self.hits = 0
        self.misses = 0
        self._order: SamplerOrder | None = None
        self._dataset: Any = None
        self._ahead: _Ahead | None = None

    def bind(self, order: SamplerOrder, dataset: Any, prompt_column: str = "prompt") -> None:
        """Where the next prompts come from: the sampler's recorded order over ``dataset``."""
        self._order, self._dataset = order, dataset
        self._column = prompt_column

    def __call__(self, prompts: Sequence[Any], trainer: Any) -> dict[str, list[Any]]:
        prompts = list(prompts)
        keys = [prompt_key(p) for p in prompts]
        ahead, self._ahead = self._ahead, None
        started = time.monotonic()
        if ahead is not None and ahead.keys == keys:
            output, batch = ahead.wait()
            self.hits += 1
        else:
            if ahead is not None:  # the sampler went elsewhere (a resume): drop that batch
                log.warning(
                    "the batch rolled out ahead is not the one asked for: rolling out again"
                )
                ahead.wait()
            self.misses += 1
            output, batch = self.rollouts.collect(prompts, trainer, client=self.client)
        batch.waited = time.monotonic() - started
        upcoming = self._next(keys)
        if upcoming:
            self._ahead = _Ahead(self.rollouts, upcoming, trainer, self.client)
        self.rollouts.deliver(batch)
        return output

    def _next(self, keys: list[str]) -> list[Any]:
        """The prompts right after ``keys`` in the sampler's order (none past the epoch's end)."""
        if self._order is None or not self._order.epochs:
            return []
        order = self._order.epochs[-1]
        column = [self._dataset[i][self._column] for i in order]
        n = len(keys)
        for start in range(0, len(column) - n + 1, n):
            if [prompt_key(p) for p in column[start : start + n]] == keys:
                return column[start + n : start + 2 * n]
        return []

    def close(self) -> None:
        """Wait for the batch still rolling out, if any (its rollouts are not trained on)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            try:
                ahead.wait()
            except Exception as exc:  # the run is over: say so, do not mask how it ended
                log.warning("the batch rolled out ahead failed: %s", exc)
