"""Rows as Tinker datums: the tokens the policy saw and sampled, its log-probs, and advantages.

A row of ``N`` tokens (prompt, then the response region with its loss mask) becomes one datum
with ``model_input = tokens[:-1]`` and ``target_tokens = tokens[1:]``: position ``j`` predicts
token ``j + 1``. ``logprobs`` holds the behaviour policy's log-prob of each sampled target token
(the importance-sampling correction of ``importance_sampling`` and ``ppo``), and ``advantages``
the row's advantage on every trained token and 0 elsewhere (prompt, tool output, forced tokens):
Tinker's RL losses train exactly the tokens whose advantage is not zero.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rollwire.data.protocol import Group, Rollout, Row
from rollwire.data.trajectory import BuildMode, TokenizerLike, build_rows
from rollwire.trainer.train_batch import group_advantages

__all__ = [
    "DatumBuild",
    "TinkerDatum",
    "group_advantages",
    "row_datum",
    "to_datums",
]

#: keys of ``loss_fn_inputs`` the RL losses read (hosted Tinker and SkyRL alike)
LOSS_INPUTS = ("target_tokens", "logprobs", "advantages")


@dataclass
class TinkerDatum:
    """One row as a Tinker datum, beside the row facts a datum does not keep."""

    rollout_id: str
    group_id: str | None
    row_index: int
    prompt_len: int
    #: the row's loss mask over its response region (1 = sampled by the policy and trained)
    loss_mask: np.ndarray
    reward: float | None
    policy_version: str | None
    model_input: np.ndarray
    target_tokens: np.ndarray
    logprobs: np.ndarray
    advantages: np.ndarray

    @property
    def tokens(self) -> np.ndarray:
        """The row's full token sequence (model input plus the last target)."""
        return np.concatenate([self.model_input, self.target_tokens[-1:]])

    def trained(self) -> np.ndarray:
        """Boolean per target position: the token there was sampled by the policy (loss mask 1)."""
        resp = np.arange(self.target_tokens.shape[0]) + 1 - self.prompt_len
        out = np.zeros(self.target_tokens.shape[0], dtype=bool)
        ok = resp >= 0
        out[ok] = self.loss_mask[resp[ok]] == 1
        return out

    def loss_fn_inputs(self) -> dict[str, np.ndarray]:
        """``target_tokens`` (int64), ``logprobs`` and ``advantages`` (float32), one per position."""
        return {
            "target_tokens": self.target_tokens,
            "logprobs": self.logprobs,
            "advantages": self.advantages,
        }

    def to_wire(self) -> dict[str, Any]:
        """The datum as the SDK serialises it to JSON (``Datum.model_dump(mode="json")``)."""
        return {
            "model_input": {
                "chunks": [{"type": "encoded_text", "tokens": self.model_input.tolist()}]
            },
            "loss_fn_inputs": {
                name: {
                    "data": array.tolist(),
                    "dtype": "int64" if array.dtype == np.int64 else "float32",
                    "shape": list(array.shape),
                }
                for name, array in self.loss_fn_inputs().items()
            },
        }

    def to_sdk(self) -> Any:
        """The SDK's own ``tinker.types.Datum`` (needs the ``tinker`` package)."""
        try:
            from tinker import types
        except ImportError:
            raise ImportError(
                'building Tinker datums needs the Tinker SDK: pip install "rollwire-tinker[tinker]"'
            ) from None
        return types.Datum(
            model_input=types.ModelInput.from_ints(self.model_input.tolist()),
            loss_fn_inputs={
                name: types.TensorData.from_numpy(array)
                for name, array in self.loss_fn_inputs().items()
            },
        )


