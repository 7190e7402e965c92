"""A faithful minimal stand-in for the parts of slime a rollwire batch goes through.

slime is not on PyPI, so the tests cannot import it. Written from slime's behaviour (v0.3.1 and its
main branch, observed by running rollwire exports through slime's own code): a ``Sample``
dataclass with a nested ``Status`` enum, ``to_dict`` / ``from_dict``, ``get_reward_value``, the
response-length check ``_validate_response_metadata_lengths``; the fan-out check of
``validate_rollout_id_annotated``; the flattening of a rollout function's output; the
dynamic-sampling reward-std filter and the partial-rollout abort loop (both read every element of a
group as a ``Sample``); and the train-data conversion (one routing tensor per sample as soon as
``data[0]`` has routing, the routing-replay check, and Megatron's loss-mask padding by
``prompt_len - 1``). Not slime's code: our own, to validate like it.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np
import pytest


@dataclass
class SpecInfo:
    spec_accept_token_num: int = 0
    spec_draft_token_num: int = 0
    spec_verify_ct: int = 0
    completion_token_num: int = 0

    def to_dict(self) -> dict[str, int]:
        return dict(self.__dict__)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> SpecInfo:
        return SpecInfo(**{k: int(data.get(k, 0)) for k in SpecInfo.__dataclass_fields__})


@dataclass
class PrefixCacheInfo:
    cached_tokens: int = 0
    total_prompt_tokens: int = 0

    def to_dict(self) -> dict[str, int]:
        return dict(self.__dict__)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> PrefixCacheInfo:
        return PrefixCacheInfo(
            int(data.get("cached_tokens", 0)), int(data.get("total_prompt_tokens", 0))
        )


@dataclass
class Sample:
    """slime's ``Sample`` fields (types as slime annotates them)."""

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, str]] = ""
    raw_prompt: list[dict[str, str]] | None = None
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    rollout_top_p_token_ids: list[int] | None = None
    rollout_top_p_token_offsets: list[int] | None = None
    rollout_routed_experts: Any = None  # list[list[int]] | array [len(tokens) - 1, layers, top_k]
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)
    generate_function_path: str | None = None
    train_metadata: dict[str, Any] | None = None
    session_id: str | None = None
    non_generation_time: float = 0.0
    spec_info: SpecInfo = field(default_factory=SpecInfo)
    prefix_cache_info: PrefixCacheInfo = field(default_factory=PrefixCacheInfo)

    def to_dict(self) -> dict[str, Any]:
        value = self.__dict__.copy()
        value["status"] = self.status.value
        value["spec_info"] = self.spec_info.to_dict()
        value["prefix_cache_info"] = self.prefix_cache_info.to_dict()
        return value

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Sample:
        data = dict(data)
        data["status"] = Sample.Status(data["status"])
        data["spec_info"] = SpecInfo.from_dict(data.get("spec_info", {}))
        data["prefix_cache_info"] = PrefixCacheInfo.from_dict(data.get("prefix_cache_info", {}))
        names = set(Sample.__dataclass_fields__)
        sample = Sample(**{k: v for k, v in data.items() if k in names})
        for key, value in data.items():
            if key not in names:
                setattr(sample, key, value)
        sample._validate_response_metadata_lengths()
        return sample

    def get_reward_value(self, args: Any) -> Any:
        """slime's reward read: ``reward`` or ``reward[args.reward_key]``."""
        key = getattr(args, "reward_key", None)
        return self.reward if not key else self.reward[key]  # type: ignore[index]

    def _validate_response_metadata_lengths(self) -> None:
        if self.loss_mask is not None and len(self.loss_mask) != self.response_length:
            raise ValueError(
                f"loss_mask length {len(self.loss_mask)} != response_length {self.response_length}"
            )
        if self.rollout_log_probs is not None and len(self.rollout_log_probs) != (
            self.response_length
        ):
            raise ValueError(
                f"rollout_log_probs length {len(self.rollout_log_probs)} != response_length "
                f"{self.response_length}"
            )
        experts = self.rollout_routed_experts
        if experts is not None and len(experts) != len(self.tokens) - 1:
            raise ValueError(f"routed experts cover {len(experts)} positions, not len(tokens)-1")


