"""What a run produced, as numbers and as a table; why its rollouts failed, grouped by cause.

A rollout that did not complete failed either for an **infrastructure** reason (a model call the
gateway could not serve, an agent the runner could not reach, a record the client could not
read or write, an agent process that shut down) or because of the agent (it raised, it ran past
its deadline). ``rollwire run`` fails on any of the first kind; the second kind only above a
``--max-failed`` share (docs/rollouts.md).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.table import Table

from rollwire.data.protocol import Group, ModelCall, Rollout, Row

__all__ = [
    "FailureCause",
    "failure_causes",
    "is_infrastructure",
    "rollouts_of",
    "routing_gaps",
    "routing_notes",
    "summarize",
    "summary_table",
]

#: prefixes of the errors RolloutClient records for rollouts it had to fail itself
_CLIENT_PREFIXES = (
    ("the runner could not reach the agent", "the agent could not be reached"),
    ("rollout client error", "the rollout client failed"),
    ("the rollout could not be fetched", "the rollout could not be read from the gateway"),
    ("no terminal record on the gateway", "the agent never reported"),
)
#: how the OpenAI client words an error answer of the model endpoint, and a connection failure
_STATUS_ERROR = re.compile(r"Error code: (\d{3})")
_CONNECTION_ERROR = re.compile(r"\b(APIConnectionError|APITimeoutError)\b")
_HEX_ID = re.compile(r"\b[0-9a-f]{16,}\b")


@dataclass(frozen=True)
class FailureCause:
    """Rollouts that failed the same way: ``label`` says how, ``message`` the first error seen."""

    label: str
    infrastructure: bool
    message: str
    count: int


def rollouts_of(batch: Iterable[Group | Rollout]) -> list[Rollout]:
    """The rollouts of ``batch``, groups flattened."""
    out: list[Rollout] = []
    for item in batch:
        out.extend(item.rollouts if isinstance(item, Group) else [item])
    return out


def _cause(rollout: Rollout) -> tuple[str, bool, str]:
    """``(label, infrastructure, message)`` of a rollout that did not complete."""
    error = rollout.error or f"status {rollout.status}, no error recorded"
    failed_call = next((c for c in rollout.calls if c.status == "failed"), None)
    if failed_call is not None:
        return "a model call failed at the gateway", True, failed_call.error or error
    for prefix, label in _CLIENT_PREFIXES:
        if error.startswith(prefix):
            return label, True, error
    if rollout.status == "cancelled":
        return "cancelled (the agent process shut down)", True, error
    if _CONNECTION_ERROR.search(error):
        return "the model endpoint could not be reached", True, error
    status = _STATUS_ERROR.search(error)
    if status is not None:
        return f"the model endpoint answered HTTP {status.group(1)}", True, error
    if rollout.status == "timeout" or error.startswith("deadline exceeded"):
        return "ran past its deadline", False, error
    return "the agent raised an error", False, error


def is_infrastructure(rollout: Rollout) -> bool:
    """Whether ``rollout`` failed for an infrastructure reason (not the agent's own)."""
    return rollout.status != "completed" and _cause(rollout)[1]


def _short(message: str, limit: int = 240) -> str:
    one_line = " ".join(_HEX_ID.sub("…", message).split())
    return one_line if len(one_line) <= limit else one_line[: limit - 1] + "…"


def failure_causes(rollouts: Iterable[Rollout]) -> list[FailureCause]:
    """Failed rollouts grouped by cause and first error (ids blanked), most frequent first."""
    counts: Counter[tuple[str, bool, str]] = Counter()
    for r in rollouts:
        if r.status != "completed":
            label, infra, message = _cause(r)
            counts[(label, infra, _short(message))] += 1
    return [
        FailureCause(label, infra, message, n)
        for (label, infra, message), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    ]


def routing_gaps(calls: Iterable[ModelCall]) -> dict[str, list[int]]:
    """Per backend serving routing (some call of it carries routed experts, or was asked for
    them: ``routed_experts_missing``): ``[successful calls without routing, successful calls]``,
    for those where some call has none."""
    seen: dict[str, list[int]] = {}
    routes: set[str] = set()
    for c in calls:
        if c.status != "ok" or not len(c.completion_ids) or c.backend is None:
            continue  # (a call recorded without its backend cannot be told apart)
        name = c.backend
        counts = seen.setdefault(name, [0, 0])
        counts[1] += 1
        if c.routed_experts is None:
            counts[0] += 1
        if c.routed_experts is not None or "routed_experts_missing" in c.flags:
            routes.add(name)
    return {b: n for b, n in sorted(seen.items()) if b in routes and n[0]}


def routing_notes(s: Mapping[str, Any]) -> list[str]:
    """What to tell about MoE backends whose calls carry no routing (for the run's summary)."""
    return [
        f"backend {b} serves routed experts (an MoE model), but {missing} of its {total} calls "
        "carry none, so they train without routing replay: streamed calls before the gateway "
        "first saw this backend return routing, sessions created with routed_experts=false, "
        "or a server started without --enable-return-routed-experts"
        for b, (missing, total) in s.get("routing_gaps", {}).items()
    ]


def _stats(values: Sequence[float]) -> dict[str, float]:
    nan = float("nan")
    if not values:
        return {"mean": nan, "std": nan, "min": nan, "max": nan}
    mean = sum(values) / len(values)
    std = math.sqrt(sum((x - mean) ** 2 for x in values) / len(values))
    return {"mean": mean, "std": std, "min": min(values), "max": max(values)}


def summarize(
    batch: Iterable[Group | Rollout], rows: Sequence[Row], wall_s: float
) -> dict[str, Any]:
    """The numbers of a run: rollouts by status, reward statistics, the solve rate (when the
    environment reports a ``solved`` metric), calls, tokens, routing, forks and wall time."""
    items = list(batch)
    rollouts = rollouts_of(items)
    calls = [c for r in rollouts for c in r.calls]
    rewards = [r.reward for r in rollouts if r.reward is not None]
    solved = [r.metrics["solved"] for r in rollouts if "solved" in r.metrics]
    reward = _stats(rewards)
    return {
        "rollouts": len(rollouts),
        "groups": sum(isinstance(i, Group) for i in items),
        "statuses": dict(Counter(r.status for r in rollouts)),
        "completed": sum(r.status == "completed" for r in rollouts),
        "failed": sum(r.status != "completed" for r in rollouts),
        "reward_mean": reward["mean"],
        "reward_std": reward["std"],
        "reward_min": reward["min"],
        "reward_max": reward["max"],
        "solved": sum(x > 0 for x in solved),
        "solve_rate": sum(x > 0 for x in solved) / len(solved) if solved else None,
        "calls": len(calls),
        "failed_calls": sum(c.status == "failed" for c in calls),
        "prompt_tokens": int(sum(len(c.prompt_ids) for c in calls)),
        "completion_tokens": int(sum(len(c.completion_ids) for c in calls)),
        "routed_calls": sum(c.routed_experts is not None for c in calls),
        "streamed_calls": sum(bool(c.stream) for c in calls),
        "routing_gaps": routing_gaps(calls),
        "stale_calls": sum("stale" in c.flags for c in calls),
        "rows": len(rows),
        "trainable_tokens": int(sum(int(row.loss_mask.sum()) for row in rows)),
        "forks": dict(Counter(row.fork.kind for row in rows if row.fork is not None)),
        "wall_s": wall_s,
    }


def num(x: float | None, digits: int = 3) -> str:
    """``x`` with ``digits`` decimals, ``n/a`` when missing or not finite."""
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def summary_lines(s: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The rows of the summary table as ``(metric, value)`` pairs."""
    statuses = ", ".join(f"{k} {v}" for k, v in sorted(s["statuses"].items())) or "none"
    lines = [
        ("rollouts", f"{s['rollouts']} in {s['groups']} groups ({statuses})"),
        (
            "reward mean ± std",
            f"{num(s['reward_mean'])} ± {num(s['reward_std'])}",
        ),
        ("reward min / max", f"{num(s['reward_min'])} / {num(s['reward_max'])}"),
    ]
    if s["solve_rate"] is not None:
        lines.append(("solved", f"{s['solved']} / {s['rollouts']} ({100 * s['solve_rate']:.0f}%)"))
    calls = f"{s['calls']}" + (f" ({s['failed_calls']} failed)" if s["failed_calls"] else "")
    lines += [
        ("model calls", calls),
        ("tokens prompt / completion", f"{s['prompt_tokens']} / {s['completion_tokens']}"),
        ("calls with routed experts", f"{s['routed_calls']} / {s['calls']}"),
    ]
    gaps = s.get("routing_gaps") or {}
    if gaps:
        missing = ", ".join(f"{b} {m} / {n}" for b, (m, n) in gaps.items())
        lines.append(("MoE calls without routing", missing))
    if s.get("stale_calls"):
        lines.append(("stale calls (not trained)", str(s["stale_calls"])))
    lines += [
        ("training rows", f"{s['rows']} ({s['trainable_tokens']} trainable tokens)"),
        ("forks by class", ", ".join(f"{k} {v}" for k, v in sorted(s["forks"].items())) or "none"),
        ("wall time", f"{s['wall_s']:.1f} s"),
    ]
    return lines


def summary_table(s: Mapping[str, Any], title: str, extra: Sequence[tuple[str, str]] = ()) -> Table:
    """The summary as a two-column rich table, ``extra`` rows before the wall time."""
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    lines = summary_lines(s)
    for k, v in [*lines[:-1], *extra, lines[-1]]:
        table.add_row(k, v)
    return table
