"""verl ``AgentLoopOutput``s of a finished rollwire rollout: pure conversion, no I/O.

One row → one output; a forked rollout → a list (verl's v1 trainer) or its last row (the legacy
``AgentLoopWorker``). See :func:`rows_to_agent_loop_outputs`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

from rollwire.data.protocol import Rollout, Row
from rollwire_verl.rows import cut_row, verl_num_turns

__all__ = [
    "FailurePolicy",
    "MultiRow",
    "RolloutFailedError",
    "RoutingShape",
    "reward_extra_info",
    "rows_to_agent_loop_outputs",
    "zero_routing",
]

FailurePolicy = Literal["zero", "raise"]
MultiRow = Literal["list", "last"]


class RolloutFailedError(RuntimeError):
    """A rollout ended failed/timeout/cancelled and the loop was configured with ``on_failure="raise"``."""


#: ``(layers, top_k)`` of the backend's routed experts, when it returns routing.
RoutingShape = tuple[int, int]


def zero_routing(positions: int, shape: RoutingShape) -> np.ndarray:
    """int16 zeros ``[positions, layers, top_k]``: routing for an output that has none, so that
    verl's worker (which decides from the first output whether the batch has routing, then
    ``torch.cat``s every output's) gets one tensor per row. Such rows never train."""
    return np.zeros((positions, *shape), dtype=np.int16)


def _row_output(
    row: Row,
    *,
    reward: float,
    trainable: bool,
    metrics: AgentLoopMetrics,
    extra: dict[str, Any],
    max_prompt_length: int | None,
    max_response_length: int | None,
    routing_shape: RoutingShape | None = None,
) -> AgentLoopOutput:
    cut = cut_row(row, max_prompt_length=max_prompt_length, max_response_length=max_response_length)
    experts = None
    if cut.experts is not None:
        experts = np.ascontiguousarray(cut.experts, dtype=np.int16)
    elif routing_shape is not None:
        # verl needs a routing tensor on every row of a routed batch; a row the backend returned
        # without routing gets zeros and trains nothing (replaying expert 0 would be wrong)
        experts = zero_routing(cut.prompt.shape[0] + cut.response.shape[0], routing_shape)
        extra["rollwire_routing_missing"] = True
        trainable = False
    mask = cut.mask.astype(np.int64) if trainable else np.zeros(cut.mask.shape, np.int64)
    logprobs = cut.logprobs if trainable else np.zeros(cut.logprobs.shape, np.float32)
    if cut.truncated:
        extra["rollwire_truncated"] = True
    if cut.advantages is not None:
        # per response token (unpadded), zero where nothing trains: for a custom advantage step
        on = mask == 1
        extra["rollwire_step_advantages"] = np.where(on, cut.advantages, 0.0).tolist()
        rewards = cut.step_rewards if cut.step_rewards is not None else 0.0
        extra["rollwire_step_rewards"] = np.where(on, rewards, 0.0).tolist()
    return AgentLoopOutput(
        prompt_ids=cut.prompt.tolist(),
        response_ids=cut.response.tolist(),
        response_mask=mask.tolist(),
        response_logprobs=logprobs.astype(np.float64).tolist(),
        routed_experts=experts,
        reward_score=reward,
        num_turns=verl_num_turns(row),
        metrics=metrics,
        extra_fields=extra,
    )


def served_step(global_steps: int) -> int:
    """The weight version verl serves while it rolls out step ``global_steps``: the version of
    its last ``update_weights(global_steps)`` call, which comes at the end of each step (and with
    the step it loaded before the first): ``global_steps - 1``, at least 0. What the agent loop
    stamps on the gateway, and what verl's v1 trainer reads as ``max_global_steps``
    (``trajectory_staleness = (global_steps - 1) - max_global_steps``)."""
    return max(int(global_steps) - 1, 0)


