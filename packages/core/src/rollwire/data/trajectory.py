"""From captured calls to training rows (DESIGN §6). Pure functions: no I/O, no framework imports.

``merge`` (default): a call continues a row iff its prompt starts with the row's tokens so far
(previous prompt + previous completion); the new prompt tokens in between go in with mask 0.
Otherwise a new row starts and the fork is classified. ``per_call``: one row per call.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

import numpy as np

from rollwire.data.arrays import common_prefix_len
from rollwire.data.credit import (
    CreditSpec,
    as_credit,
    step_rewards,
    step_values,
    token_advantages,
    token_step_rewards,
)
from rollwire.data.protocol import Fork, ForkKind, Group, ModelCall, Rollout, Row, group_rollouts

__all__ = ["TokenizerLike", "TrajectoryBuilder", "build_rows", "classify_fork"]

BuildMode = Literal["merge", "per_call"]


@runtime_checkable
class TokenizerLike(Protocol):
    """What fork classification needs of a tokenizer (a Hugging Face tokenizer fits as is)."""

    @property
    def all_special_ids(self) -> Collection[int]:
        """Ids of special and added control tokens."""
        ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of ``token_ids``."""
        ...


#: flag the gateway puts on a call whose request the agent retried (see ``ModelCall.retry_of``)
SUPERSEDED_FLAG = "superseded_by_retry"

_THINK_BLOCK = re.compile(r"<think>.*?(?:</think>\s*|$)", re.DOTALL)
# Whitespace next to JSON punctuation: what re-serializing tool-call arguments changes.
_JSON_SPACING = re.compile(r"\s*([{}\[\]:,])\s*")
_CONTEXT_TOKENS = 16


def _json_spacing_free(text: str) -> str:
    return _JSON_SPACING.sub(r"\1", text)


def classify_fork(
    old: np.ndarray,
    new: np.ndarray,
    position: int,
    tokenizer: TokenizerLike | None = None,
) -> ForkKind:
    """Why ``new`` (the next prompt) does not extend ``old`` (the row so far) from ``position`` on.

    In order: ``think_stripped`` (dropping the old ``<think>`` blocks explains the difference),
    ``template`` (a special token differs at the divergence), ``retokenized`` (the text agrees, up
    to JSON spacing, but the ids do not), ``truncated`` (the end of the old row reappears after
    history was cut), ``think_stripped`` again when reasoning vanished along with other edits,
    else ``other``. Without a tokenizer nothing can be told apart and the answer is ``unknown``
    (not ``other``, which says the history was edited).
    """
    if tokenizer is None:
        return "unknown"
    old_tail = old[position:]
    new_tail = new[position:]
    # Decode from a little before the divergence (identical in both) so that text-level
    # comparisons see whole words and JSON punctuation, not a token cut in half.
    start = max(0, position - _CONTEXT_TOKENS)
    text_old = tokenizer.decode(old[start:].tolist(), skip_special_tokens=False)
    text_new = tokenizer.decode(new[start:].tolist(), skip_special_tokens=False)
    had_think = "<think>" in text_old
    no_think = _THINK_BLOCK.sub("", text_old) if had_think else text_old
    if had_think and _json_spacing_free(text_new).startswith(_json_spacing_free(no_think)):
        return "think_stripped"
    specials = set(tokenizer.all_special_ids)
    at_old = int(old_tail[0]) if old_tail.size else None
    at_new = int(new_tail[0]) if new_tail.size else None
    if (at_old is not None and at_old in specials) or (at_new is not None and at_new in specials):
        return "template"
    if text_old and _json_spacing_free(text_new).startswith(_json_spacing_free(text_old)):
        return "retokenized"
    if new.shape[0] < old.shape[0]:
        return "truncated"
    # The last tokens of the old row reappearing earlier in the new text: history was cut.
    probe = tokenizer.decode(old[-_CONTEXT_TOKENS:].tolist(), skip_special_tokens=False).strip()
    if probe and "<think>" not in probe:
        at = text_new.find(probe)
        if at != -1 and at + len(probe) < len(no_think.rstrip()):
            return "truncated"
    if had_think and "<think>" not in text_new:
        return "think_stripped"
    return "other"


