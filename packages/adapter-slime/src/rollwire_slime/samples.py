"""rollwire rollouts as slime ``Sample``s (DESIGN §9). Pure functions: no I/O, no slime import.

:func:`to_sample_dicts` gives the dicts in ``Sample.to_dict()`` form (``status`` as its string
value, ``spec_info`` / ``prefix_cache_info`` as dicts) that ``Sample.from_dict`` rebuilds;
:func:`to_samples` builds the real objects when slime is importable.

Shape: ``list[list[Sample]]`` — one flat list of Samples per task group. A rollout that forked
contributes several consecutive Samples sharing its ``rollout_id`` (so slime's loss reducer and
:func:`rollwire_slime.normalize_rewards` count it once). This is the one nesting that slime's
flattening (``while isinstance(data[0], list)``), its dynamic-sampling filters and its
partial-rollout abort path (both call ``sample.get_reward_value()`` / read ``sample.response`` on
every element of a group) all accept.

A rollout with no usable model call is a **placeholder** Sample, built as slime's own agent
examples build one: two pad tokens, ``response_length=1``, ``loss_mask=[0]``,
``rollout_log_probs=[0.0]``, ``remove_sample=True``. slime keeps such samples (it only zeroes their
loss mask), builds one routing tensor from *every* sample of a batch as soon as ``data[0]`` has
routing, and pads each loss mask by ``prompt_len - 1`` in Megatron's batch builder, so the
placeholder needs a prompt token, and — when the batch has routing — a ``[1, layers, top_k]``
routing whose top-k experts are distinct (slime's replay check rejects a layer whose ids are all
equal). A row without routing in a batch that has it gets the same dummy routing over all its
positions and ``metadata["rollwire"]["routing_missing"]``; under routing replay (the hooks, with
``--use-rollout-routing-replay``) it also trains nothing, since it would replay the wrong experts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from rollwire.data.credit import CreditSpec, StepCredit, as_credit
from rollwire.data.protocol import Group, Rollout, Row, group_rollouts
from rollwire.data.trajectory import BuildMode, TokenizerLike, TrajectoryBuilder
from rollwire_slime.versions import credit_reward, sample_weight_versions, version_metadata

__all__ = [
    "SAMPLE_FIELDS",
    "RoutingShape",
    "batch_routing_shape",
    "dummy_routing",
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


#: statuses whose rows slime should train on (``truncated`` is a completed rollout cut by length).
_TRAINABLE_STATUSES = frozenset({"completed", "truncated"})


#: ``(layers, top_k)`` of a batch's routed experts, or None when the batch has no routing.
RoutingShape = tuple[int, int]


def dummy_routing(positions: int, shape: RoutingShape) -> np.ndarray:
    """int32 ``[positions, layers, top_k]`` routing of experts ``0..top_k-1`` at every position.

    It stands in where no routing was captured (placeholders, rows a backend returned without
    it) so that slime can stack one tensor per sample; its top-k ids are distinct because slime's
    replay check (``validate_rollout_routed_experts_for_replay``) rejects a layer whose top-k ids
    are all zero. Samples carrying it never train (``remove_sample``).
    """
    layers, top_k = shape
    row = np.arange(top_k, dtype=np.int32)
    return np.ascontiguousarray(np.broadcast_to(row, (positions, layers, top_k)))


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


def batch_routing_shape(rows: Iterable[Row]) -> RoutingShape | None:
    """``(layers, top_k)`` of the first row with routing, or None when no row has any."""
    for row in rows:
        if row.routed_experts is not None and row.routed_experts.ndim == 3:
            return int(row.routed_experts.shape[1]), int(row.routed_experts.shape[2])
    return None


def _rollwire_meta(
    row: Row, rollout: Rollout, *, num_rows: int, group_id: str | None
) -> dict[str, Any]:
    return {
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
        "placeholder": False,
        "routing_missing": False,
        **version_metadata(row, rollout),
    }


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
    routing_shape: RoutingShape | None = None,
    mask_missing_routing: bool = False,
    step_credit: StepCredit | None = None,
) -> dict[str, Any]:
    response_length = int(row.input_ids.shape[0] - row.prompt_len)
    status = sample_status(rollout, row)
    routed = _routed_experts(row)
    routing_missing = routed is None and routing_shape is not None
    if routing_missing:
        assert routing_shape is not None
        routed = dummy_routing(row.input_ids.shape[0] - 1, routing_shape)
    # a failed or aborted rollout trains nothing (slime does not filter those statuses itself),
    # nor, under routing replay, a row whose routing is a stand-in (it would replay wrong experts)
    trains = status in _TRAINABLE_STATUSES and not (routing_missing and mask_missing_routing)
    mask = row.loss_mask.astype(np.int64) if trains else np.zeros(response_length, np.int64)
    # the builder already zeroes masked logprobs; enforce it so a hand-made Row cannot leak them
    logprobs = np.where(mask == 1, row.logprobs, np.float32(0.0)).astype(np.float64)
    routed_out: Any = routed if routed is None or native else routed.tolist()
    meta: dict[str, Any] = dict(metadata or {})
    meta[METADATA_KEY] = _rollwire_meta(row, rollout, num_rows=num_rows, group_id=group_id)
    meta[METADATA_KEY]["routing_missing"] = routing_missing
    reward = float(rollout.reward) if rollout.reward is not None else float(failure_reward)
    stepped = credit_reward(row, step_credit)
    if stepped is not None and trains:
        meta[METADATA_KEY].update(
            step_credit=step_credit.mode if step_credit else None,
            step_advantages=np.where(mask == 1, row.advantages, 0.0).tolist(),  # type: ignore[arg-type]
        )
        reward = stepped
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
        "reward": reward,
        "loss_mask": mask.tolist(),
        "weight_versions": sample_weight_versions(row, rollout),
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
    routing_shape: RoutingShape | None = None,
    mask_missing_routing: bool = False,
    pad_token_id: int = 0,
    step_credit: CreditSpec | None = None,
) -> list[dict[str, Any]]:
    """The sample dicts of one rollout, one per row (all rows share ``rollout_id=rollout_index``).

    ``index`` counts up from ``index_start`` (or stays ``index_start`` for every row when
    ``shared_index``, as slime's own fan-out does for one data-source sample). A rollout without
    a usable call yields one placeholder (see the module docstring) so its group keeps
    ``n_samples_per_prompt`` entries. ``routing_shape``: ``(layers, top_k)`` when the batch has
    routing — rows without it, and the placeholder, then get :func:`dummy_routing` (and such rows
    train nothing with ``mask_missing_routing``, which the hooks set under routing replay).
    ``native``: routed experts as the int32 ndarray a real ``Sample`` holds (for
    ``Sample.from_dict``) instead of JSON-ready nested lists. ``step_credit``: a row with step
    rewards gets its credit as ``reward`` (:mod:`rollwire_slime.versions`); ``rows`` given must
    have been built with the same credit.
    """
    credit = as_credit(step_credit)
    if rows is None:
        rows = TrajectoryBuilder(mode, tokenizer, credit).build(rollout)
    task = task if task is not None else rollout.task
    common: dict[str, Any] = {
        "group_index": group_index,
        "rollout_index": rollout_index,
        "task": task,
        "failure_reward": failure_reward,
        "metadata": metadata,
        "group_id": group_id,
        "native": native,
        "routing_shape": routing_shape,
        "mask_missing_routing": mask_missing_routing,
    }
    out = [
        _row_sample(
            row,
            rollout,
            num_rows=len(rows),
            index=index_start if shared_index else index_start + i,
            tokenizer=tokenizer,
            step_credit=credit,
            **common,
        )
        for i, row in enumerate(rows)
    ]
    if not out:
        out.append(_placeholder_sample(rollout, index=index_start, pad=pad_token_id, **common))
    return out


def _placeholder_sample(rollout: Rollout, *, index: int, pad: int, **common: Any) -> dict[str, Any]:
    """slime's placeholder for a rollout with no usable call (two pads, one masked response)."""
    empty = Row(
        input_ids=np.full(2, pad, np.int32),
        prompt_len=1,
        loss_mask=np.zeros(1, np.int8),
        logprobs=np.zeros(1, np.float32),
        turn_ids=np.full(1, -1, np.int32),
        rollout_id=rollout.rollout_id,
        group_id=rollout.group_id,
        task_id=rollout.task_id,
        status=rollout.status,
    )
    d = _row_sample(empty, rollout, num_rows=0, index=index, tokenizer=None, **common)
    d["remove_sample"] = True
    d["loss_mask"] = [0]
    d["rollout_log_probs"] = [0.0]
    d["status"] = "failed" if rollout.status == "completed" else d["status"]
    d["metadata"][METADATA_KEY]["placeholder"] = True
    # a placeholder has no captured routing to be missing; the dummy one only keeps slime's
    # batch tensors whole
    d["metadata"][METADATA_KEY]["routing_missing"] = False
    return d


def to_sample_dicts(
    batch: Iterable[Group | Rollout],
    *,
    tokenizer: TokenizerLike | None = None,
    mode: BuildMode = "merge",
    failure_reward: float = 0.0,
    pad_token_id: int = 0,
    step_credit: CreditSpec | None = None,
) -> list[list[dict[str, Any]]]:
    """The batch as slime sample dicts: ``[group][sample]``, a forked rollout's rows consecutive.

    ``group_index`` is the group's position in the batch, ``rollout_id`` the rollout's position
    (shared by its rows), ``index`` the row's position — all unique ints; rollwire's string ids
    are in ``metadata["rollwire"]``. A rollout without a reward (failed) gets ``failure_reward``.
    Plain JSON: ``rollout_routed_experts`` is a nested list here (an int32 ndarray in
    :func:`to_samples`). ``pad_token_id`` fills placeholders. ``step_credit``: rollouts with
    step rewards get per-sample step credit (:mod:`rollwire_slime.versions`).
    """
    return _nested_sample_dicts(
        batch,
        tokenizer=tokenizer,
        mode=mode,
        failure_reward=failure_reward,
        pad_token_id=pad_token_id,
        native=False,
        step_credit=step_credit,
    )


def _nested_sample_dicts(
    batch: Iterable[Group | Rollout],
    *,
    tokenizer: TokenizerLike | None,
    mode: BuildMode,
    failure_reward: float,
    pad_token_id: int,
    native: bool,
    step_credit: CreditSpec | None = None,
) -> list[list[dict[str, Any]]]:
    groups = group_rollouts(batch)
    builder = TrajectoryBuilder(mode, tokenizer, step_credit)
    built = [[builder.build(r) for r in g.rollouts] for g in groups]
    shape = batch_routing_shape(row for g in built for rows in g for row in rows)
    out: list[list[dict[str, Any]]] = []
    index = 0
    rollout_index = 0
    for group_index, (group, group_rows) in enumerate(zip(groups, built)):
        per_group: list[dict[str, Any]] = []
        for rollout, rows in zip(group.rollouts, group_rows):
            samples = rollout_sample_dicts(
                rollout,
                group_index=group_index,
                rollout_index=rollout_index,
                index_start=index,
                task=rollout.task if rollout.task is not None else group.task,
                tokenizer=tokenizer,
                failure_reward=failure_reward,
                rows=rows,
                group_id=group.group_id,
                native=native,
                routing_shape=shape,
                pad_token_id=pad_token_id,
                step_credit=step_credit,
            )
            index += len(samples)
            rollout_index += 1
            per_group.extend(samples)
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
    pad_token_id: int = 0,
    step_credit: CreditSpec | None = None,
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
        pad_token_id=pad_token_id,
        native=True,
        step_credit=step_credit,
    )
    return [[sample_cls.from_dict(d) for d in group] for group in nested]


def iter_sample_leaves(node: Any) -> Iterable[Any]:
    """Samples (objects or dicts) of a nested list, depth first, in order."""
    if isinstance(node, list | tuple):
        for item in node:
            yield from iter_sample_leaves(item)
    else:
        yield node
