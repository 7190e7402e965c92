"""Prometheus text metrics for the gateway (no client library: a few counters and histograms)."""

from __future__ import annotations

import bisect
from collections import defaultdict

from rollwire.data.tool_health import ToolHealth

__all__ = ["GatewayMetrics"]

_LATENCY_BUCKETS_S = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
)
_HOLD_BUCKETS_S = (0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800)
_COMMIT_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 1)


class _Histogram:
    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.total += value

    def render(self, name: str, help_text: str) -> list[str]:
        lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        acc = 0
        for bound, n in zip(self.bounds, self.counts):
            acc += n
            lines.append(f'{name}_bucket{{le="{bound}"}} {acc}')
        lines.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        lines.append(f"{name}_sum {self.total}")
        lines.append(f"{name}_count {self.count}")
        return lines


class GatewayMetrics:
    """Counters the gateway updates on its event loop; :meth:`render` gives Prometheus text."""

    def __init__(self) -> None:
        self.calls: defaultdict[tuple[str, str], int] = defaultdict(int)  # (endpoint, status)
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.errors: defaultdict[str, int] = defaultdict(int)
        #: calls of routed-experts sessions that came back without routing
        self.routing_missing = 0
        #: sessions that ended by themselves: past their TTL (abandoned) / evicted from memory
        self.sessions_expired = 0
        self.sessions_evicted = 0
        self.latency = _Histogram(_LATENCY_BUCKETS_S)
        self.upstream_latency = _Histogram(_LATENCY_BUCKETS_S)
        self.commit_latency = _Histogram(_COMMIT_BUCKETS_S)
        #: staleness admission (``max_staleness``): first calls held, held now, holds that ran
        #: out of session TTL, calls flagged stale; the ordinals compared
        self.stale_held = 0
        self.stale_waiting = 0
        self.stale_hold_expired = 0
        self.stale_marked = 0
        self.stale_hold_seconds = _Histogram(_HOLD_BUCKETS_S)
        self.policy_seq = 0
        self.trainer_seq: int | None = None
        #: tool calls the backends' parsers returned vs tool-call text they left in answers
        self.tools = ToolHealth()

    def call(self, endpoint: str, status: str, prompt: int, completion: int) -> None:
        """Count one captured call."""
        self.calls[(endpoint, status)] += 1
        self.prompt_tokens += prompt
        self.completion_tokens += completion

    def error(self, kind: str) -> None:
        """Count one refusal or failure by kind (e.g. ``unauthorized``, ``upstream_timeout``)."""
        self.errors[kind] += 1

    def render(self, active_sessions: int, in_flight: int) -> str:
        """Prometheus exposition text."""
        out = [
            "# HELP rollwire_calls_total Captured model calls.",
            "# TYPE rollwire_calls_total counter",
        ]
        for (endpoint, status), n in sorted(self.calls.items()):
            out.append(f'rollwire_calls_total{{endpoint="{endpoint}",status="{status}"}} {n}')
        out += [
            "# HELP rollwire_tokens_total Captured tokens.",
            "# TYPE rollwire_tokens_total counter",
            f'rollwire_tokens_total{{kind="prompt"}} {self.prompt_tokens}',
            f'rollwire_tokens_total{{kind="completion"}} {self.completion_tokens}',
            "# HELP rollwire_errors_total Refused or failed requests by kind.",
            "# TYPE rollwire_errors_total counter",
        ]
        for kind, n in sorted(self.errors.items()):
            out.append(f'rollwire_errors_total{{kind="{kind}"}} {n}')
        out += [
            "# HELP rollwire_tool_calls_total Tool calls in captured answers: calls whose "
            "request offered tools, tool calls the backend parsed, answers holding tool-call "
            "text it did not parse.",
            "# TYPE rollwire_tool_calls_total counter",
            f'rollwire_tool_calls_total{{kind="offered"}} {self.tools.offered}',
            f'rollwire_tool_calls_total{{kind="parsed"}} {self.tools.parsed}',
            f'rollwire_tool_calls_total{{kind="unparsed"}} {self.tools.unparsed}',
            "# HELP rollwire_routed_experts_missing_total Calls of sessions that want routed "
            "experts that came back without them.",
            "# TYPE rollwire_routed_experts_missing_total counter",
            f"rollwire_routed_experts_missing_total {self.routing_missing}",
            "# HELP rollwire_sessions_expired_total Abandoned sessions this gateway timed out "
            "(past their TTL).",
            "# TYPE rollwire_sessions_expired_total counter",
            f"rollwire_sessions_expired_total {self.sessions_expired}",
            "# HELP rollwire_sessions_evicted_total Idle sessions dropped from memory (they are "
            "re-read from the store when used again).",
            "# TYPE rollwire_sessions_evicted_total counter",
            f"rollwire_sessions_evicted_total {self.sessions_evicted}",
            "# HELP rollwire_active_sessions Sessions with live state in this gateway.",
            "# TYPE rollwire_active_sessions gauge",
            f"rollwire_active_sessions {active_sessions}",
            "# HELP rollwire_in_flight Data-plane calls in progress.",
            "# TYPE rollwire_in_flight gauge",
            f"rollwire_in_flight {in_flight}",
        ]
        out += self._staleness()
        out += self.latency.render(
            "rollwire_call_latency_seconds", "Time from request to response, per call."
        )
        out += self.upstream_latency.render(
            "rollwire_upstream_latency_seconds", "Time spent waiting for the backend."
        )
        out += self.commit_latency.render(
            "rollwire_store_commit_seconds", "Time to commit a captured call to the store."
        )
        return "\n".join(out) + "\n"

    def _staleness(self) -> list[str]:
        lag = 0 if self.trainer_seq is None else max(0, self.trainer_seq - self.policy_seq)
        out = [
            "# HELP rollwire_stale_held_total First calls of rollouts held because they would "
            "be sampled more than max_staleness policy versions behind the trainer.",
            "# TYPE rollwire_stale_held_total counter",
            f"rollwire_stale_held_total {self.stale_held}",
            "# HELP rollwire_stale_held Calls held for staleness now.",
            "# TYPE rollwire_stale_held gauge",
            f"rollwire_stale_held {self.stale_waiting}",
            "# HELP rollwire_stale_hold_expired_total Held calls whose session TTL ran out first.",
            "# TYPE rollwire_stale_hold_expired_total counter",
            f"rollwire_stale_hold_expired_total {self.stale_hold_expired}",
            "# HELP rollwire_stale_marked_total Calls flagged stale (not trained): sampled more "
            "than their session's max_staleness versions behind the trainer.",
            "# TYPE rollwire_stale_marked_total counter",
            f"rollwire_stale_marked_total {self.stale_marked}",
            "# HELP rollwire_stale_lag Policy versions the served weights are behind the trainer.",
            "# TYPE rollwire_stale_lag gauge",
            f"rollwire_stale_lag {lag}",
            "# HELP rollwire_policy_seq Ordinal of the served policy version.",
            "# TYPE rollwire_policy_seq gauge",
            f"rollwire_policy_seq {self.policy_seq}",
        ]
        return out + self.stale_hold_seconds.render(
            "rollwire_stale_hold_seconds", "How long calls were held for staleness."
        )
