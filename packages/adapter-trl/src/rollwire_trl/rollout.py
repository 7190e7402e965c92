"""TRL's ``rollout_func`` backed by rollwire: each prompt's group runs as rollouts of any agent.

``GRPOTrainer`` calls ``rollout_func(prompts, trainer)`` with every prompt of the generation batch
already repeated ``num_generations`` times in a row (its ``RepeatSampler``). :class:`RolloutFunction`
turns each such run into one task, runs it through a :class:`~rollwire.trainer.client.RolloutClient`
as a GRPO group of that size (gateway, runner, the agent's own code), and returns what the gateway
captured (:func:`~rollwire_trl.samples.to_rollout_output` with ``multi_row="last"``). The task
payload is the prompt itself (``{"prompt": prompt}``), or the dataset row whose prompt column it is
when ``tasks`` are given, so an agent sees every column (answers, seeds) the trainer does not.
No torch or TRL import here: the trainer is only read for its ``num_generations``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from rollwire.data.protocol import Group, Rollout
from rollwire_trl.samples import ConversionReport, to_rollout_output

__all__ = ["RolloutBatch", "RolloutFunction", "prompt_key", "rollwire_reward"]


def prompt_key(prompt: Any) -> str:
    """A hashable key for a dataset prompt (a string, or a list of chat messages)."""
    if isinstance(prompt, str):
        return prompt
    return orjson.dumps(prompt, option=orjson.OPT_SORT_KEYS).decode()


def rollwire_reward(
    completions: Sequence[Any], rollwire_reward: Sequence[Any], **_: Any
) -> list[Any]:
    """The reward function to give ``GRPOTrainer``: each rollout's own reward (the agent's),
    ``None`` for a placeholder (TRL leaves it out of the group baseline)."""
    return list(rollwire_reward)


@dataclass
class RolloutBatch:
    """One ``rollout_func`` call: the groups rolled out, what the conversion kept, and timing."""

    groups: list[Group]
    report: ConversionReport
    #: how long the rollouts took
    seconds: float
    #: how long the trainer waited for them (less than ``seconds`` when they ran ahead, async)
    waited: float | None = None

    @property
    def rollouts(self) -> list[Rollout]:
        """Every rollout of the batch, in group order."""
        return [r for g in self.groups for r in g.rollouts]


class RolloutFunction:
    """Pass an instance as ``GRPOTrainer(rollout_func=...)`` (see the module docstring).

    ``client`` is a :class:`~rollwire.trainer.client.RolloutClient`; its ``group_size`` follows
    the trainer's ``num_generations`` at each call. ``tasks`` (dataset rows) make each prompt's
    payload the row whose ``key`` column equals it (``key="task_id"`` lets the trainer's dataset
    carry only ids); without them the payload is ``{"prompt": prompt}``. ``tokenizer`` renders a
    task's ``prompt_column`` for the placeholder of a rollout that never called the model (a
    Hugging Face tokenizer with a chat template). ``on_batch`` is called with each
    :class:`RolloutBatch` (``last`` holds the latest one too).
    """

    def __init__(
        self,
        client: Any,
        *,
        tasks: Iterable[Mapping[str, Any]] | None = None,
        key: str = "prompt",
        prompt_column: str = "prompt",
        tokenizer: Any = None,
        failure_reward: float = 0.0,
        on_batch: Callable[[RolloutBatch], None] | None = None,
    ) -> None:
        self.client = client
        self.key = key
        self.prompt_column = prompt_column
        self.tokenizer = tokenizer
        self.failure_reward = failure_reward
        self.on_batch = on_batch
        self.last: RolloutBatch | None = None
        self._tasks: dict[str, dict[str, Any]] = {}
        for i, task in enumerate(tasks or ()):
            if key not in task:
                raise ValueError(
                    f"task #{i} has no {key!r} column (it has {sorted(task)}): the trainer's "
                    "dataset prompt must be a column of every task"
                )
            k = prompt_key(task[key])
            if k in self._tasks and self._tasks[k] != dict(task):
                raise ValueError(
                    f"task #{i} and an earlier one share the {key} {k[:80]!r} but differ: "
                    "rollout_func receives only the prompt, so it must tell tasks apart; make "
                    f"each {key} unique (e.g. name the task in it)"
                )
            self._tasks[k] = dict(task)

    def task_for(self, prompt: Any) -> dict[str, Any]:
        """The payload of ``prompt``: the task it names, or ``{"prompt": prompt}`` when this
        function was given no tasks."""
        if not self._tasks:
            return {"prompt": prompt}
        task = self._tasks.get(prompt_key(prompt))
        if task is None:
            raise KeyError(
                f"the trainer's prompt {prompt_key(prompt)[:80]!r} is no task's {self.key}: "
                "the trainer's dataset and the tasks given to RolloutFunction disagree"
            )
        return dict(task)

    def __call__(self, prompts: Sequence[Any], trainer: Any) -> dict[str, list[Any]]:
        """Roll out ``prompts`` (each repeated ``num_generations`` times in a row)."""
        output, batch = self.collect(prompts, trainer)
        self.deliver(batch)
        return output

    def deliver(self, batch: RolloutBatch) -> None:
        """``batch`` is the one the trainer trains on now: ``last`` and ``on_batch`` see it."""
        self.last = batch
        if self.on_batch is not None:
            self.on_batch(batch)

    def collect(
        self, prompts: Sequence[Any], trainer: Any, client: Any = None
    ) -> tuple[dict[str, list[Any]], RolloutBatch]:
        """Roll out ``prompts`` with ``client`` (default: this function's) without telling
        ``on_batch``: the rollout_func output and its batch."""
        client = client if client is not None else self.client
        training = bool(getattr(getattr(trainer, "model", None), "training", True))
        size = getattr(trainer, "num_generations" if training else "num_generations_eval", None)
        size = int(size or client.group_size)
        tasks = _tasks_of(list(prompts), size, self.task_for)
        started = time.monotonic()
        client.group_size = size
        groups = client.run(tasks)
        if len(groups) != len(tasks) or any(len(g.rollouts) != size for g in groups):
            raise RuntimeError(
                f"rollwire returned {len(groups)} groups for {len(tasks)} tasks of {size} "
                "rollouts each: a group was dropped (drop_failed_groups=True?), and TRL needs "
                "exactly one completion per prompt"
            )
        tokenizer = self.tokenizer if self.tokenizer is not None else _tokenizer_of(trainer)
        output, report = to_rollout_output(
            groups,
            multi_row="last",
            failure_reward=self.failure_reward,
            end_token_id=_end_token_id(tokenizer),
            fallback_prompt_ids=lambda r: _prompt_ids(tokenizer, r, self.prompt_column),
            return_report=True,
        )
        return output, RolloutBatch(groups, report, time.monotonic() - started)


def _tasks_of(
    prompts: list[Any], size: int, task_for: Callable[[Any], dict[str, Any]]
) -> list[dict[str, Any]]:
    if size < 1 or len(prompts) % size:
        raise ValueError(
            f"rollout_func got {len(prompts)} prompts, not a multiple of num_generations={size}"
        )
    tasks: list[dict[str, Any]] = []
    for start in range(0, len(prompts), size):
        run = prompts[start : start + size]
        key = prompt_key(run[0])
        if any(prompt_key(p) != key for p in run[1:]):
            raise ValueError(
                f"prompts {start}..{start + size - 1} are not one prompt repeated "
                f"num_generations={size} times (TRL's RepeatSampler order); rollwire runs each "
                "repeated prompt as one group"
            )
        tasks.append(task_for(run[0]))
    return tasks


def _tokenizer_of(trainer: Any) -> Any:
    tok = getattr(trainer, "processing_class", None)
    return getattr(tok, "tokenizer", tok)  # a processor wraps its tokenizer


def _end_token_id(tokenizer: Any) -> int:
    for attr in ("eos_token_id", "pad_token_id"):
        value = getattr(tokenizer, attr, None)
        if isinstance(value, int):
            return value
    return 0


def _prompt_ids(tokenizer: Any, rollout: Rollout, column: str) -> list[int]:
    prompt = (rollout.task or {}).get(column)
    if tokenizer is None or prompt is None:
        return []
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    try:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    except Exception:  # a prompt the template cannot render: the placeholder's default prompt
        return []
    if isinstance(ids, Mapping):  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    return [int(t) for t in ids]