def _weight_versions(
    rollout: Rollout, row: Row | None, global_steps: int | None
) -> tuple[int | None, int | None]:
    """``(min, max)`` weight version a row was sampled with, as verl's v1 trainer wants them.

    The versions that sampled the row's tokens (per token across a ``keep`` pause, else each
    call's ``policy_version``) when all are integers; otherwise the version verl's sync trainer
    serves during step ``global_steps``: ``global_steps - 1`` (it pushes weights with
    ``update_weights(global_steps)`` at the end of each step, and version 0 before the first),
    which is what its own loops report.
    """
    labels = row.weight_versions if row is not None else rollout.weight_versions()
    versions: list[int] = []
    for label in labels:
        try:
            versions.append(int(label))
        except ValueError:
            versions = []
            break
    if versions:
        return min(versions), max(versions)
    if global_steps is None:
        return None, None
    step = served_step(global_steps)
    return step, step


def reward_extra_info(
    rollout: Rollout, keys: Sequence[str] | None, *, multi_row: MultiRow
) -> dict[str, float]:
    """The final output's ``extra_fields["reward_extra_info"]``: the rollout's metrics.

    With ``keys`` every rollout reports the same keys — a metric the rollout lacks reads 0.0 and
    ``<key>_present`` says whether it was there (0.0 / 1.0), never NaN — because verl's legacy
    ``AgentLoopWorker`` takes the key list from the first output and indexes every other output
    with it. Without ``keys`` the rollout's own metric names are used, which only verl's v1
    trainer (``multi_row="list"``) tolerates; with ``"last"`` that is refused.
    """
    if keys is None:
        if multi_row == "last":
            raise ValueError(
                "multi_row='last' (verl's legacy AgentLoopWorker) needs reward_extra_keys: the "
                "worker reads the metric names from the first output and fails (KeyError) on any "
                "rollout whose metrics differ (a failed rollout has none). Set reward_extra_keys "
                "in the agent-loop YAML (or ROLLWIRE_REWARD_EXTRA_KEYS=key1,key2)"
            )
        return {k: float(v) for k, v in sorted(rollout.metrics.items())}
    out: dict[str, float] = {}
    for key in keys:
        present = key in rollout.metrics
        out[key] = float(rollout.metrics[key]) if present else 0.0
        out[f"{key}_present"] = 1.0 if present else 0.0
    return out


def _check_policies(on_failure: str, multi_row: str) -> None:
    if on_failure not in ("zero", "raise"):
        raise ValueError(f"on_failure must be 'zero' or 'raise', got {on_failure!r}")
    if multi_row not in ("list", "last"):
        raise ValueError(f"multi_row must be 'list' or 'last', got {multi_row!r}")


def _placeholder_output(
    rollout: Rollout,
    *,
    reward: float,
    metrics: AgentLoopMetrics,
    extra: dict[str, Any],
    fallback_prompt_ids: Sequence[int] | Callable[[], Sequence[int]] | None,
    fallback_token_id: int,
    max_prompt_length: int | None,
    routing_shape: RoutingShape | None,
) -> AgentLoopOutput:
    """One output for a failed rollout with no usable call: its prompt, one masked pad token."""
    if rollout.status == "completed":
        raise ValueError(
            f"rollout {rollout.rollout_id} completed with no usable model call: nothing to train"
        )
    fallback = fallback_prompt_ids() if callable(fallback_prompt_ids) else fallback_prompt_ids
    prompt = [int(t) for t in (fallback or [fallback_token_id])]
    if max_prompt_length is not None:
        prompt = prompt[-max_prompt_length:]
    experts = zero_routing(len(prompt) + 1, routing_shape) if routing_shape is not None else None
    return AgentLoopOutput(
        prompt_ids=prompt,
        response_ids=[int(fallback_token_id)],
        response_mask=[0],
        response_logprobs=[0.0],
        routed_experts=experts,
        reward_score=reward,
        num_turns=1,
        metrics=metrics,
        extra_fields={**extra, "rollwire_placeholder": True},
    )


def _extra_fields(
    rollout: Rollout, row: Row | None, info: dict[str, float] | None, global_steps: int | None
) -> dict[str, Any]:
    """An output's ``extra_fields``; ``info`` (the final output's) as ``reward_extra_info``."""
    lo, hi = _weight_versions(rollout, row, global_steps)
    out: dict[str, Any] = {
        "rollout_id": rollout.rollout_id,
        "row_index": row.row_index if row is not None else 0,
        "rollwire_status": rollout.status,
        "fork": row.fork.kind if row is not None and row.fork else None,
        "min_global_steps": lo,
        "max_global_steps": hi,
        "weight_versions": list(row.weight_versions if row is not None else []),
    }
    if info is not None:
        out["reward_extra_info"] = dict(info)
    return out


