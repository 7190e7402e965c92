"""rollwire's data model: captured model calls, rollouts, groups and training rows.

Pure data, no I/O. Token arrays are NumPy arrays in memory and packed base64 in JSON (see
:mod:`rollwire.data.arrays`). A call's prompt is stored as a delta against an earlier call of the same
session (DESIGN §5): :func:`encode_calls` / :func:`decode_calls` do that for whole sessions.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import numpy as np
import orjson
from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollwire.data.arrays import (
    Float32Array,
    Int8Array,
    Int16Array,
    Int32Array,
    as_array,
    common_prefix_len,
)

__all__ = [
    "CaptureMode",
    "Fork",
    "ForkKind",
    "Group",
    "ModelCall",
    "Rollout",
    "RolloutStatus",
    "Row",
    "VersionSpan",
    "decode_calls",
    "encode_calls",
    "group_rollouts",
    "version_spans_from_wire",
]

RolloutStatus = Literal["running", "completed", "failed", "timeout", "cancelled"]
TERMINAL_STATUSES: frozenset[str] = frozenset({"completed", "failed", "timeout", "cancelled"})
ForkKind = Literal["template", "retokenized", "think_stripped", "truncated", "other", "unknown"]
CaptureMode = Literal["passthrough", "tokens"]

_EMPTY_I32 = np.zeros(0, dtype=np.int32)
_EMPTY_F32 = np.zeros(0, dtype=np.float32)


class _Model(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")


class VersionSpan(_Model):
    """Completion tokens ``[start, end)`` of a call were sampled by the weights labelled
    ``version`` (vLLM's ``WeightVersionSpan`` on ``/inference/v1/generate``)."""

    version: str
    start: int = Field(ge=0)
    end: int = Field(ge=0)


def _check_tiling(spans: Sequence[VersionSpan], n: int, who: str) -> None:
    at = 0
    for span in spans:
        if span.start != at or span.end < span.start:
            break
        at = span.end
    else:
        if at == n:
            return
    got = [(s.version, s.start, s.end) for s in spans]
    raise ValueError(
        f"{who}: weight_versions {got} do not tile its {n} completion tokens as consecutive "
        "[start, end) spans from 0; the backend's version labels disagree with its tokens"
    )


def version_spans_from_wire(raw: Any, n: int) -> list[VersionSpan] | None:
    """A backend's ``weight_versions`` (vLLM's ``[{"version", "start", "end"}]`` over the
    completion) as spans, or None when it sent none or named one version (``policy_version``
    says that). Raises ValueError when they are malformed or do not tile the ``n`` tokens."""
    if not raw:
        return None
    try:
        spans = [
            VersionSpan(version=str(s["version"]), start=s["start"], end=s["end"]) for s in raw
        ]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(
            f"weight_versions must be [{{version, start, end}}, ...], got {str(raw)[:120]!r}"
        ) from exc
    _check_tiling(spans, n, "the backend's answer")
    merged: list[VersionSpan] = []
    for span in spans:
        if span.end == span.start:
            continue
        if merged and merged[-1].version == span.version:
            merged[-1] = VersionSpan(version=span.version, start=merged[-1].start, end=span.end)
        else:
            merged.append(span)
    return merged if len(merged) > 1 else None


class ModelCall(_Model):
    """One captured LLM call: the exact prompt and completion ids, log-probs, and how it was made.

    ``prompt_ids`` is the full prompt in memory; :func:`encode_calls` stores it as
    ``(parent_call_id, shared_prefix_len, new_prompt_ids)``.
    """

    call_id: str
    session_id: str
    index: int = Field(ge=0, description="position of the call in its session (0-based)")
    prompt_ids: Int32Array = Field(default_factory=lambda: _EMPTY_I32.copy())
    completion_ids: Int32Array = Field(default_factory=lambda: _EMPTY_I32.copy())
    logprobs: Float32Array = Field(default_factory=lambda: _EMPTY_F32.copy())
    routed_experts: Int16Array | None = Field(
        default=None, description="[prompt+completion-1, layers, top_k] expert ids"
    )
    parent_call_id: str | None = None
    shared_prefix_len: int = 0
    finish_reason: str | None = None
    status: Literal["ok", "failed"] = "ok"
    error: str | None = None
    sampling: dict[str, Any] = Field(default_factory=dict, description="effective parameters sent")
    trainable: bool = True
    off_policy: bool = False
    flags: list[str] = Field(default_factory=list, description="why a call is not plain on-policy")
    retry_of: str | None = None
    retry_count: int = 0
    policy_version: str | None = None
    weight_versions: list[VersionSpan] | None = Field(
        default=None,
        description="per-token version spans over the completion, when the backend labelled "
        "its tokens (tokens mode across a keep pause); None: every token is policy_version",
    )
    backend: str | None = None
    logprobs_mode: Literal["raw", "processed"] | None = None
    capture: CaptureMode = "passthrough"
    branch: int = 0
    fork_reason: str | None = None
    stream: bool = False
    started_at: float = Field(default_factory=time.time)
    latency_ms: float = 0.0
    request: dict[str, Any] = Field(default_factory=dict, description="the request as received")
    response: dict[str, Any] = Field(default_factory=dict, description="the response as returned")
    step_reward: float | None = Field(
        default=None,
        description="this turn's reward from a per-turn list, set when the rollout is assembled",
    )

    def full_tokens(self) -> np.ndarray:
        """Prompt followed by completion (the sequence the policy saw and produced)."""
        return np.concatenate([self.prompt_ids, self.completion_ids])

    def version_spans(self) -> list[VersionSpan]:
        """Which weights sampled which completion tokens: ``weight_versions`` when the backend
        labelled them, else one span of ``policy_version`` (none when that is unknown too)."""
        if self.weight_versions is not None:
            return [s for s in self.weight_versions if s.end > s.start]
        n = int(self.completion_ids.shape[0])
        if self.policy_version is None or n == 0:
            return []
        return [VersionSpan(version=self.policy_version, start=0, end=n)]

    def validate_lengths(self) -> None:
        """Raise ValueError when the arrays disagree in length (a corrupt capture)."""
        n = self.completion_ids.shape[0]
        if self.logprobs.shape[0] != n:
            raise ValueError(
                f"call {self.call_id}: {self.logprobs.shape[0]} logprobs for {n} completion tokens"
            )
        if self.weight_versions is not None:
            _check_tiling(self.weight_versions, int(n), f"call {self.call_id}")


class Rollout(_Model):
    """One session: the calls an agent made for one task attempt, and the reward it earned."""

    rollout_id: str
    group_id: str | None = None
    task_id: str | None = None
    status: RolloutStatus = "running"
    reward: float | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    error: str | None = None
    calls: list[ModelCall] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    task: dict[str, Any] | None = None
    capture: CaptureMode = "passthrough"
    created_at: float = Field(default_factory=time.time)
    completed_at: float | None = None

    @property
    def session_id(self) -> str:
        """Sessions and rollouts are one-to-one; the ids are the same."""
        return self.rollout_id

    @property
    def terminal(self) -> bool:
        """True once the rollout has a final status."""
        return self.status in TERMINAL_STATUSES

    def weight_versions(self) -> list[str]:
        """Every version that sampled a token of an ok call, in order of first use; more than one
        means the rollout crossed a weight sync."""
        out: list[str] = []
        for call in sorted(self.calls, key=lambda c: c.index):
            if call.status != "ok":
                continue
            for span in call.version_spans():
                if span.version not in out:
                    out.append(span.version)
        return out

    def to_json(self) -> bytes:
        """Compact JSON with delta-encoded prompts and messages (DESIGN §5)."""
        head = self.model_dump(mode="json", exclude={"calls"})
        head["calls"] = encode_calls(self.calls)
        return orjson.dumps(head)

    @classmethod
    def from_json(cls, data: bytes | str) -> Rollout:
        """Inverse of :meth:`to_json`."""
        obj = orjson.loads(data)
        if not isinstance(obj, dict) or "rollout_id" not in obj:
            raise ValueError("not a rollwire rollout: expected a JSON object with 'rollout_id'")
        calls = decode_calls(obj.pop("calls", []))
        rollout = cls.model_validate(obj)
        rollout.calls = calls
        return rollout


class Group(_Model):
    """The rollouts of one task (GRPO's group): same task, N attempts."""

    group_id: str
    task_id: str | None = None
    task: dict[str, Any] | None = None
    rollouts: list[Rollout] = Field(default_factory=list)

    @property
    def complete(self) -> bool:
        """True when every rollout of the group is terminal."""
        return all(r.terminal for r in self.rollouts)


class Fork(_Model):
    """Why a row ended and a new one started: the next call's prompt did not extend it."""

    kind: ForkKind
    position: int = Field(description="first token index where the new prompt differs")
    tokens_lost: int = Field(
        description="sampled tokens of the closed row at or after the divergence: trained "
        "in the old row, but the next turns see a different context for them"
    )
    call_id: str | None = Field(default=None, description="the call that started the new row")


class Row(_Model):
    """One training sequence (DESIGN §6): prompt, then a response region with per-token masks."""

    input_ids: Int32Array
    prompt_len: int
    loss_mask: Int8Array
    logprobs: Float32Array
    turn_ids: Int32Array
    routed_experts: Int16Array | None = None
    rollout_id: str
    group_id: str | None = None
    task_id: str | None = None
    row_index: int = 0
    reward: float | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    status: RolloutStatus = "completed"
    fork: Fork | None = None
    call_ids: list[str] = Field(default_factory=list)
    finish_reason: str | None = None
    policy_version: str | None = None
    weight_versions: list[str] = Field(
        default_factory=list,
        description="the versions that sampled this row's tokens, in order of first use",
    )
    version_ids: Int32Array | None = Field(
        default=None,
        description="per response token: index into weight_versions, -1 for context tokens "
        "and tokens of unknown version",
    )
    advantages: Float32Array | None = Field(
        default=None,
        description="per response token step credit (rollwire.data.credit); None without "
        "step rewards",
    )
    step_rewards: Float32Array | None = Field(
        default=None,
        description="per response token: each turn's step reward on its last sampled token, "
        "0 elsewhere (token-level scores); None without step rewards",
    )

    @model_validator(mode="after")
    def _check_lengths(self) -> Row:
        n = self.input_ids.shape[0] - self.prompt_len
        if self.prompt_len < 0 or n < 0:
            raise ValueError(
                f"prompt_len {self.prompt_len} outside input_ids of {self.input_ids.shape[0]}"
            )
        lengths = {len(self.loss_mask), len(self.logprobs), len(self.turn_ids)}
        if lengths != {n}:
            raise ValueError(
                f"loss_mask ({len(self.loss_mask)}), logprobs ({len(self.logprobs)}) and turn_ids "
                f"({len(self.turn_ids)}) must each cover the {n} response tokens"
            )
        experts = self.routed_experts
        if experts is not None and (
            experts.ndim != 3 or experts.shape[0] != self.input_ids.shape[0] - 1
        ):
            raise ValueError(
                f"routed_experts must be [len(input_ids)-1, layers, top_k] = "
                f"[{self.input_ids.shape[0] - 1}, L, K], got {list(experts.shape)}"
            )
        self._check_token_extras(n)
        return self

    def _check_token_extras(self, n: int) -> None:
        extras = (
            ("version_ids", self.version_ids),
            ("advantages", self.advantages),
            ("step_rewards", self.step_rewards),
        )
        for name, arr in extras:
            if arr is not None and len(arr) != n:
                raise ValueError(f"{name} ({len(arr)}) must cover the {n} response tokens")
        ids = self.version_ids
        if (
            ids is not None
            and ids.size
            and (int(ids.min()) < -1 or int(ids.max()) >= len(self.weight_versions))
        ):
            raise ValueError(
                f"version_ids range over [{int(ids.min())}, {int(ids.max())}] but the row has "
                f"{len(self.weight_versions)} weight_versions {self.weight_versions} (-1: none)"
            )

    def version_spans(self) -> list[tuple[str, int, int]]:
        """``(version, start, end)`` runs over the response region: maximal runs of sampled
        tokens of one version (context tokens, id -1, end a run and belong to none)."""
        ids = self.version_ids
        if ids is None or ids.size == 0:
            return []
        cuts = np.flatnonzero(np.diff(ids)) + 1
        starts = np.concatenate([[0], cuts])
        ends = np.concatenate([cuts, [ids.size]])
        return [
            (self.weight_versions[int(ids[s])], int(s), int(e))
            for s, e in zip(starts, ends)
            if ids[s] >= 0
        ]

    @property
    def prompt_ids(self) -> np.ndarray:
        """Tokens before the response region."""
        return self.input_ids[: self.prompt_len]

    @property
    def response_ids(self) -> np.ndarray:
        """Tokens of the response region (sampled and context tokens interleaved)."""
        return self.input_ids[self.prompt_len :]

    @property
    def num_turns(self) -> int:
        """Model calls merged into this row."""
        return len(self.call_ids)


def group_rollouts(batch: Iterable[Group | Rollout]) -> list[Group]:
    """Accept ``Group``s or a flat iterable of ``Rollout``s (grouped by ``group_id``)."""
    groups: list[Group] = []
    by_id: dict[str, Group] = {}
    for item in batch:
        if isinstance(item, Group):
            groups.append(item)
        elif isinstance(item, Rollout):
            gid = item.group_id or item.rollout_id
            group = by_id.get(gid)
            if group is None:
                group = Group(group_id=gid, task_id=item.task_id, task=item.task)
                by_id[gid] = group
                groups.append(group)
            group.rollouts.append(item)
        else:
            raise TypeError(
                f"expected rollwire Group or Rollout objects, got {type(item).__name__}"
            )
    return groups


def find_parent(prompt: np.ndarray, earlier: Sequence[ModelCall]) -> tuple[ModelCall | None, int]:
    """The earlier call whose prompt+completion shares the longest prefix with ``prompt``."""
    best: ModelCall | None = None
    best_len = 0
    for call in reversed(earlier):
        p, c = call.prompt_ids, call.completion_ids
        n = common_prefix_len(p, prompt)
        if n == p.shape[0]:
            n += common_prefix_len(c, prompt[n:])
        if n > best_len:
            best, best_len = call, n
            if n == prompt.shape[0]:
                break
    return best, best_len


def encode_calls(calls: Sequence[ModelCall]) -> list[dict[str, Any]]:
    """JSON form of a session's calls with prompts and messages stored as deltas (DESIGN §5)."""
    out: list[dict[str, Any]] = []
    prev_messages: list[Any] = []
    for i, call in enumerate(calls):
        parent, shared = find_parent(call.prompt_ids, calls[:i])
        d = call.model_dump(mode="json", exclude={"prompt_ids", "request"})
        d["delta"] = {
            "parent": parent.call_id if parent is not None else None,
            "shared": shared,
            "new_prompt_ids": _packed(call.prompt_ids[shared:]),
        }
        request = dict(call.request)
        messages = request.get("messages")
        if isinstance(messages, list):
            del request["messages"]
            k = _shared_messages(prev_messages, messages)
            d["shared_messages"] = k
            d["new_messages"] = messages[k:]
            prev_messages = messages
        d["request"] = request
        out.append(d)
    return out


def decode_calls(items: Sequence[dict[str, Any]]) -> list[ModelCall]:
    """Inverse of :func:`encode_calls`."""
    by_id: dict[str, ModelCall] = {}
    calls: list[ModelCall] = []
    prev_messages: list[Any] = []
    for raw in items:
        d = dict(raw)
        delta = d.pop("delta", None) or {}
        new_ids = as_array(delta.get("new_prompt_ids", []), np.int32, 1)
        parent_id = delta.get("parent")
        shared = int(delta.get("shared") or 0)
        if parent_id is not None and shared:
            parent = by_id.get(parent_id)
            if parent is None:
                raise ValueError(f"call {d.get('call_id')} refers to unknown parent {parent_id}")
            base = parent.full_tokens()[:shared]
            d["prompt_ids"] = np.concatenate([base, new_ids])
        else:
            d["prompt_ids"] = new_ids
        request = dict(d.pop("request", {}) or {})
        if "new_messages" in d:
            k = int(d.pop("shared_messages", 0))
            messages = prev_messages[:k] + list(d.pop("new_messages"))
            request["messages"] = messages
            prev_messages = messages
        d["request"] = request
        call = ModelCall.model_validate(d)
        by_id[call.call_id] = call
        calls.append(call)
    return calls


def _packed(arr: np.ndarray) -> dict[str, Any]:
    from rollwire.data.arrays import encode_array

    return encode_array(np.ascontiguousarray(arr, dtype=np.int32))


def _shared_messages(prev: list[Any], cur: list[Any]) -> int:
    n = 0
    for a, b in zip(prev, cur):
        if a != b:
            break
        n += 1
    return n
