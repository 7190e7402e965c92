"""rollwire rollouts as slime ``Sample``s (DESIGN §9). Pure functions: no I/O, no slime import.

:func:`to_sample_dicts` gives the dicts in ``Sample.to_dict()`` form (``status`` as its string
value, ``spec_info`` / ``prefix_cache_info`` as dicts) that ``Sample.from_dict`` rebuilds;
:func:`to_samples` builds the real objects when slime is importable. Shape: slime's *compact*
``list[list[list[Sample]]]`` — task group × rollout × rows of that rollout — so a rollout that
forked into several rows stays one rollout (its rows share ``rollout_id``) and every leaf has the
same depth, which slime's flattening (``while isinstance(data[0], list)``) needs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from rollwire.data.protocol import Group, Rollout, Row, group_rollouts
from rollwire.data.trajectory import BuildMode, TokenizerLike, TrajectoryBuilder

__all__ = [
    "SAMPLE_FIELDS",
    "rollout_sample_dicts",
    "sample_status",
    "to_sample_dicts",
    "to_samples",
]

#: Every key of ``Sample.to_dict()`` across the slime versions rollwire targets (v0.3.1 and the
#: releases around it). ``Sample.from_dict`` passes dataclass fields to the constructor and sets
#: any other key as an attribute, so a key one version lacks does no harm.
SAMPLE_FIELDS: tuple[str, ...] = (
    "group_index",
    "index",
    "rollout_id",
    "prompt",
    "raw_prompt",
    "tokens",
    "multimodal_inputs",
    "multimodal_train_inputs",
    "response",
    "response_length",
    "label",
    "reward",
    "loss_mask",
    "weight_versions",
    "rollout_log_probs",
    "rollout_top_p_token_ids",
    "rollout_top_p_token_offsets",
    "rollout_routed_experts",
    "remove_sample",
    "teacher_log_probs",
    "status",
    "metadata",
    "generate_function_path",
    "train_metadata",
    "session_id",
    "non_generation_time",
    "spec_info",
    "prefix_cache_info",
)

#: Key under ``Sample.metadata`` where rollwire keeps its string ids, fork info and metrics
#: (slime itself reads ``metadata["raw_reward"]`` and ``metadata["round_number"]``: avoided).
METADATA_KEY = "rollwire"

_INSTALL_HINT = (
    "slime is not installed (it is not on PyPI): install it from source "
    "(git clone https://github.com/THUDM/slime && pip install -e slime) in the trainer's "
    "environment, or use rollwire_slime.to_sample_dicts() for the dict form"
)


def sample_status(rollout: Rollout, row: Row | None) -> str:
    """slime's status string for a row: ``truncated`` when the row's last call hit the length limit."""
    if rollout.status == "failed":
        return "failed"
    if rollout.status in ("cancelled", "timeout", "running"):
        return "aborted"
    if row is not None and row.finish_reason == "length":
        return "truncated"
    return "completed"


def _label(task: Mapping[str, Any] | None) -> Any:
    if not task:
        return None
    for key in ("answer", "label"):
        if task.get(key) is not None:
            return task[key]
    return None


def _prompt(row: Row, rollout: Rollout, tokenizer: TokenizerLike | None) -> Any:
    if tokenizer is not None:
        return tokenizer.decode(row.prompt_ids.tolist(), skip_special_tokens=False)
    by_id = {c.call_id: c for c in rollout.calls}
    first = by_id.get(row.call_ids[0]) if row.call_ids else None
    messages = first.request.get("messages") if first is not None else None
    return messages if isinstance(messages, list) else ""


def _weight_versions(row: Row, rollout: Rollout) -> list[str]:
    by_id = {c.call_id: c for c in rollout.calls}
    versions = []
    for cid in row.call_ids:
        call = by_id.get(cid)
        if call is not None and call.policy_version is not None:
            versions.append(str(call.policy_version))
    return versions


#: statuses whose rows slime should train on (``truncated`` is a completed rollout cut by length).
_TRAINABLE_STATUSES = frozenset({"completed", "truncated"})


def _routed_experts(row: Row) -> np.ndarray | None:
    """The row's routed experts as slime keeps them: int32 ``[len(tokens) - 1, layers, top_k]``."""
    experts = row.routed_experts
    if experts is None:
        return None
    want = row.input_ids.shape[0] - 1
    if experts.ndim != 3 or experts.shape[0] != want:
        raise ValueError(
            f"row {row.row_index} of rollout {row.rollout_id!r}: routed experts have shape "
            f"{tuple(experts.shape)}, slime needs [len(tokens) - 1 = {want}, layers, top_k]; "
            "the backend returned routing for a different sequence than the row's tokens"
        )
    return np.ascontiguousarray(experts, dtype=np.int32)