def row_datum(row: Row, advantage: float | np.ndarray) -> TinkerDatum:
    """The datum of one row; ``advantage`` is a scalar for the row or one value per response token.

    Only tokens with ``loss_mask == 1`` get it; when the prompt is empty the first response token
    has no context to be predicted from and is left out of the loss.
    """
    ids = row.input_ids.astype(np.int64)
    n_resp = ids.shape[0] - row.prompt_len
    if ids.shape[0] < 2 or n_resp < 1:
        raise ValueError(
            f"rollout {row.rollout_id} row {row.row_index}: a datum needs at least 2 tokens and a "
            f"response, got {ids.shape[0]} tokens with a {row.prompt_len}-token prompt"
        )
    if np.ndim(advantage) and np.shape(advantage) != (n_resp,):
        raise ValueError(
            f"rollout {row.rollout_id} row {row.row_index}: {np.shape(advantage)} advantages for "
            f"{n_resp} response tokens"
        )
    per_token = np.broadcast_to(np.asarray(advantage, dtype=np.float32), (n_resp,))
    # target position j predicts ids[j + 1], response token r = j + 1 - prompt_len
    resp = np.arange(ids.shape[0] - 1) + 1 - row.prompt_len
    in_resp = resp >= 0
    r = resp[in_resp]
    mask = row.loss_mask.astype(np.int8)
    logprobs = np.zeros(ids.shape[0] - 1, dtype=np.float32)
    logprobs[in_resp] = np.where(mask[r] == 1, row.logprobs[r], 0.0)
    advantages = np.zeros(ids.shape[0] - 1, dtype=np.float32)
    advantages[in_resp] = np.where(mask[r] == 1, per_token[r], 0.0)
    return TinkerDatum(
        rollout_id=row.rollout_id,
        group_id=row.group_id,
        row_index=row.row_index,
        prompt_len=row.prompt_len,
        loss_mask=mask,
        reward=row.reward,
        policy_version=row.policy_version,
        model_input=ids[:-1],
        target_tokens=ids[1:],
        logprobs=logprobs,
        advantages=advantages,
    )


@dataclass
class DatumBuild:
    """The datums of a batch and what was left out of it, and why."""

    datums: list[TinkerDatum]
    #: rollout id -> the reason it has no datum (failed, no reward, no usable call, too short)
    skipped: dict[str, str]
    advantages: dict[str, float]


def to_datums(
    batch: Iterable[Group | Rollout],
    *,
    mode: BuildMode = "merge",
    tokenizer: TokenizerLike | None = None,
    scale_advantages: bool = False,
    advantages: Mapping[str, float] | None = None,
    token_advantages: Mapping[tuple[str, int], np.ndarray] | None = None,
) -> DatumBuild:
    """Datums of the completed rollouts of ``batch`` (a failed, timed-out or cancelled rollout
    trains nothing and is left out of its group's mean too).

    Advantages are GRPO's unless ``advantages`` (rollout id -> value) is given;
    ``token_advantages`` ((rollout id, row index) -> one value per response token) overrides both
    for the rows it names (step-level credit).
    """
    items = list(batch)
    rollouts = [r for item in items for r in (item.rollouts if isinstance(item, Group) else [item])]
    if not rollouts:
        raise ValueError("no rollouts in the batch: nothing to turn into Tinker datums")
    skipped: dict[str, str] = {}
    usable: dict[str, Rollout] = {}
    for rollout in rollouts:
        if rollout.status != "completed":
            skipped[rollout.rollout_id] = f"status {rollout.status}"
        elif rollout.reward is None and advantages is None:
            skipped[rollout.rollout_id] = "no reward"
        else:
            usable[rollout.rollout_id] = rollout
    if advantages is None:
        rewards = {rid: float(r.reward) for rid, r in usable.items() if r.reward is not None}
        advantages = group_advantages(
            rewards, {rid: r.group_id for rid, r in usable.items()}, scale=scale_advantages
        )
    datums: list[TinkerDatum] = []
    rows = build_rows(list(usable.values()), mode=mode, tokenizer=tokenizer)
    for row in rows:
        per_token = (token_advantages or {}).get((row.rollout_id, row.row_index))
        value: float | np.ndarray = (
            per_token if per_token is not None else advantages.get(row.rollout_id, 0.0)
        )
        if row.input_ids.shape[0] < 2 or row.input_ids.shape[0] == row.prompt_len:
            skipped.setdefault(row.rollout_id, "a row shorter than two tokens")
            continue
        datums.append(row_datum(row, value))
    for rid in usable:
        if not any(d.rollout_id == rid for d in datums):
            skipped.setdefault(rid, "no usable model call")
    return DatumBuild(datums=datums, skipped=skipped, advantages=dict(advantages))


def datum_rows(datums: Sequence[TinkerDatum]) -> list[dict[str, Any]]:
    """Each datum with its row facts as one JSON-ready dict (the export's line)."""
    return [
        {
            "datum": d.to_wire(),
            "rollwire": {
                "rollout_id": d.rollout_id,
                "group_id": d.group_id,
                "row_index": d.row_index,
                "prompt_len": d.prompt_len,
                "loss_mask": d.loss_mask.tolist(),
                "reward": d.reward,
                "policy_version": d.policy_version,
            },
        }
        for d in datums
    ]