@dataclass
class _OpenRow:
    prompt: np.ndarray
    last_prompt: np.ndarray
    last_completion: np.ndarray
    ids: list[np.ndarray] = field(default_factory=list)
    masks: list[np.ndarray] = field(default_factory=list)
    logprobs: list[np.ndarray] = field(default_factory=list)
    turns: list[np.ndarray] = field(default_factory=list)
    versions: list[np.ndarray] = field(default_factory=list)
    version_names: list[str] = field(default_factory=list)
    calls: list[ModelCall] = field(default_factory=list)
    fork: Fork | None = None

    @property
    def length(self) -> int:
        return int(self.last_prompt.shape[0] + self.last_completion.shape[0])

    def continued_by(self, prompt: np.ndarray) -> bool:
        lp, lc = self.last_prompt.shape[0], self.last_completion.shape[0]
        if prompt.shape[0] < lp + lc:
            return False
        return bool(
            np.array_equal(prompt[:lp], self.last_prompt)
            and np.array_equal(prompt[lp : lp + lc], self.last_completion)
        )

    def tokens(self) -> np.ndarray:
        return np.concatenate([self.last_prompt, self.last_completion])

    def response_mask(self) -> np.ndarray:
        return np.concatenate(self.masks) if self.masks else np.zeros(0, np.int8)


def _add_completion(row: _OpenRow, call: ModelCall) -> None:
    n = call.completion_ids.shape[0]
    trainable = call.trainable and not call.off_policy
    row.ids.append(call.completion_ids)
    row.masks.append(np.full(n, 1 if trainable else 0, dtype=np.int8))
    row.logprobs.append(call.logprobs if trainable else np.zeros(n, np.float32))
    row.turns.append(np.full(n, call.index, dtype=np.int32))
    row.versions.append(_version_ids(row, call))
    row.calls.append(call)
    row.last_prompt = call.prompt_ids
    row.last_completion = call.completion_ids


def _add_context(row: _OpenRow, ids: np.ndarray) -> None:
    n = ids.shape[0]
    if n == 0:
        return
    row.ids.append(ids)
    row.masks.append(np.zeros(n, dtype=np.int8))
    row.logprobs.append(np.zeros(n, dtype=np.float32))
    row.turns.append(np.full(n, -1, dtype=np.int32))
    row.versions.append(np.full(n, -1, dtype=np.int32))


def _version_ids(row: _OpenRow, call: ModelCall) -> np.ndarray:
    """Per completion token, the index of its version in the row's ``version_names``."""
    ids = np.full(call.completion_ids.shape[0], -1, dtype=np.int32)
    for span in call.version_spans():
        if span.version not in row.version_names:
            row.version_names.append(span.version)
        ids[span.start : span.end] = row.version_names.index(span.version)
    return ids


def _usable(call: ModelCall) -> bool:
    # A call the agent retried is replaced by its retry: training on both would count one
    # decision twice, and the retry's prompt would fork the row.
    return (
        call.status == "ok" and call.prompt_ids.shape[0] > 0 and SUPERSEDED_FLAG not in call.flags
    )


