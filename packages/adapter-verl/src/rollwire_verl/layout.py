"""The padded batch layout verl trains on (DESIGN §9), built in NumPy from rollwire rows.

Pure and framework-free: :func:`padded_arrays` returns NumPy arrays; :mod:`rollwire_verl.dataproto`
wraps them in a ``verl.DataProto`` with one ``torch.from_numpy`` per tensor. Construction is
vectorised: every [B, P] / [B, R] array is preallocated once and filled by row slices.

Conventions (verl's own, from ``AgentLoopWorker._agent_loop_postprocess`` and
``verl.utils.model.compute_position_id_with_mask``):

- prompts are left-padded, responses right-padded, both with ``pad_token_id``;
- ``position_ids = clip(cumsum(attention_mask) - 1, 0)``: left pads get 0, right pads repeat the
  last real position;
- the reward sits at the last non-pad response token of ``rm_scores``;
- ``routed_experts[b, P - prompt_len + j]`` is the routing of token ``j`` of the row;
- ``__num_turns__`` counts like verl's agent loops: ``1 + model calls + context insertions``
  (the prompt, each assistant turn, each tool/user turn between them), so one call is 2;
- a rollout with no usable model call (crashed at start, undeliverable, ...) is one **placeholder**
  row, as verl's agent loop and the slime export give it, so that its reward still counts in its
  group's GRPO statistics: prompt and response one ``pad_token_id`` each (both attended, so verl
  sees a non-empty sequence), ``response_mask`` 0, the reward in ``rm_scores[:, 0]``, and
  ``non_tensor_batch["placeholder"]`` True.

:func:`cut_row` is the one over-long policy, shared with the agent loop: keep the last
``max_prompt_length`` prompt tokens and the first ``max_response_length`` response tokens, and cut
mask, log-probs and routing with them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from rollwire.data.credit import CreditSpec
from rollwire.data.protocol import Group, Rollout, Row, group_rollouts
from rollwire.data.trajectory import BuildMode, TokenizerLike, TrajectoryBuilder
from rollwire_verl.per_token import CREDIT_KEYS, VERSION_KEYS, credit_tensors, version_non_tensors
from rollwire_verl.rows import RowCut, cut_row, verl_num_turns

__all__ = [
    "RESERVED_NON_TENSOR_KEYS",
    "ConversionReport",
    "OverlongPolicy",
    "PaddedBatch",
    "RowCut",
    "build_layout_rows",
    "cut_row",
    "is_placeholder",
    "padded_arrays",
    "verl_num_turns",
]

OverlongPolicy = Literal["truncate", "drop"]

#: ``non_tensor_batch`` keys rollwire writes; a rollout metric may not use one of these names.
RESERVED_NON_TENSOR_KEYS: frozenset[str] = frozenset(
    {
        "uid",
        "__num_turns__",
        "multi_modal_inputs",
        "rollout_id",
        "row_index",
        "group_id",
        "status",
        "truncated",
        "has_routed_experts",
        "placeholder",
        *VERSION_KEYS,
        *CREDIT_KEYS,
    }
)


@dataclass(frozen=True)
class ConversionReport:
    """What a conversion did with the rows it was given (``to_dataproto(..., return_report=True)``).

    Kept out of ``meta_info`` so that two separately converted batches still ``DataProto.concat``
    (verl asserts that non-metric ``meta_info`` values agree).
    """

    rows: int = 0
    dropped: int = 0
    truncated: int = 0
    failed: int = 0
    excluded_failed: int = 0
    #: placeholder rows laid out for rollouts without a usable model call (a failed one is also
    #: counted in ``failed``; one left out by ``include_failed=False`` in ``excluded_failed`` only)
    placeholders: int = 0
    #: groups (``uid``) left out because none of their rows has a trainable token, and their rows
    #: (verl's OPO divides by the group's token count: 0/0 = NaN on every row of such a group)
    untrainable_groups: int = 0
    untrainable_rows: int = 0


@dataclass
class PaddedBatch:
    """NumPy form of a verl batch: ``tensors`` (dim 0 = rows), ``non_tensors``, ``meta_info``."""

    tensors: dict[str, np.ndarray]
    non_tensors: dict[str, np.ndarray]
    meta_info: dict[str, Any] = field(default_factory=dict)
    report: ConversionReport = field(default_factory=ConversionReport)

    def __len__(self) -> int:
        return int(self.tensors["input_ids"].shape[0])


@dataclass
class _Slot:
    """One row as it will be placed: the kept slices of its prompt and response."""

    row: Row
    cut: RowCut
    mask: np.ndarray
    logprobs: np.ndarray
    reward: float
    #: a rollout without a usable call: laid out as one masked pad token of prompt and response
    placeholder: bool = False

    @property
    def prompt(self) -> np.ndarray:
        return self.cut.prompt

    @property
    def response(self) -> np.ndarray:
        return self.cut.response

    @property
    def experts(self) -> np.ndarray | None:
        return self.cut.experts

    @property
    def truncated(self) -> bool:
        return self.cut.truncated


def build_layout_rows(
    batch: Iterable[Group | Rollout],
    *,
    mode: BuildMode = "merge",
    tokenizer: TokenizerLike | None = None,
    step_credit: CreditSpec | None = None,
) -> list[Row]:
    """Training rows of ``batch`` (groups, or rollouts grouped by ``group_id``), in batch order.

    A rollout with no usable model call gets one token-less placeholder row (see
    :func:`is_placeholder`) in its place, never nothing: :func:`padded_arrays` lays it out as one
    masked pad token, so the rollout's reward still counts in its group. ``step_credit``: rows
    of rollouts with step rewards get per-token credit (:mod:`rollwire.data.credit`).
    """
    builder = TrajectoryBuilder(mode, tokenizer, step_credit)
    rows: list[Row] = []
    for group in group_rollouts(batch):
        for rollout in group.rollouts:
            built = builder.build(rollout)
            rows.extend(built if built else [_placeholder_row(rollout, group.group_id)])
    return rows


def _placeholder_row(rollout: Rollout, group_id: str) -> Row:
    return Row(
        input_ids=np.zeros(0, np.int32),
        prompt_len=0,
        loss_mask=np.zeros(0, np.int8),
        logprobs=np.zeros(0, np.float32),
        turn_ids=np.zeros(0, np.int32),
        rollout_id=rollout.rollout_id,
        group_id=rollout.group_id if rollout.group_id is not None else group_id,
        task_id=rollout.task_id,
        reward=rollout.reward,
        metrics=dict(rollout.metrics),
        status=rollout.status,
    )


def is_placeholder(row: Row) -> bool:
    """Whether ``row`` stands for a rollout without a usable model call (it has no token: a
    usable call always has a prompt, so a built row never is empty)."""
    return row.input_ids.shape[0] == 0


def _reward_of(row: Row, failed: bool, failure_reward: float) -> float:
    if failed:
        return float(failure_reward)
    if row.reward is None:
        raise ValueError(
            f"rollout {row.rollout_id!r} is completed but has no reward; complete the session "
            "with a reward, or mark it failed"
        )
    return float(row.reward)


def _slots(
    rows: Sequence[Row],
    *,
    max_prompt_length: int | None,
    max_response_length: int | None,
    overlong: OverlongPolicy,
    include_failed: bool,
    failure_reward: float,
) -> tuple[list[_Slot], ConversionReport]:
    dropped = truncated = failed_n = excluded = placeholders = 0
    slots: list[_Slot] = []
    for row in rows:
        failed = row.status != "completed"
        if failed:
            failed_n += 1
            if not include_failed:
                excluded += 1
                continue
        if is_placeholder(row):
            placeholders += 1
            empty = np.zeros(0, np.int32)
            cut = RowCut(empty, empty, np.zeros(0, np.int8), np.zeros(0, np.float32), None, False)
            reward = _reward_of(row, failed, failure_reward)
            slots.append(_Slot(row, cut, cut.mask, cut.logprobs, reward, placeholder=True))
            continue
        cut = cut_row(
            row, max_prompt_length=max_prompt_length, max_response_length=max_response_length
        )
        if cut.truncated and overlong == "drop":
            dropped += 1
            continue
        mask, logprobs = cut.mask, cut.logprobs
        if failed:
            mask = np.zeros_like(mask)
            logprobs = np.zeros_like(logprobs)
        truncated += int(cut.truncated)
        slots.append(_Slot(row, cut, mask, logprobs, _reward_of(row, failed, failure_reward)))
    report = ConversionReport(
        rows=len(rows),
        dropped=dropped,
        truncated=truncated,
        failed=failed_n,
        excluded_failed=excluded,
        placeholders=placeholders,
    )
    return slots, report


def _uid(row: Row) -> str:
    return row.group_id if row.group_id is not None else row.rollout_id


def _drop_untrainable_groups(slots: list[_Slot]) -> tuple[list[_Slot], int, int]:
    """``slots`` without the groups none of whose rows has a mask-1 token; (kept, groups, rows).

    Such a group (every rollout failed, or none called the model) teaches nothing under any
    estimator, and verl's OPO baseline — a response-length-weighted mean over the group — is
    0/0 there, a NaN advantage on every row (NaN × mask 0 is still NaN in the loss).
    """
    trainable = {_uid(s.row) for s in slots if s.mask.any()}
    kept = [s for s in slots if _uid(s.row) in trainable]
    dropped_groups = len({_uid(s.row) for s in slots} - trainable)
    return kept, dropped_groups, len(slots) - len(kept)


def _object_array(values: Sequence[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = list(values)
    return out


def _check_options(
    overlong: str, max_prompt_length: int | None, max_response_length: int | None
) -> None:
    if overlong not in ("truncate", "drop"):
        raise ValueError(f"overlong must be 'truncate' or 'drop', got {overlong!r}")
    for name, limit in (
        ("max_prompt_length", max_prompt_length),
        ("max_response_length", max_response_length),
    ):
        if limit is not None and limit < 1:
            raise ValueError(f"{name} must be a positive number of tokens, got {limit!r}")


def _token_tensors(
    slots: Sequence[_Slot],
    pad_token_id: int,
    max_prompt_length: int | None,
    max_response_length: int | None,
) -> tuple[dict[str, np.ndarray], int, int]:
    """The [B, P] / [B, R] / [B, P+R] token, mask, position, log-prob and reward arrays."""
    b = len(slots)
    # a placeholder is one pad token of prompt and one of response (input_ids stays pad there)
    plens = np.fromiter(
        (1 if s.placeholder else s.prompt.shape[0] for s in slots), dtype=np.int64, count=b
    )
    rlens = np.fromiter(
        (1 if s.placeholder else s.response.shape[0] for s in slots), dtype=np.int64, count=b
    )
    p = int(max_prompt_length) if max_prompt_length is not None else int(plens.max())
    r = int(max_response_length) if max_response_length is not None else int(rlens.max())
    p = max(p, 1)
    r = max(r, 1)

    input_ids = np.full((b, p + r), pad_token_id, dtype=np.int64)
    response_mask = np.zeros((b, r), dtype=np.int64)
    logprobs = np.zeros((b, r), dtype=np.float32)
    for i, s in enumerate(slots):
        pl, rl = s.prompt.shape[0], s.response.shape[0]
        input_ids[i, p - pl : p] = s.prompt
        input_ids[i, p : p + rl] = s.response
        response_mask[i, :rl] = s.mask
        logprobs[i, :rl] = s.logprobs

    cols_p = np.arange(p, dtype=np.int64)
    cols_r = np.arange(r, dtype=np.int64)
    attention_mask = np.concatenate(
        [cols_p[None, :] >= (p - plens)[:, None], cols_r[None, :] < rlens[:, None]], axis=1
    ).astype(np.int64)
    position_ids = np.clip(np.cumsum(attention_mask, axis=1) - 1, 0, None)
    rewards = np.fromiter((s.reward for s in slots), dtype=np.float32, count=b)
    rm_scores = np.zeros((b, r), dtype=np.float32)
    rm_scores[np.arange(b), np.maximum(rlens - 1, 0)] = rewards

    return (
        {
            "prompts": input_ids[:, :p].copy(),
            "responses": input_ids[:, p:].copy(),
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "response_mask": response_mask,
            "rollout_log_probs": logprobs,
            "rm_scores": rm_scores,
        },
        p,
        r,
    )


def padded_arrays(
    rows: Sequence[Row],
    *,
    pad_token_id: int = 0,
    max_prompt_length: int | None = None,
    max_response_length: int | None = None,
    overlong: OverlongPolicy = "truncate",
    include_failed: bool = True,
    failure_reward: float = 0.0,
    routed_experts: bool | None = None,
    reward_extra_keys: Sequence[str] | None = None,
    keep_untrainable_groups: bool = False,
) -> PaddedBatch:
    """The verl layout of ``rows`` as NumPy arrays (see the module docstring for conventions).

    ``P``/``R`` are ``max_prompt_length``/``max_response_length`` when given, else the batch max.
    ``overlong="truncate"`` keeps the last ``P`` prompt and first ``R`` response tokens;
    ``"drop"`` leaves such rows out. Failed rollouts are kept with ``failure_reward`` and an
    all-zero ``response_mask`` unless ``include_failed=False``. A placeholder row (a rollout
    without a usable call, from :func:`build_layout_rows`) becomes one masked pad token of prompt
    and of response carrying the rollout's reward. ``routed_experts=None`` adds the
    tensor when any row has routing. A group (``uid``) with no trainable token at all is left
    out and counted in the report (``untrainable_groups``/``_rows``) unless
    ``keep_untrainable_groups``: verl's OPO advantage is NaN for it.
    """
    _check_options(overlong, max_prompt_length, max_response_length)
    if not rows:
        raise ValueError("empty batch: no rows to convert (no rollouts, or none with usable calls)")
    slots, report = _slots(
        rows,
        max_prompt_length=max_prompt_length,
        max_response_length=max_response_length,
        overlong=overlong,
        include_failed=include_failed,
        failure_reward=failure_reward,
    )
    if not keep_untrainable_groups:
        slots, groups, dropped_rows = _drop_untrainable_groups(slots)
        report = dataclasses.replace(
            report, untrainable_groups=groups, untrainable_rows=dropped_rows
        )
    if not slots:
        raise ValueError(
            f"no rows left to convert: {report.dropped} dropped as over-long, "
            f"{report.excluded_failed} excluded as failed, {report.untrainable_rows} in groups "
            f"without a trainable token (of {report.rows} rows; keep_untrainable_groups=True "
            "keeps those)"
        )
    tensors, p, r = _token_tensors(slots, pad_token_id, max_prompt_length, max_response_length)
    b = len(slots)
    with_experts = [s for s in slots if s.experts is not None]
    if routed_experts is None:
        routed_experts = bool(with_experts)
    if routed_experts:
        tensors["routed_experts"] = _place_experts(slots, p, r)

    non_tensors = _non_tensors(slots, reward_extra_keys)
    non_tensors.update(version_non_tensors([s.row for s in slots], [s.cut for s in slots]))
    credit, credit_rows = credit_tensors([s.cut for s in slots], [s.mask for s in slots], r)
    tensors.update(credit)
    non_tensors.update(credit_rows)
    if routed_experts:
        non_tensors["has_routed_experts"] = np.fromiter(
            (s.experts is not None for s in slots), np.bool_, count=b
        )
    extra_keys = [k for k in non_tensors if k not in RESERVED_NON_TENSOR_KEYS]
    # Only reward_extra_keys: verl's DataProto.concat asserts that non-metric meta_info agrees
    # across batches, so nothing batch-specific (counters) goes here; see ConversionReport.
    meta_info: dict[str, Any] = {"reward_extra_keys": extra_keys}
    return PaddedBatch(tensors, non_tensors, meta_info, report)


def _place_experts(slots: Sequence[_Slot], p: int, r: int) -> np.ndarray:
    shapes = {s.experts.shape[1:] for s in slots if s.experts is not None}
    if len(shapes) > 1:
        raise ValueError(
            f"rows disagree on routed-experts shape [layers, top_k]: {sorted(shapes)}; a batch "
            "must come from one model"
        )
    if not shapes:
        raise ValueError("routed_experts=True but no row has routed experts")
    layers, top_k = next(iter(shapes))
    out = np.zeros((len(slots), p + r, layers, top_k), dtype=np.int16)
    for i, s in enumerate(slots):
        if s.experts is None:
            continue
        start = p - s.prompt.shape[0]
        n = min(s.experts.shape[0], p + r - start)
        out[i, start : start + n] = s.experts[:n]
    return out


def _non_tensors(slots: Sequence[_Slot], extra_keys: Sequence[str] | None) -> dict[str, np.ndarray]:
    rows = [s.row for s in slots]
    group_ids = [_uid(row) for row in rows]
    out: dict[str, np.ndarray] = {
        "uid": _object_array(group_ids),
        "__num_turns__": np.fromiter(
            (verl_num_turns(row) for row in rows), np.int32, count=len(rows)
        ),
        "multi_modal_inputs": _object_array([{} for _ in rows]),
        "rollout_id": _object_array([row.rollout_id for row in rows]),
        "row_index": np.fromiter((row.row_index for row in rows), np.int64, count=len(rows)),
        "group_id": _object_array(group_ids),
        "status": _object_array([row.status for row in rows]),
        "truncated": np.fromiter((s.truncated for s in slots), np.bool_, count=len(rows)),
        "placeholder": np.fromiter((s.placeholder for s in slots), np.bool_, count=len(rows)),
    }
    keys = (
        list(extra_keys)
        if extra_keys is not None
        else sorted({k for row in rows for k in row.metrics})
    )
    for key in keys:
        if key in RESERVED_NON_TENSOR_KEYS:
            raise ValueError(
                f"rollout metric {key!r} collides with a non_tensor_batch key rollwire writes; "
                "rename the metric"
            )
        # A rollout without the metric (e.g. a failed one) reads 0.0, so verl can average it.
        out[key] = np.fromiter(
            (float(row.metrics.get(key, 0.0)) for row in rows), np.float64, count=len(rows)
        )
    return out
