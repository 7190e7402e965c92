"""pass@k against hand-computed values, and the confidence intervals around it."""

from __future__ import annotations

from math import comb

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollwire.evaluation import bootstrap_interval, pass_at_k, wilson_interval


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 2 / 5),  # 1 - C(3,1)/C(5,1) = 1 - 3/5
        (5, 2, 2, 7 / 10),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (5, 2, 3, 9 / 10),  # 1 - C(3,3)/C(5,3) = 1 - 1/10
        (5, 2, 4, 1.0),  # fewer than 4 failures: any 4 attempts hold a success
        (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
        (10, 0, 10, 0.0),
        (4, 4, 1, 1.0),
        (8, 1, 8, 1.0),
        (8, 1, 1, 1 / 8),
    ],
)
def test_pass_at_k_hand_computed(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


@given(
    st.integers(1, 60).flatmap(
        lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))
    )
)
def test_pass_at_k_is_the_binomial_ratio(args: tuple[int, int, int]) -> None:
    n, c, k = args
    exact = 1.0 - comb(n - c, k) / comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-9)


def test_pass_at_k_is_unbiased_over_draws() -> None:
    # The mean, over every k-subset of the n attempts, of "some success in the subset".
    outcomes = [1, 0, 0, 1, 0, 0]
    from itertools import combinations

    subsets = list(combinations(outcomes, 3))
    empirical = sum(any(s) for s in subsets) / len(subsets)
    assert pass_at_k(6, 2, 3) == pytest.approx(empirical)


@pytest.mark.parametrize(("n", "c", "k"), [(0, 0, 1), (5, 6, 1), (5, 2, 0), (5, 2, 6)])
def test_pass_at_k_rejects_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match="pass@"):
        pass_at_k(n, c, k)


def test_wilson_interval_reference_values() -> None:
    # 8 of 10 at 95 %: the textbook Wilson score interval is [0.4902, 0.9433].
    e = wilson_interval(8, 10)
    assert e.value == 0.8
    assert e.low == pytest.approx(0.4902, abs=5e-4) and e.high == pytest.approx(0.9433, abs=5e-4)
    zero = wilson_interval(0, 20)
    assert zero.low == 0.0 and 0.1 < zero.high < 0.2  # never a zero-width interval at p = 0
    assert wilson_interval(8, 10, 0.99).low < e.low


def test_bootstrap_interval_brackets_the_mean_and_is_seeded() -> None:
    values = list(np.linspace(0.0, 1.0, 30))
    e = bootstrap_interval(values)
    assert e.value == pytest.approx(0.5) and e.low < e.value < e.high
    assert e == bootstrap_interval(values)  # the same seed gives the same interval
    one = bootstrap_interval([0.3])
    assert one.low == one.high == 0.3
    with pytest.raises(ValueError, match="at least one value"):
        bootstrap_interval([])
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_interval(values, confidence=1.5)
