"""pass@k and confidence intervals: the statistics of ``rollwire eval``. Pure functions.

pass@k is the unbiased estimator of Chen et al. (2021, "Evaluating Large Language Models Trained
on Code"): with ``n`` attempts of which ``c`` succeeded, ``1 - C(n-c, k) / C(n, k)``, the chance
that ``k`` attempts drawn without replacement hold at least one success.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

__all__ = ["Estimate", "bootstrap_interval", "pass_at_k", "wilson_interval"]


@dataclass(frozen=True)
class Estimate:
    """A point estimate with the bounds of its confidence interval."""

    value: float
    low: float
    high: float
    confidence: float = 0.95
    method: str = ""

    def as_dict(self) -> dict[str, float | str]:
        """JSON-ready form."""
        return {
            "value": self.value,
            "low": self.low,
            "high": self.high,
            "confidence": self.confidence,
            "method": self.method,
        }

    def __str__(self) -> str:
        return f"{self.value:.3f} [{self.low:.3f}, {self.high:.3f}]"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` attempts with ``c`` successes (``1 <= k <= n``)."""
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and n >= 1, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n attempts, got n={n}")
    if n - c < k:
        return 1.0
    # 1 - prod_{i=n-c+1}^{n} (1 - k / i): the ratio of binomials without huge integers.
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def _z(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    return NormalDist().inv_cdf(0.5 + confidence / 2.0)


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> Estimate:
    """Wilson score interval of a success rate (attempts taken as independent trials)."""
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n and n >= 1, got {successes} of {n}")
    z = _z(confidence)
    p = successes / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # At p = 0 or 1 the bound on that side is exactly 0 or 1 (rounding would leave 1e-17).
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return Estimate(p, low, high, confidence, "wilson")


def bootstrap_interval(
    values: Sequence[float],
    *,
    statistic: Callable[[np.ndarray], float] = lambda a: float(np.mean(a)),
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> Estimate:
    """Percentile bootstrap over ``values`` (one per task: tasks are the independent units)."""
    _z(confidence)
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        raise ValueError("a bootstrap interval needs at least one value")
    point = statistic(arr)
    if arr.size == 1:
        return Estimate(point, point, point, confidence, "bootstrap (1 task: no spread)")
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, arr.size, size=(resamples, arr.size))
    stats = np.array([statistic(arr[p]) for p in picks])
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(stats, [alpha, 1.0 - alpha])
    return Estimate(point, float(low), float(high), confidence, "bootstrap over tasks")