class TrajectoryBuilder:
    """Builds training rows from a rollout's calls; see the module docstring for the two modes.

    ``credit`` turns a rollout's step rewards into ``Row.advantages`` (:mod:`rollwire.data.credit`).
    """

    def __init__(
        self,
        mode: BuildMode = "merge",
        tokenizer: TokenizerLike | None = None,
        credit: CreditSpec | None = None,
    ) -> None:
        if mode not in ("merge", "per_call"):
            raise ValueError(f"unknown trajectory mode {mode!r}: use 'merge' or 'per_call'")
        self.mode: BuildMode = mode
        self.tokenizer = tokenizer
        self.credit = as_credit(credit)

    def build(self, rollout: Rollout) -> list[Row]:
        """Rows of one rollout, in the order their first call was made."""
        calls = sorted((c for c in rollout.calls if _usable(c)), key=lambda c: c.index)
        for call in calls:
            call.validate_lengths()
        if self.mode == "per_call":
            opened = []
            for call in calls:
                row = _OpenRow(call.prompt_ids, call.prompt_ids, call.completion_ids)
                _add_completion(row, call)
                opened.append(row)
        else:
            opened = self._merge(calls)
        credit = None
        if self.credit is not None and (values := step_values(rollout, self.credit)) is not None:
            rewards = step_rewards(rollout) or {}
            credit = (
                {c.index: values[c.call_id] for c in calls if c.call_id in values},
                {c.index: rewards[c.call_id] for c in calls if c.call_id in rewards},
            )
        return [self._finish(rollout, i, row, credit) for i, row in enumerate(opened)]

    def build_many(self, batch: Iterable[Group | Rollout]) -> list[Row]:
        """Rows of every rollout of ``batch`` (groups or a flat iterable of rollouts)."""
        rows: list[Row] = []
        for group in group_rollouts(batch):
            for rollout in group.rollouts:
                rows.extend(self.build(rollout))
        return rows

    def _merge(self, calls: Sequence[ModelCall]) -> list[_OpenRow]:
        opened: list[_OpenRow] = []
        for call in calls:
            prompt = call.prompt_ids
            target = None
            for row in reversed(opened):
                if row.continued_by(prompt):
                    target = row
                    break
            if target is None:
                target = _OpenRow(prompt, prompt, call.completion_ids)
                if opened:
                    target.fork = self._fork(opened, call)
                opened.append(target)
            else:
                _add_context(target, prompt[target.length :])
            _add_completion(target, call)
        return opened

    def _fork(self, opened: Sequence[_OpenRow], call: ModelCall) -> Fork:
        prompt = call.prompt_ids
        best, best_pos = opened[-1], -1
        for row in reversed(opened):
            pos = common_prefix_len(row.tokens(), prompt)
            if pos > best_pos:
                best, best_pos = row, pos
        old = best.tokens()
        resp_start = best.prompt.shape[0]
        mask = best.response_mask()
        lost = int(mask[max(best_pos - resp_start, 0) :].sum()) if mask.size else 0
        kind = classify_fork(old, prompt, best_pos, self.tokenizer)
        return Fork(kind=kind, position=best_pos, tokens_lost=lost, call_id=call.call_id)

    @staticmethod
    def _finish(
        rollout: Rollout,
        index: int,
        row: _OpenRow,
        credit: tuple[dict[int, float], dict[int, float]] | None,
    ) -> Row:
        input_ids = np.concatenate([row.prompt, *row.ids]).astype(np.int32, copy=False)
        last = row.calls[-1]
        experts = last.routed_experts
        if experts is not None and experts.shape[0] != input_ids.shape[0] - 1:
            raise ValueError(
                f"call {last.call_id}: routed_experts cover {experts.shape[0]} positions but its "
                f"row has {input_ids.shape[0]} tokens (expected {input_ids.shape[0] - 1}); the "
                "capture is inconsistent — check the backend's --enable-return-routed-experts output"
            )
        mask, turns = np.concatenate(row.masks), np.concatenate(row.turns)
        return Row(
            input_ids=input_ids,
            prompt_len=int(row.prompt.shape[0]),
            loss_mask=mask,
            logprobs=np.concatenate(row.logprobs),
            turn_ids=turns,
            routed_experts=experts,
            rollout_id=rollout.rollout_id,
            group_id=rollout.group_id,
            task_id=rollout.task_id,
            row_index=index,
            reward=rollout.reward,
            metrics=dict(rollout.metrics),
            status=rollout.status,
            fork=row.fork,
            call_ids=[c.call_id for c in row.calls],
            finish_reason=last.finish_reason,
            policy_version=last.policy_version,
            weight_versions=list(row.version_names),
            version_ids=np.concatenate(row.versions),
            advantages=None if credit is None else token_advantages(turns, mask, credit[0]),
            step_rewards=None if credit is None else token_step_rewards(turns, mask, credit[1]),
        )


def build_rows(
    batch: Iterable[Group | Rollout],
    mode: BuildMode = "merge",
    tokenizer: TokenizerLike | None = None,
    credit: CreditSpec | None = None,
) -> list[Row]:
    """Shorthand for ``TrajectoryBuilder(mode, tokenizer, credit).build_many(batch)``."""
    return TrajectoryBuilder(mode, tokenizer, credit).build_many(batch)
