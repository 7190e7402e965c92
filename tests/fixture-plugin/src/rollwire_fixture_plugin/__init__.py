"""Test-only trainer plugins: one whose framework is present, one missing, one too old.

They prove rollwire's entry-point discovery, requirement checks and install hints. The
conversion is a plain JSON dump of TrajectoryBuilder rows, so the conformance suite runs on it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rollwire.data.trajectory import build_rows
from rollwire.plugins.protocols import Batch, ExportedRow


class JsonRowsAdapter:
    """Rows as JSON-ready dicts; ``requires`` is what the plugin pretends to need."""

    def __init__(self, name: str, requires: Sequence[str]) -> None:
        self.name = name
        self.requires = tuple(requires)

    def convert(self, batch: Batch, **options: Any) -> list[dict[str, Any]]:
        rows = build_rows(batch)
        if not rows:
            raise ValueError("empty batch: no rows to convert")
        # a failed rollout trains nothing (the conformance suite checks it)
        keep = [r.status == "completed" for r in rows]
        return [
            {
                "rollout_id": r.rollout_id,
                "group_id": r.group_id,
                "prompt": r.prompt_ids.tolist(),
                "response": r.response_ids.tolist(),
                "mask": (r.loss_mask * k).tolist(),
                "logprobs": (r.logprobs * k).tolist(),
                "reward": r.reward,
                "routed_experts": (
                    r.routed_experts.tolist() if r.routed_experts is not None else None
                ),
            }
            for r, k in zip(rows, keep)
        ]

    def export(self, batch: Batch, path: str | Path, **options: Any) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.convert(batch, **options)))
        return path

    def flatten(self, converted: list[dict[str, Any]]) -> list[ExportedRow]:
        return [
            ExportedRow(
                rollout_id=d["rollout_id"],
                group_id=d["group_id"],
                prompt_ids=np.asarray(d["prompt"], np.int32),
                response_ids=np.asarray(d["response"], np.int32),
                loss_mask=np.asarray(d["mask"], np.int8),
                logprobs=np.asarray(d["logprobs"], np.float32),
                reward=d["reward"],
                routed_experts=(
                    np.asarray(d["routed_experts"], np.int16)
                    if d["routed_experts"] is not None
                    else None
                ),
            )
            for d in converted
        ]


ok_adapter = JsonRowsAdapter("fixture-ok", ["numpy>=1.0"])
missing_adapter = JsonRowsAdapter("fixture-missing", ["rollwire-no-such-framework>=1.0"])
old_adapter = JsonRowsAdapter("fixture-old", ["numpy<1.0"])
