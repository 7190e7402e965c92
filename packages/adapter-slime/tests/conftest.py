"""A faithful minimal stand-in for ``slime.utils.types`` (slime is not installable here).

Written from the field list and behaviour of slime's ``Sample`` (slime v0.3.1 and the releases
after it that add ``rollout_id`` and response-length validation): a dataclass with a nested
``Status`` enum, ``to_dict`` (``__dict__`` copy, ``status`` as its value, the two info objects as
dicts) and ``from_dict`` (dataclass fields to the constructor, other keys set as attributes), the
response-length check slime runs as ``_validate_response_metadata_lengths``, and the compact-rollout
check of ``validate_rollout_id_annotated``. Not slime's code: our own, to validate like it.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

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


@pytest.fixture
def slime_types(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """Installs the stand-in as ``slime.utils.types`` for the test."""
    mod = types.ModuleType("slime.utils.types")
    mod.Sample = Sample  # type: ignore[attr-defined]
    # slime keeps these two elsewhere; reachable from the fixture's module for the tests
    mod.validate_rollout_id_annotated = validate_rollout_id_annotated  # type: ignore[attr-defined]
    mod.flatten_like_slime = flatten_like_slime  # type: ignore[attr-defined]
    for name in ("slime", "slime.utils"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "slime.utils.types", mod)
    return mod
