"""Compare an empirical joint law (counts) with an exact one: chi-square with merged bins, and TV."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from scipy import stats


@dataclass(frozen=True)
class LawCheck:
    chi2: float
    dof: int
    p_value: float
    tv: float  # total variation between the empirical frequencies and the law
    n: int  # number of samples
    expected_tv: float  # TV expected from sampling noise alone (for stating a TV threshold)

    def passes(self, alpha: float = 1e-4) -> bool:
        return self.p_value > alpha


def total_variation(law_a: Mapping, law_b: Mapping) -> float:
    """0.5 * sum |a - b| over the union of supports."""
    keys = set(law_a) | set(law_b)
    return 0.5 * sum(abs(law_a.get(k, 0.0) - law_b.get(k, 0.0)) for k in keys)


def expected_sampling_tv(law: Mapping, n: int) -> float:
    """E[TV] of n i.i.d. draws from ``law`` to the law, normal approximation: sum sd_k sqrt(2/pi) / 2."""
    return 0.5 * sum(math.sqrt(2 * p * (1 - p) / (math.pi * n)) for p in law.values())


def chi_square_test(counts: Mapping, law: Mapping, min_expected: float = 5.0) -> LawCheck:
    """Pearson chi-square of ``counts`` against ``law``; bins with expected count < min_expected merge.

    An observed outcome the law gives probability 0 makes the test fail outright (p = 0).
    """
    n = int(sum(counts.values()))
    if n == 0:
        raise ValueError("no samples")
    tv = total_variation({k: c / n for k, c in counts.items()}, law)
    expected_tv = expected_sampling_tv(law, n)
    if any(law.get(k, 0.0) <= 0 for k, c in counts.items() if c > 0):
        return LawCheck(math.inf, 0, 0.0, tv, n, expected_tv)
    cells = sorted(((law[k] * n, counts.get(k, 0)) for k in law if law[k] > 0), key=lambda cell: cell[0])
    merged: list[list[float]] = []
    pool_exp, pool_obs = 0.0, 0.0
    for exp, obs in cells:
        if pool_exp + exp < min_expected or (pool_exp > 0 and pool_exp < min_expected):
            pool_exp, pool_obs = pool_exp + exp, pool_obs + obs
            if pool_exp >= min_expected:
                merged.append([pool_exp, pool_obs])
                pool_exp, pool_obs = 0.0, 0.0
        else:
            merged.append([exp, obs])
    if pool_exp > 0:
        if merged:
            merged[0][0] += pool_exp
            merged[0][1] += pool_obs
        else:
            merged.append([pool_exp, pool_obs])
    if len(merged) < 2:
        return LawCheck(0.0, 0, 1.0, tv, n, expected_tv)
    expected = [e for e, _ in merged]
    observed = [o for _, o in merged]
    # Renormalise the expected counts to the observed total (float round-off only).
    scale = sum(observed) / sum(expected)
    chi2, p_value = stats.chisquare(observed, [e * scale for e in expected])
    return LawCheck(float(chi2), len(merged) - 1, float(p_value), tv, n, expected_tv)