def validate_rollout_id_annotated(node: Any, depth: int = 0) -> None:
    """Compact rollouts (leaf lists at depth >= 2) must share one non-None ``rollout_id``."""
    if isinstance(node, Sample):
        return
    assert isinstance(node, list), f"unexpected rollout output node {type(node).__name__}"
    if node and isinstance(node[0], Sample):
        if depth >= 2 and len(node) > 1:
            ids = [s.rollout_id for s in node]
            assert None not in ids, f"compact rollout without rollout_id: {ids}"
            assert len(set(ids)) == 1, f"siblings must share rollout_id: {ids}"
        return
    for item in node:
        validate_rollout_id_annotated(item, depth + 1)


def flatten_like_slime(data: list[Any]) -> list[Sample]:
    """slime's flattening of a rollout function's output: it looks only at ``data[0]``."""
    while data and isinstance(data[0], list):
        data = [x for item in data for x in item]
    return data


def reward_nonzero_std(args: Any, group: list[Any]) -> bool:
    """slime's ``check_reward_nonzero_std``: keep a group whose rewards are not all equal."""
    rewards = np.asarray([sample.get_reward_value(args) for sample in group], dtype=np.float64)
    return bool(rewards.std(ddof=1) > 1e-6) if rewards.shape[0] > 1 else False


def collect_partial(groups: list[list[Any]], rollout_id: int) -> int:
    """slime's partial-rollout abort loop over finished groups: marks and counts each sample."""
    count = 0
    for group in groups:
        for sample in group:
            if sample.response and "start_rollout_id" not in sample.metadata:
                sample.metadata["start_rollout_id"] = rollout_id
        count += len(group)
    return count


def train_data(samples: list[Sample], args: Any) -> dict[str, Any]:
    """slime's train-data conversion of the flat sample list, as far as routing and masks go."""
    out: dict[str, Any] = {"loss_masks": []}
    for s in samples:
        mask = [0] * s.response_length if s.remove_sample else list(s.loss_mask or [])
        assert len(mask) == s.response_length
        out["loss_masks"].append(mask)
    if samples[0].rollout_log_probs is not None:
        out["rollout_log_probs"] = [list(s.rollout_log_probs) for s in samples]  # type: ignore[arg-type]
    if samples[0].rollout_routed_experts is not None:
        # slime builds a tensor from every sample's routing once the first one has routing
        routed = []
        for s in samples:
            if s.rollout_routed_experts is None:
                raise TypeError("can't convert None to a routing tensor")
            routed.append(np.asarray(s.rollout_routed_experts))
        if getattr(args, "use_rollout_routing_replay", False):
            validate_replay(routed, args)
        out["rollout_routed_experts"] = routed
    # Megatron's batch builder: mask aligned to the token stream with prompt_len - 1 left pad
    for s, mask in zip(samples, out["loss_masks"]):
        left = len(s.tokens) - s.response_length - 1
        if left < 0:
            raise RuntimeError(f"negative padding {left}: a sample needs a prompt token")
        assert len([0] * left + mask + [0]) == len(s.tokens)
    return out


def validate_replay(routed: list[np.ndarray], args: Any) -> None:
    """slime's routing-replay check: ``[*, layers, top_k]``, rows present, no all-zero MoE layer."""
    layers, top_k = int(args.num_layers), int(args.moe_router_topk)
    for i, experts in enumerate(routed):
        if experts.ndim != 3 or tuple(experts.shape[1:]) != (layers, top_k):
            raise ValueError(
                f"sample {i}: routing shape {experts.shape}, want (*, {layers}, {top_k})"
            )
        if experts.shape[0] == 0:
            raise ValueError(f"sample {i} has no routing rows")
        if top_k > 1:
            zero = [layer for layer in range(layers) if not np.count_nonzero(experts[:, layer, :])]
            if zero:
                raise ValueError(f"sample {i}: routing all zero for layers {zero}")


@pytest.fixture
def slime_types(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """Installs the stand-in as ``slime.utils.types`` for the test."""
    mod = types.ModuleType("slime.utils.types")
    mod.Sample = Sample  # type: ignore[attr-defined]
    # slime keeps these two elsewhere; reachable from the fixture's module for the tests
    mod.validate_rollout_id_annotated = validate_rollout_id_annotated  # type: ignore[attr-defined]
    mod.flatten_like_slime = flatten_like_slime  # type: ignore[attr-defined]
    mod.reward_nonzero_std = reward_nonzero_std  # type: ignore[attr-defined]
    mod.collect_partial = collect_partial  # type: ignore[attr-defined]
    mod.train_data = train_data  # type: ignore[attr-defined]
    for name in ("slime", "slime.utils"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "slime.utils.types", mod)
    return mod
