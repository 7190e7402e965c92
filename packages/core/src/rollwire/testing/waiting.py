"""Waiting in a test for a state another thread or process changes, that can only be read by
asking (no event to wait on): polled, with a bound."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["until"]


def until(what: str, check: Callable[[], object], timeout: float, interval: float = 0.01) -> float:
    """Return once ``check()`` is true, with the seconds it took; ``AssertionError`` naming
    ``what`` when ``timeout`` seconds pass first."""
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(interval)
    return time.monotonic() - t0
