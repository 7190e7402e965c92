"""rollwire rollouts as a padded ``verl.DataProto`` (DESIGN §9), and back, and GRPO per rollout.

Needs torch and verl (``pip install "rollwire[verl]"``); the layout itself is built in NumPy by
:mod:`rollwire_verl.layout`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rollwire.adapters import ExportedRow
from rollwire.protocol import Group, Rollout
from rollwire.rewards import normalize_row_rewards
from rollwire.trajectory import BuildMode, TokenizerLike
from rollwire_verl.layout import OverlongPolicy, build_layout_rows, padded_arrays

if TYPE_CHECKING:
    import torch
    from verl import DataProto

__all__ = ["flatten_dataproto", "grpo_advantages", "normalize_rewards", "to_dataproto"]

_INSTALL_HINT = 'the verl adapter needs torch and verl: pip install "rollwire[verl]"'


def _import_torch_verl() -> tuple[Any, Any]:
    try:
        import torch
        from verl import DataProto
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(f"{_INSTALL_HINT} ({exc})") from exc
    return torch, DataProto


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
) -> DataProto:
    """A padded ``DataProto`` of ``batch`` (``Group``s, or ``Rollout``s grouped by ``group_id``).

    Keys and conventions: see the README and :mod:`rollwire_verl.layout`. ``uid`` is the task
    group id, so verl's GRPO groups the rollouts of one task. Raises ValueError for an empty
    batch, a completed rollout without a reward, or when every row was dropped.
    """
    torch, data_proto = _import_torch_verl()
    rows = build_layout_rows(batch, mode=mode, tokenizer=tokenizer)
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
    )
    tensors = {k: torch.from_numpy(v) for k, v in arrays.tensors.items()}
    data = data_proto.from_dict(
        tensors=tensors, non_tensors=arrays.non_tensors, meta_info=arrays.meta_info
    )
    data.check_consistency()
    return data


def _np(t: Any) -> np.ndarray:
    return t.detach().cpu().numpy() if hasattr(t, "detach") else np.asarray(t)


def flatten_dataproto(data: DataProto) -> list[ExportedRow]:
    """The rows of a padded ``DataProto`` with the pads stripped (by the attention mask)."""
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
    out: list[ExportedRow] = []
    for i in range(prompts.shape[0]):
        pl, rl = int(plens[i]), int(rlens[i])
        out.append(
            ExportedRow(
                rollout_id=str(rollout_ids[i]) if rollout_ids is not None else str(i),
                group_id=None if group_ids is None else str(group_ids[i]),
                prompt_ids=prompts[i, p - pl :],
                response_ids=responses[i, :rl],
                loss_mask=mask[i, :rl],
                logprobs=logprobs[i, :rl],
                reward=None if scores is None else float(scores[i]),
            )
        )
    return out


def normalize_rewards(
    data: DataProto, *, scale_by_std: bool = True, eps: float = 1e-6
) -> np.ndarray:
    """Per-row GRPO advantage over *rollouts*: a forked rollout counts once in its ``uid`` group.

    Row reward = ``rm_scores`` (or ``token_level_rewards``) summed over the response.
    """
    key = "token_level_rewards" if "token_level_rewards" in data.batch else "rm_scores"
    scores = _np(data.batch[key]).sum(axis=1)
    uid = data.non_tensor_batch["uid"]
    rollout = data.non_tensor_batch.get("rollout_id")
    if rollout is None:
        raise ValueError(
            "the DataProto has no non_tensor_batch['rollout_id']: it was not made by "
            "rollwire_verl.to_dataproto, so rows cannot be told apart from rollouts"
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

    Returns ``(advantages, returns)`` [B, R], zero on masked tokens; with ``store`` also writes
    them to ``data.batch["advantages"]`` / ``["returns"]`` for verl's actor update.
    """
    torch, _ = _import_torch_verl()
    adv = normalize_rewards(data, scale_by_std=norm_adv_by_std_in_grpo, eps=epsilon)
    mask = data.batch["response_mask"]
    advantages = torch.from_numpy(adv).to(torch.float32).unsqueeze(-1) * mask.to(torch.float32)
    if store:
        data.batch["advantages"] = advantages
        data.batch["returns"] = advantages.clone()
    return advantages, advantages