def rows_to_agent_loop_outputs(
    rollout: Rollout,
    rows: Sequence[Row],
    *,
    on_failure: FailurePolicy = "zero",
    failure_reward: float = 0.0,
    multi_row: MultiRow = "list",
    fallback_prompt_ids: Sequence[int] | Callable[[], Sequence[int]] | None = None,
    reward_extra_keys: Sequence[str] | None = None,
    global_steps: int | None = None,
    max_prompt_length: int | None = None,
    max_response_length: int | None = None,
    fallback_token_id: int = 0,
    routing_shape: RoutingShape | None = None,
) -> AgentLoopOutput | list[AgentLoopOutput]:
    """verl agent-loop output(s) of a finished rollout and its rows. Pure: no I/O.

    One row → one ``AgentLoopOutput``; a forked rollout → a list (``multi_row="list"``, for
    verl's v1 trainer) or its last row (``"last"``, for the legacy ``AgentLoopWorker``, which
    takes one output per sample). Every output carries the rollout reward; the final one carries
    ``extra_fields["reward_extra_info"]`` (:func:`reward_extra_info`). A failed rollout gets
    ``failure_reward`` and an all-zero mask (``on_failure="zero"``), or raises
    :class:`RolloutFailedError` (``"raise"``). A failed rollout with no usable call becomes one
    output of ``fallback_prompt_ids`` (a list, or a callable evaluated only then) and a one-token
    masked response of ``fallback_token_id`` (verl's v1 ``as_dict`` writes the reward at index -1
    of the response, so it cannot be empty). ``routing_shape`` (``(layers, top_k)``, set when the
    backend returns routing): outputs without routing get :func:`zero_routing` and train nothing.

    Outputs are cut like verl's loops cut theirs (:func:`rollwire_verl.layout.cut_row`): the last
    ``max_prompt_length`` prompt tokens, the first ``max_response_length`` response tokens (mask,
    log-probs and routing with them; ``extra_fields["rollwire_truncated"]`` marks the cut).
    Every output carries ``extra_fields["min_global_steps"/"max_global_steps"]``, from the calls'
    integer ``policy_version`` or else ``global_steps - 1`` (see :func:`_weight_versions`).
    ``num_turns`` is verl's count (:func:`rollwire_verl.layout.verl_num_turns`).
    """
    _check_policies(on_failure, multi_row)
    failed = rollout.status != "completed"
    if failed and on_failure == "raise":
        raise RolloutFailedError(
            f"rollout {rollout.rollout_id} ended {rollout.status}: {rollout.error or 'no error text'}"
        )
    if not failed and rollout.reward is None:
        raise ValueError(f"rollout {rollout.rollout_id} is completed but has no reward")
    reward = float(failure_reward) if failed else float(rollout.reward)  # type: ignore[arg-type]
    info = reward_extra_info(rollout, reward_extra_keys, multi_row=multi_row)
    metrics = AgentLoopMetrics(generate_sequences=sum(c.latency_ms for c in rollout.calls) / 1e3)

    def extra(row: Row | None, final: bool) -> dict[str, Any]:
        return _extra_fields(rollout, row, info if final else None, global_steps)

    if not rows:
        return _placeholder_output(
            rollout,
            reward=reward,
            metrics=metrics,
            extra=extra(None, True),
            fallback_prompt_ids=fallback_prompt_ids,
            fallback_token_id=fallback_token_id,
            max_prompt_length=max_prompt_length,
            routing_shape=routing_shape,
        )
    chosen = list(rows) if multi_row == "list" else [rows[-1]]
    outputs = [
        _row_output(
            row,
            reward=reward,
            trainable=not failed,
            metrics=metrics,
            extra=extra(row, i == len(chosen) - 1),
            max_prompt_length=max_prompt_length,
            max_response_length=max_response_length,
            routing_shape=routing_shape,
        )
        for i, row in enumerate(chosen)
    ]
    return outputs if len(outputs) > 1 else outputs[0]
