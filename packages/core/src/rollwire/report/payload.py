"""What the report embeds per rollout: its rows (ids, roles, log-probs), calls and fork diffs.

Plain JSON-ready dicts with short keys (a 10,000-rollout report carries millions of tokens); the
page's script turns them into the token view only when a rollout is opened.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rollwire.data.arrays import common_prefix_len
from rollwire.data.protocol import ModelCall, Rollout, Row
from rollwire.data.tool_health import tool_call_text_unparsed
from rollwire.report.tokens import Vocabulary, row_roles

__all__ = ["ForkDiff", "fork_diff", "rollout_payload"]

#: tokens of shared context shown before a fork's first differing position, and after it
DIFF_BEFORE, DIFF_AFTER = 12, 48


@dataclass
class ForkDiff:
    """A fork side by side: shared context, then the old row's and the new prompt's text."""

    from_row: int
    position: int
    context: str
    old: str
    new: str


def fork_diff(rows: Sequence[Row], index: int, vocab: Vocabulary) -> ForkDiff | None:
    """Where row ``index``'s prompt left the earlier row it shares the most with, decoded."""
    row = rows[index]
    if row.fork is None or index == 0:
        return None
    new = row.prompt_ids
    best, best_pos = 0, -1
    for j in range(index):
        pos = common_prefix_len(rows[j].input_ids, new)
        if pos > best_pos:
            best, best_pos = j, pos
    old = rows[best].input_ids
    pos = (
        row.fork.position if 0 <= row.fork.position <= min(old.shape[0], new.shape[0]) else best_pos
    )
    start = max(0, pos - DIFF_BEFORE)
    return ForkDiff(
        from_row=best,
        position=pos,
        context=vocab.text(old[start:pos]),
        old=vocab.text(old[pos : pos + DIFF_AFTER]),
        new=vocab.text(new[pos : pos + DIFF_AFTER]),
    )


def _tool_calls(call: ModelCall) -> list[dict[str, str]]:
    """The tool calls of a call's response as the agent saw them parsed."""
    try:
        message = call.response["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        return []
    out = []
    for tc in (message or {}).get("tool_calls") or []:
        fn = tc.get("function") or {} if isinstance(tc, dict) else {}
        args = fn.get("arguments", "")
        out.append({"name": str(fn.get("name", "?")), "arguments": str(args)})
    return out


def _call_payload(call: ModelCall) -> dict[str, Any]:
    return {
        "i": call.index,
        "id": call.call_id,
        "st": call.status,
        "err": call.error,
        "fin": call.finish_reason,
        "ms": round(call.latency_ms, 1),
        "tr": call.trainable,
        "off": call.off_policy,
        "flags": list(call.flags),
        "pv": call.policy_version,
        "be": call.backend,
        "cap": call.capture,
        "np": int(call.prompt_ids.shape[0]),
        "nc": int(call.completion_ids.shape[0]),
        "ex": call.routed_experts is not None,
        "tools": _tool_calls(call),
        "unparsed": tool_call_text_unparsed(call),
        "samp": dict(call.sampling),
        "retry": call.retry_of,
    }


def _row_payload(rows: Sequence[Row], index: int, vocab: Vocabulary) -> dict[str, Any]:
    row = rows[index]
    out: dict[str, Any] = {
        "ids": row.input_ids,
        "pl": row.prompt_len,
        "roles": row_roles(row, vocab),
        # log-probs to 3 decimals: the view shows intensity and the value on hover
        "lp": np.round(row.logprobs.astype(np.float64), 3),
        "turn": row.turn_ids,
        "ex": row.routed_experts is not None,
        "trained": int(row.loss_mask.sum()),
        "fork": None,
    }
    if row.fork is not None:
        diff = fork_diff(rows, index, vocab)
        out["fork"] = {
            "kind": row.fork.kind,
            "pos": row.fork.position,
            "lost": row.fork.tokens_lost,
            "call": row.fork.call_id,
            "from": diff.from_row if diff else None,
            "ctx": diff.context if diff else "",
            "old": diff.old if diff else "",
            "new": diff.new if diff else "",
        }
    return out


def rollout_payload(rollout: Rollout, rows: Sequence[Row], vocab: Vocabulary) -> dict[str, Any]:
    """Everything the token view of one rollout shows."""
    return {
        "id": rollout.rollout_id,
        "err": rollout.error,
        "metrics": dict(rollout.metrics),
        "calls": [_call_payload(c) for c in sorted(rollout.calls, key=lambda c: c.index)],
        "rows": [_row_payload(rows, i, vocab) for i in range(len(rows))],
    }