def _row_sample(
    row: Row,
    rollout: Rollout,
    *,
    num_rows: int,
    group_index: int,
    index: int,
    rollout_index: int,
    task: Mapping[str, Any] | None,
    tokenizer: TokenizerLike | None,
    failure_reward: float,
    metadata: Mapping[str, Any] | None,
    group_id: str | None,
    native: bool = False,
) -> dict[str, Any]:
    response_length = int(row.input_ids.shape[0] - row.prompt_len)
    status = sample_status(rollout, row)
    trains = status in _TRAINABLE_STATUSES
    # a failed or aborted rollout trains nothing: slime does not filter those statuses itself
    mask = row.loss_mask.astype(np.int64) if trains else np.zeros(response_length, np.int64)
    # the builder already zeroes masked logprobs; enforce it so a hand-made Row cannot leak them
    logprobs = np.where(mask == 1, row.logprobs, np.float32(0.0)).astype(np.float64)
    routed = _routed_experts(row)
    routed_out: Any = routed if routed is None or native else routed.tolist()
    meta: dict[str, Any] = dict(metadata or {})
    meta[METADATA_KEY] = {
        "rollout_id": rollout.rollout_id,
        "group_id": group_id if group_id is not None else row.group_id,
        "task_id": row.task_id,
        "session_id": rollout.session_id,
        "row_index": row.row_index,
        "num_rows": num_rows,
        "call_ids": list(row.call_ids),
        "fork": row.fork.model_dump(mode="json") if row.fork is not None else None,
        "finish_reason": row.finish_reason,
        "rollout_status": rollout.status,
        "reward": rollout.reward,
        "error": rollout.error,
        "metrics": dict(rollout.metrics),
    }
    tokens = row.input_ids.tolist()
    return {
        "group_index": group_index,
        "index": index,
        "rollout_id": rollout_index,
        "prompt": _prompt(row, rollout, tokenizer),
        "raw_prompt": None,
        "tokens": tokens,
        "multimodal_inputs": None,
        "multimodal_train_inputs": None,
        "response": (
            tokenizer.decode(row.response_ids.tolist(), skip_special_tokens=False)
            if tokenizer is not None
            else ""
        ),
        "response_length": response_length,
        "label": _label(task),
        "reward": float(rollout.reward) if rollout.reward is not None else float(failure_reward),
        "loss_mask": mask.tolist(),
        "weight_versions": _weight_versions(row, rollout),
        "rollout_log_probs": logprobs.tolist(),
        "rollout_top_p_token_ids": None,
        "rollout_top_p_token_offsets": None,
        "rollout_routed_experts": routed_out,
        "remove_sample": not trains,
        "teacher_log_probs": None,
        "status": status,
        "metadata": meta,
        "generate_function_path": None,
        "train_metadata": None,
        "session_id": rollout.session_id,
        "non_generation_time": 0.0,
        "spec_info": {
            "spec_accept_token_num": 0,
            "spec_draft_token_num": 0,
            "spec_verify_ct": 0,
            "completion_token_num": 0,
        },
        "prefix_cache_info": {"cached_tokens": 0, "total_prompt_tokens": 0},
    }


def rollout_sample_dicts(
    rollout: Rollout,
    *,
    group_index: int,
    rollout_index: int,
    index_start: int,
    task: Mapping[str, Any] | None = None,
    tokenizer: TokenizerLike | None = None,
    mode: BuildMode = "merge",
    failure_reward: float = 0.0,
    metadata: Mapping[str, Any] | None = None,
    rows: Sequence[Row] | None = None,
    shared_index: bool = False,
    group_id: str | None = None,
    native: bool = False,
) -> list[dict[str, Any]]:
    """The sample dicts of one rollout, one per row (all rows share ``rollout_id=rollout_index``).

    ``index`` counts up from ``index_start`` (or stays ``index_start`` for every row when
    ``shared_index``, as slime's own compact fan-out does for one data-source sample). A rollout
    without a usable call yields one empty sample flagged ``remove_sample`` so its group keeps
    ``n_samples_per_prompt`` entries. ``native``: routed experts as the int32 ndarray a real
    ``Sample`` holds (for ``Sample.from_dict``) instead of JSON-ready nested lists.
    """
    if rows is None:
        rows = TrajectoryBuilder(mode, tokenizer).build(rollout)
    task = task if task is not None else rollout.task
    out = [
        _row_sample(
            row,
            rollout,
            num_rows=len(rows),
            group_index=group_index,
            index=index_start if shared_index else index_start + i,
            rollout_index=rollout_index,
            task=task,
            tokenizer=tokenizer,
            failure_reward=failure_reward,
            metadata=metadata,
            group_id=group_id,
            native=native,
        )
        for i, row in enumerate(rows)
    ]
    if not out:
        out.append(
            _empty_sample(
                rollout,
                group_index=group_index,
                index=index_start,
                rollout_index=rollout_index,
                task=task,
                failure_reward=failure_reward,
                metadata=metadata,
                group_id=group_id,
            )
        )
    return out


