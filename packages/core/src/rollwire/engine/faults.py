"""Seeded fault injection for reliability tests (5xx, 429, latency, cut streams, missing token ids)."""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass

from .config import FaultConfig

__all__ = ["FaultDraw", "FaultInjector"]


@dataclass(frozen=True)
class FaultDraw:
    """What goes wrong with one request."""

    error: bool = False
    throttle: bool = False
    truncate_stream: bool = False
    drop_token_ids: bool = False
    latency_s: float = 0.0


class FaultInjector:
    """Draws faults per request from one seeded RNG, so a replayed run sees the same faults."""

    def __init__(self, config: FaultConfig) -> None:
        self.config = config
        self._rng = random.Random(config.seed)
        self._lock = threading.Lock()

    def draw(self) -> FaultDraw:
        """The faults of the next request (always consumes the same number of draws)."""
        c = self.config
        if not c.active:
            return FaultDraw()
        with self._lock:
            r = [self._rng.random() for _ in range(4)]
        return FaultDraw(
            error=r[0] < c.error_rate,
            throttle=r[1] < c.throttle_rate,
            truncate_stream=r[2] < c.truncate_stream_rate,
            drop_token_ids=r[3] < c.drop_token_ids_rate,
            latency_s=c.latency_ms / 1000.0,
        )
