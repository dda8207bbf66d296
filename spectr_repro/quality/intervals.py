"""The intervals of quality.csv (statsmodels): Wilson 95 % for an accuracy, Newcombe 95 % for method − AR.

The difference interval treats the two cells as independent samples; outputs on the same prompts are positively
correlated through prompt difficulty, which makes that interval conservative (wider than a paired one).
"""

from __future__ import annotations

import math

from statsmodels.stats.proportion import confint_proportions_2indep, proportion_confint


def wilson_interval(successes: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion; NaN bounds when n = 0. Quality owns it (its accuracy intervals are
    part of quality.csv); the analysis re-uses it for the report's paired tables."""
    if n == 0:
        return (math.nan, math.nan)
    low, high = proportion_confint(int(successes), int(n), alpha=1 - level, method="wilson")
    # At k = n the bound is exactly 1; statsmodels' rounding leaves 1 - 1e-16, which would put the accuracy 1.0
    # outside its own interval (at k = 0 it already returns 0.0).
    return (float(low), 1.0 if successes == n else float(high))


def difference_interval(k1: int, n1: int, k2: int, n2: int) -> tuple[float, float]:
    """Newcombe's hybrid score 95 % interval for p1 − p2 = k1/n1 − k2/n2 (independent samples); NaN when a
    sample is empty (statsmodels would divide by zero)."""
    if n1 == 0 or n2 == 0:
        return (math.nan, math.nan)
    low, high = confint_proportions_2indep(int(k1), int(n1), int(k2), int(n2), method="newcomb", compare="diff",
                                           alpha=0.05)
    return (float(low), float(high))