def _empty_sample(
    rollout: Rollout,
    *,
    group_index: int,
    index: int,
    rollout_index: int,
    task: Mapping[str, Any] | None,
    failure_reward: float,
    metadata: Mapping[str, Any] | None,
    group_id: str | None,
) -> dict[str, Any]:
    empty = Row(
        input_ids=np.zeros(0, np.int32),
        prompt_len=0,
        loss_mask=np.zeros(0, np.int8),
        logprobs=np.zeros(0, np.float32),
        turn_ids=np.zeros(0, np.int32),
        rollout_id=rollout.rollout_id,
        group_id=rollout.group_id,
        task_id=rollout.task_id,
        status=rollout.status,
    )
    d = _row_sample(
        empty,
        rollout,
        num_rows=0,
        group_index=group_index,
        index=index,
        rollout_index=rollout_index,
        task=task,
        tokenizer=None,
        failure_reward=failure_reward,
        metadata=metadata,
        group_id=group_id,
    )
    d["remove_sample"] = True
    d["status"] = "failed" if rollout.status == "completed" else d["status"]
    return d


def to_sample_dicts(
    batch: Iterable[Group | Rollout],
    *,
    tokenizer: TokenizerLike | None = None,
    mode: BuildMode = "merge",
    failure_reward: float = 0.0,
    compact: bool = True,
) -> list[list[Any]]:
    """The batch as slime sample dicts: ``[group][rollout][row]`` (``[group][row]`` if not compact).

    ``group_index`` is the group's position in the batch, ``rollout_id`` the rollout's position
    (shared by its rows), ``index`` the row's position — all unique ints; rollwire's string ids
    are in ``metadata["rollwire"]``. A rollout without a reward (failed) gets ``failure_reward``.
    Plain JSON: ``rollout_routed_experts`` is a nested list here (an int32 ndarray in
    :func:`to_samples`).
    """
    return _nested_sample_dicts(
        batch,
        tokenizer=tokenizer,
        mode=mode,
        failure_reward=failure_reward,
        compact=compact,
        native=False,
    )


def _nested_sample_dicts(
    batch: Iterable[Group | Rollout],
    *,
    tokenizer: TokenizerLike | None,
    mode: BuildMode,
    failure_reward: float,
    compact: bool,
    native: bool,
) -> list[list[Any]]:
    groups = group_rollouts(batch)
    out: list[list[Any]] = []
    index = 0
    rollout_index = 0
    for group_index, group in enumerate(groups):
        per_group: list[Any] = []
        for rollout in group.rollouts:
            rows = rollout_sample_dicts(
                rollout,
                group_index=group_index,
                rollout_index=rollout_index,
                index_start=index,
                task=rollout.task if rollout.task is not None else group.task,
                tokenizer=tokenizer,
                mode=mode,
                failure_reward=failure_reward,
                group_id=group.group_id,
                native=native,
            )
            index += len(rows)
            rollout_index += 1
            if compact:
                per_group.append(rows)
            else:
                per_group.extend(rows)
        out.append(per_group)
    if rollout_index == 0:
        raise ValueError("empty batch: no rollouts to convert to slime samples")
    return out


def import_sample_class() -> Any:
    """slime's ``Sample`` class, or an ImportError that says how to get slime."""
    try:
        from slime.utils.types import Sample
    except ImportError as exc:
        raise ImportError(_INSTALL_HINT) from exc
    return Sample


def to_samples(
    batch: Iterable[Group | Rollout],
    *,
    tokenizer: TokenizerLike | None = None,
    mode: BuildMode = "merge",
    failure_reward: float = 0.0,
    compact: bool = True,
) -> list[list[Any]]:
    """Like :func:`to_sample_dicts`, each dict rebuilt by ``slime.utils.types.Sample.from_dict``.

    ``rollout_routed_experts`` stays an int32 ndarray ``[len(tokens) - 1, layers, top_k]``, what
    slime's own SGLang path stores.
    """
    sample_cls = import_sample_class()
    nested = _nested_sample_dicts(
        batch,
        tokenizer=tokenizer,
        mode=mode,
        failure_reward=failure_reward,
        compact=compact,
        native=True,
    )
    return [_map_leaves(item, sample_cls.from_dict) for item in nested]


def _map_leaves(node: Any, fn: Any) -> Any:
    if isinstance(node, list):
        return [_map_leaves(x, fn) for x in node]
    return fn(node)


def iter_sample_leaves(node: Any) -> Iterable[Any]:
    """Samples (objects or dicts) of a nested list, depth first, in order."""
    if isinstance(node, list | tuple):
        for item in node:
            yield from iter_sample_leaves(item)
    else:
        yield node
