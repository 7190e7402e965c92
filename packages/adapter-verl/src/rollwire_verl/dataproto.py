"""rollwire rollouts as a padded ``verl.DataProto`` (DESIGN §9), and back, and GRPO per rollout.

Needs torch and verl (``pip install "rollwire[verl]"``); the layout itself is built in NumPy by
:mod:`rollwire_verl.layout`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy as np

from rollwire.data.credit import CreditSpec
from rollwire.data.protocol import Group, Rollout
from rollwire.data.rewards import normalize_row_rewards
from rollwire.data.trajectory import BuildMode, TokenizerLike
from rollwire.plugins.protocols import ExportedRow
from rollwire_verl.layout import (
    ConversionReport,
    OverlongPolicy,
    build_layout_rows,
    padded_arrays,
)

if TYPE_CHECKING:
    import torch
    from verl import DataProto

__all__ = [
    "ConversionReport",
    "flatten_dataproto",
    "grpo_advantages",
    "normalize_rewards",
    "step_advantages",
    "to_dataproto",
]

_INSTALL_HINT = 'the verl adapter needs torch and verl: pip install "rollwire[verl]"'


def _import_torch_verl() -> tuple[Any, Any]:
    try:
        import torch
        from verl import DataProto
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(f"{_INSTALL_HINT} ({exc})") from exc
    return torch, DataProto


@overload
def to_dataproto(
    batch: Iterable[Group | Rollout],
    *,
    pad_token_id: int = 0,
    max_prompt_length: int | None = None,
    max_response_length: int | None = None,
    overlong: OverlongPolicy = "truncate",
    mode: BuildMode = "merge",
    tokenizer: TokenizerLike | None = None,
    include_failed: bool = True,
    failure_reward: float = 0.0,
    routed_experts: bool | None = None,
    reward_extra_keys: Sequence[str] | None = None,
    keep_untrainable_groups: bool = False,
    step_credit: CreditSpec | None = None,
    return_report: Literal[False] = False,
) -> DataProto: ...


@overload
def to_dataproto(
    batch: Iterable[Group | Rollout],
    *,
    pad_token_id: int = 0,
    max_prompt_length: int | None = None,
    max_response_length: int | None = None,
    overlong: OverlongPolicy = "truncate",
    mode: BuildMode = "merge",
    tokenizer: TokenizerLike | None = None,
    include_failed: bool = True,
    failure_reward: float = 0.0,
    routed_experts: bool | None = None,
    reward_extra_keys: Sequence[str] | None = None,
    keep_untrainable_groups: bool = False,
    step_credit: CreditSpec | None = None,
    return_report: Literal[True],
) -> tuple[DataProto, ConversionReport]: ...


def to_dataproto(
    batch: Iterable[Group | Rollout],
    *,
    pad_token_id: int = 0,
    max_prompt_length: int | None = None,
    max_response_length: int | None = None,
    overlong: OverlongPolicy = "truncate",
    mode: BuildMode = "merge",
    tokenizer: TokenizerLike | None = None,
    include_failed: bool = True,
    failure_reward: float = 0.0,
    routed_experts: bool | None = None,
    reward_extra_keys: Sequence[str] | None = None,
    keep_untrainable_groups: bool = False,
    step_credit: CreditSpec | None = None,
    return_report: bool = False,
) -> DataProto | tuple[DataProto, ConversionReport]:
    """A padded ``DataProto`` of ``batch`` (``Group``s, or ``Rollout``s grouped by ``group_id``).

    Keys and conventions: see the README and :mod:`rollwire_verl.layout`. ``uid`` is the task
    group id, so verl's GRPO groups the rollouts of one task. With ``return_report`` also returns
    a :class:`ConversionReport` (rows dropped / truncated / failed / excluded / placeholders). A
    rollout without a usable model call is one masked placeholder row, never dropped (a failed
    one only with ``include_failed``; see :mod:`rollwire_verl.layout`). A task group none of whose
    rows has a trainable token is left out (counted in the report; verl's OPO would give it NaN
    advantages) unless ``keep_untrainable_groups``. ``step_credit`` (``"broadcast"``,
    ``"discounted"`` or a :class:`~rollwire.data.credit.StepCredit`) adds ``step_advantages`` and
    ``step_rewards`` for rollouts with step rewards (:mod:`rollwire_verl.per_token`; use
    :func:`step_advantages`). Raises ValueError
    for an empty batch, a completed rollout without a reward, or when every row was dropped.
    """
    torch, data_proto = _import_torch_verl()
    rows = build_layout_rows(batch, mode=mode, tokenizer=tokenizer, step_credit=step_credit)
    arrays = padded_arrays(
        rows,
        pad_token_id=pad_token_id,
        max_prompt_length=max_prompt_length,
        max_response_length=max_response_length,
        overlong=overlong,
        include_failed=include_failed,
        failure_reward=failure_reward,
        routed_experts=routed_experts,
        reward_extra_keys=reward_extra_keys,
        keep_untrainable_groups=keep_untrainable_groups,
    )
    tensors = {k: torch.from_numpy(v) for k, v in arrays.tensors.items()}
    data = data_proto.from_dict(
        tensors=tensors, non_tensors=arrays.non_tensors, meta_info=arrays.meta_info
    )
    data.check_consistency()
    return (data, arrays.report) if return_report else data


def _np(t: Any) -> np.ndarray:
    return t.detach().cpu().numpy() if hasattr(t, "detach") else np.asarray(t)


def flatten_dataproto(data: DataProto) -> list[ExportedRow]:
    """The rows of a padded ``DataProto`` with the pads stripped (by the attention mask).

    Placeholder rows (``non_tensor_batch["placeholder"]``: a rollout without a usable model call,
    one masked pad token) hold none of the rollout's tokens and are left out, so the result has
    the rows :class:`rollwire.data.trajectory.TrajectoryBuilder` gives.
    """
    prompts = _np(data.batch["prompts"])
    responses = _np(data.batch["responses"])
    attention = _np(data.batch["attention_mask"])
    mask = _np(data.batch["response_mask"])
    logprobs = (
        _np(data.batch["rollout_log_probs"])
        if "rollout_log_probs" in data.batch
        else np.zeros(mask.shape, np.float32)
    )
    scores = _np(data.batch["rm_scores"]).sum(axis=1) if "rm_scores" in data.batch else None
    p = prompts.shape[1]
    plens = attention[:, :p].sum(axis=1)
    rlens = attention[:, p:].sum(axis=1)
    ntb = data.non_tensor_batch
    rollout_ids = ntb.get("rollout_id", ntb.get("uid"))
    group_ids = ntb.get("group_id", ntb.get("uid"))
    experts = _np(data.batch["routed_experts"]) if "routed_experts" in data.batch else None
    has_experts = ntb.get("has_routed_experts")
    placeholder = ntb.get("placeholder")
    with_experts = "routed_experts" in {f.name for f in dataclasses.fields(ExportedRow)}
    out: list[ExportedRow] = []
    for i in range(prompts.shape[0]):
        if placeholder is not None and bool(placeholder[i]):
            continue
        pl, rl = int(plens[i]), int(rlens[i])
        extra: dict[str, Any] = {}
        if with_experts:
            row_experts = None
            if experts is not None and (has_experts is None or bool(has_experts[i])):
                # token j's routing sits at column P - prompt_len + j; a row carries the routing
                # of every token fed through the model: all but the last
                row_experts = experts[i, p - pl : p + rl - 1]
            extra["routed_experts"] = row_experts
        out.append(
            ExportedRow(
                rollout_id=str(rollout_ids[i]) if rollout_ids is not None else str(i),
                group_id=None if group_ids is None else str(group_ids[i]),
                prompt_ids=prompts[i, p - pl :],
                response_ids=responses[i, :rl],
                loss_mask=mask[i, :rl],
                logprobs=logprobs[i, :rl],
                reward=None if scores is None else float(scores[i]),
                **extra,
            )
        )
    return out


def _rollout_rewards(data: DataProto) -> np.ndarray:
    """Each row's *outcome* reward: ``rm_scores`` (or verl's copy, ``token_level_scores``) summed.

    Not ``token_level_rewards``: with ``algorithm.use_kl_in_reward`` verl folds a per-token KL
    penalty into it, which differs between the rows of one rollout.
    """
    for key in ("rm_scores", "token_level_scores"):
        if key in data.batch:
            return _np(data.batch[key]).astype(np.float64).sum(axis=1)
    raise ValueError(
        "the DataProto has neither batch['rm_scores'] nor batch['token_level_scores']: no "
        "outcome reward to normalise"
    )


def normalize_rewards(
    data: DataProto, *, scale_by_std: bool = True, eps: float = 1e-6
) -> np.ndarray:
    """Per-row GRPO advantage over *rollouts*: a forked rollout counts once in its ``uid`` group.

    A row's reward is its outcome reward, ``rm_scores`` summed over the response (never
    ``token_level_rewards``, which may carry a per-token KL penalty). Raises ValueError when the
    rows of one rollout disagree on it, since then no single rollout reward exists.
    """
    scores = _rollout_rewards(data)
    uid = data.non_tensor_batch["uid"]
    rollout = data.non_tensor_batch.get("rollout_id")
    if rollout is None:
        raise ValueError(
            "the DataProto has no non_tensor_batch['rollout_id']: it was not made by "
            "rollwire_verl.to_dataproto, so rows cannot be told apart from rollouts"
        )
    seen: dict[tuple[Any, Any], float] = {}
    for g, r, v in zip(uid, rollout, scores.tolist()):
        first = seen.setdefault((g, r), v)
        if abs(first - v) > 1e-6 * max(1.0, abs(first)):
            raise ValueError(
                f"rows of rollout {r!r} carry different rewards ({first} and {v}): a rollout "
                "has one outcome reward; were rm_scores changed per row?"
            )
    return normalize_row_rewards(
        scores.tolist(), list(uid), list(rollout), scale_by_std=scale_by_std, eps=eps
    )


def grpo_advantages(
    data: DataProto,
    *,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
    store: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantages like verl's ``compute_grpo_outcome_advantage``, but per rollout.

    Returns ``(advantages, returns)`` [B, R] float32, zero on masked tokens, two separate tensors
    (as verl's estimators return them; GRPO's returns equal its advantages). With ``store`` the
    same two tensors are written to ``data.batch["advantages"]`` / ``["returns"]``.

    Not registered with verl's ``register_adv_est``: verl calls registered estimators with
    ``token_level_rewards``, ``response_mask``, ``index`` (= ``uid``) and ``config`` only, so an
    estimator cannot tell the rows of one rollout apart. Call it in a custom trainer step in place
    of ``compute_advantage`` (see the README).
    """
    torch, _ = _import_torch_verl()
    adv = normalize_rewards(data, scale_by_std=norm_adv_by_std_in_grpo, eps=epsilon)
    mask = data.batch["response_mask"]
    advantages = torch.from_numpy(adv).to(torch.float32).unsqueeze(-1) * mask.to(torch.float32)
    returns = advantages.clone()
    if store:
        data.batch["advantages"] = advantages
        data.batch["returns"] = returns
    return advantages, returns


def step_advantages(data: DataProto, *, store: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages, returns)`` [B, R] from the export's ``step_advantages`` (step-level credit,
    :mod:`rollwire.data.credit`), zero on masked tokens; stored in ``data.batch`` with ``store``.

    Call it in a custom trainer step in place of ``compute_advantage``, as :func:`grpo_advantages`.
    Raises ValueError when the batch has no step credit (``to_dataproto(step_credit=...)`` on
    rollouts with step rewards).
    """
    if "step_advantages" not in data.batch:
        raise ValueError(
            "the DataProto has no batch['step_advantages']: convert with "
            "to_dataproto(..., step_credit='broadcast' or 'discounted') rollouts whose calls "
            "carry step rewards"
        )
    torch, _ = _import_torch_verl()
    mask = data.batch["response_mask"].to(torch.float32)
    advantages = data.batch["step_advantages"].to(torch.float32) * mask
    returns = advantages.clone()
    if store:
        data.batch["advantages"] = advantages
        data.batch["returns"] = returns
    return advantages, returns
