"""Paired statistics over prompts: intervals for Table 1, method-vs-method differences, quality parity.

Every method of a setting runs on the same prompts, so methods are compared prompt by prompt.

Speed (block efficiency, speed-up). A cell's numbers are ratios of sums over its prompts:
block efficiency = Σ new_tokens / Σ target_calls, speed-up = Σ AR wall time / Σ wall time. Each
statistic here is a function of per-stratum column sums, and its 95 % interval comes from a bootstrap
over prompts:

- a resampled prompt carries every column of every method with it (the tokens and calls of method a and
  of method b on the same prompt): the pairing is kept;
- several strata (the average over datasets, several cells of one entry): prompts are resampled within
  each stratum, independently across strata (a stratified bootstrap);
- vectorised over resamples without gathering prompts: a resample of a stratum is the count of each of
  its prompts in n draws with replacement, and its column sums are those counts times the columns (one
  matrix product). This is the resampling of ``scipy.stats.bootstrap`` (which the report used until
  2026-12-07) without its per-call overhead: at 32 prompts a dataset the grid's report makes ~20,000
  intervals;
- Interval method: BCa (bias-corrected and accelerated), computed as ``scipy.stats.bootstrap`` computes
  it (Efron and Tibshirani 1993, 14.3 and 15.4: z0 from the resamples below the estimate, the
  acceleration from each stratum's leave-one-prompt-out jackknife). Ratios of sums are skewed and biased at the
  small prompt counts we can afford, which BCa corrects for and the percentile interval does not; at
  tiny n BCa is also the wider (more conservative) of the two. BCa is undefined when the jackknife has
  no spread (every prompt gives the same statistic, e.g. AR's block efficiency of 1, or two identical
  methods); then, and only then, the percentile interval of the same resamples is used, and the
  interval says so (``Interval.method``). A stratum with one prompt has nothing to resample and enters
  as a constant; with no stratum of two or more prompts there is no interval (NaN bounds).

Quality (pass@1, exact match). Outcomes are paired by prompt: McNemar's exact test (a two-sided
binomial test on the discordant pairs, ``scipy.stats.binomtest``) and Wilson score intervals
(``statsmodels.stats.proportion.proportion_confint(..., method="wilson")``) for each accuracy.

Which speed-ups are measurements at all: ``speedup_exclusion`` (one line per summary flag).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.special import ndtr, ndtri
from scipy.stats import binomtest
from statsmodels.stats.proportion import proportion_confint

LEVEL = 0.95
RESAMPLES = 9999
SEED = 0
# Below this many paired prompts an interval is shown but never called a real difference. Under no
# difference, the 95 % paired interval here excluded 0 in 27 % of seeded prompt sets at n = 3, 16 % at
# n = 5, 9 % at n = 10 and 7 % at n = 20 (400 sets each, heterogeneous prompts, 999 resamples): the
# bootstrap only knows the prompts it was given, and at n = 3 three prompts agreeing in sign suffice.
MIN_PROMPTS_FOR_VERDICT = 10
# Resamples per vectorised call, so a resample block stays near this many prompt values per column.
_BLOCK_VALUES = 4_000_000


# --------------------------------------------------------------------------------------------------
# Which speed-ups can be shown
# --------------------------------------------------------------------------------------------------

# summary field -> (does this value make the cell's wall time no speed-up measurement?, short reason).
# A missing field (or None/NaN) never excludes: batch 1, no contention, weights on the device.
def _contended(value) -> bool:
    """The runner's ``contention`` record ({"other_runners": [...], "load_average_max": ..}) or a flag. Only
    other runners count: the load average includes the timed process's own threads."""
    return bool(value.get("other_runners")) if isinstance(value, Mapping) else bool(value)


def _ar_caveat(value) -> bool:
    """``speedup_caveats`` of the runner: the AR baseline's own caveats are copied there ("AR baseline: ..")."""
    return isinstance(value, (list, tuple)) and any(str(c).startswith("AR baseline") for c in value)


SPEEDUP_EXCLUSIONS: dict[str, tuple[Callable[[object], bool], str]] = {
    "batch_prompts": (lambda value: int(value) > 1, "batched"),
    "contention": (_contended, "contention"),
    "offloaded": (bool, "offloaded"),
    "speedup_caveats": (_ar_caveat, "AR baseline not comparable"),
}


def _absent(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def speedup_exclusion(summary_row: Mapping) -> str | None:
    """Why a cell's speed-up is not comparable ("batched", "contention", ...), or None if it is.

    A batched cell (hardware.batch_prompts > 1) that also decoded ``timed_prompts`` > 0 prompts alone has a
    batch-1 speed-up from those (its batched prompts carry no wall time): only a batched cell without
    timed prompts is excluded."""
    timed = summary_row.get("timed_prompts")
    timed_alone = not _absent(timed) and int(timed) > 0
    reasons = [
        reason
        for name, (excludes, reason) in SPEEDUP_EXCLUSIONS.items()
        if not _absent(value := summary_row.get(name)) and excludes(value)
        and not (name == "batch_prompts" and timed_alone)
    ]
    return ", ".join(reasons) if reasons else None


def speedup_comparable(summary_row: Mapping) -> bool:
    """True when the cell's wall times are a batch-1, uncontended, on-device speed-up measurement."""
    return speedup_exclusion(summary_row) is None


# --------------------------------------------------------------------------------------------------
# Bootstrap of ratio-of-sums statistics
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Interval:
    """A statistic with its bootstrap interval over prompts."""

    estimate: float
    low: float
    high: float
    method: str  # "BCa", "percentile (BCa undefined)" or "none (<2 prompts)"
    n: int  # prompts (paired prompts for a comparison), all strata together

    @property
    def has_interval(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)

    def excludes(self, value: float) -> bool:
        """True when the interval lies wholly above or below ``value``."""
        return self.has_interval and (self.low > value or self.high < value)


# Sums of one stratum: array [columns, ...]; a statistic maps every stratum's sums to an estimate [...].
SumsStatistic = Callable[[list[np.ndarray]], np.ndarray]


def _resampled_sums(stratum: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """[columns, resamples]: the column sums of ``resamples`` bootstrap resamples of the prompts of ``stratum``
    ([columns, n]), each the counts of the n prompts in n draws with replacement times the columns."""
    n = stratum.shape[1]
    out = np.empty((stratum.shape[0], resamples))
    per_block = max(1, min(resamples, _BLOCK_VALUES // n))
    for start in range(0, resamples, per_block):
        size = min(per_block, resamples - start)
        draws = rng.integers(0, n, (size, n))
        counts = np.bincount((draws + n * np.arange(size)[:, None]).ravel(), minlength=size * n).reshape(size, n)
        # einsum, not matmul: BLAS's threads cost more than this small product (8 ms against 1 ms at n = 32 here)
        out[:, start:start + size] = np.einsum("rn,cn->cr", counts.astype(float), stratum)
    return out


def _jackknife(strata: list[np.ndarray], full_sums: list[np.ndarray], varying: list[int],
               statistic: SumsStatistic) -> list[np.ndarray]:
    """Per resampled stratum: the statistic with each of its prompts left out in turn ([n_k]), the other strata
    whole."""
    values = []
    for k in varying:
        sums = list(full_sums)
        sums[k] = full_sums[k][:, None] - strata[k]  # [columns, n_k]: prompt i left out in column i
        values.append(np.asarray(statistic(sums), dtype=float))
    return values


def _bca_levels(estimate: float, resampled: np.ndarray, jackknife: list[np.ndarray], level: float
                ) -> tuple[float, float]:
    """The two quantile levels of the BCa interval (NaN where it is undefined)."""
    below = (np.count_nonzero(resampled < estimate) + np.count_nonzero(resampled <= estimate)) / (2 * len(resampled))
    z0 = ndtri(below)
    spread = [(len(values) - 1) * (values.mean() - values) for values in jackknife]
    with np.errstate(divide="ignore", invalid="ignore"):
        skew = sum(np.sum(u ** 3) / len(u) ** 3 for u in spread)
        scale = sum(np.sum(u ** 2) / len(u) ** 2 for u in spread)
        acceleration = skew / scale ** 1.5 / 6
        z = ndtri((1 - level) / 2)
        return tuple(float(ndtr(z0 + (z0 + side) / (1 - acceleration * (z0 + side)))) for side in (z, -z))


def bootstrap_sums(
    strata: Sequence[np.ndarray],
    statistic: SumsStatistic,
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> Interval:
    """Interval of ``statistic(per-stratum column sums)`` with prompts resampled within each stratum.

    ``strata``: arrays [columns, prompts] (all strata with the same columns); a prompt is one column
    vector and is resampled whole. ``statistic`` receives a list with one array [columns, ...] per
    stratum (the sums over that stratum's resampled prompts; ``...`` are resample dimensions) and
    returns the estimate [...]. Vectorised: no Python loop over resamples.
    """
    strata = [np.asarray(s, dtype=float) for s in strata]
    if not strata or any(s.ndim != 2 for s in strata) or len({s.shape[0] for s in strata}) != 1:
        raise ValueError(f"strata must be 2-D arrays [columns, prompts] with equal columns; got "
                         f"{[s.shape for s in strata]}")
    if any(s.shape[1] == 0 for s in strata):
        raise ValueError("every stratum needs at least one prompt")
    full_sums = [s.sum(axis=-1) for s in strata]
    estimate = float(statistic(full_sums))
    n = sum(s.shape[1] for s in strata)
    varying = [k for k, s in enumerate(strata) if s.shape[1] >= 2]
    if not varying or not math.isfinite(estimate):
        return Interval(estimate, math.nan, math.nan, "none (<2 prompts)", n)

    rng = np.random.default_rng(seed)
    sums = list(full_sums)
    for k in varying:  # a one-prompt stratum enters whole: a constant
        sums[k] = _resampled_sums(strata[k], resamples, rng)
    with np.errstate(divide="ignore", invalid="ignore"):
        resampled = np.asarray(statistic(sums), dtype=float)  # [resamples]
        levels = _bca_levels(estimate, resampled, _jackknife(strata, full_sums, varying, statistic), level)
    method = "BCa"
    if not all(math.isfinite(q) for q in levels) or np.isnan(resampled).any():
        levels, method = ((1 - level) / 2, (1 + level) / 2), "percentile (BCa undefined)"
    if np.isnan(resampled).any():
        return Interval(estimate, math.nan, math.nan, method, n)
    low, high = np.quantile(resampled, levels)
    return Interval(estimate, float(low), float(high), method, n)


def _weights(count: int, weights: Sequence[float] | None) -> np.ndarray:
    if weights is None:
        return np.full(count, 1.0 / count)
    weights = np.asarray(weights, dtype=float)
    if weights.shape != (count,):
        raise ValueError(f"need one weight per stratum ({count}); got {weights.shape}")
    return weights


def _weighted_ratio(sums: list[np.ndarray], weights: np.ndarray, num: int, den: int) -> np.ndarray:
    return sum(w * s[num] / s[den] for w, s in zip(weights, sums))


def _stack(columns: Sequence, names: str) -> np.ndarray:
    arrays = [np.asarray(c, dtype=float) for c in columns]
    if any(a.ndim != 1 for a in arrays) or len({len(a) for a in arrays}) != 1:
        raise ValueError(f"{names} must be 1-D of equal length; got {[a.shape for a in arrays]}")
    return np.stack(arrays)


def ratio_of_sums(numerators, denominators, **options) -> Interval:
    """Σ numerators / Σ denominators over prompts (one cell: BE or speed-up) with its interval."""
    return mean_of_ratios([(numerators, denominators)], **options)


def mean_of_ratios(strata: Sequence[tuple], weights: Sequence[float] | None = None, **options) -> Interval:
    """Σ_s w_s · Σnum_s / Σden_s over strata (s = cells or datasets; default weights 1/strata).

    ``strata``: (numerators, denominators) per stratum, one value per prompt. Table 1's average column
    is this with one stratum per dataset: prompts are resampled within each dataset.
    """
    stacked = [_stack(s, "numerators and denominators") for s in strata]
    w = _weights(len(stacked), weights)
    return bootstrap_sums(stacked, lambda sums: _weighted_ratio(sums, w, 0, 1), **options)


def paired_comparison(
    strata: Sequence[tuple], kind: str, weights: Sequence[float] | None = None, **options
) -> Interval:
    """Method a against method b on the same prompts, resampled jointly.

    ``strata``: (num_a, den_a, num_b, den_b) per stratum, aligned by prompt. With R_x = Σ_s w_s ·
    Σnum_x,s / Σden_x,s: ``kind="difference"`` gives R_a − R_b (block efficiency: tokens over calls),
    ``kind="ratio"`` gives R_a / R_b (speed-up: AR wall over wall, so the ratio of speed-ups).
    """
    if kind not in ("difference", "ratio"):
        raise ValueError(f"kind must be 'difference' or 'ratio'; got {kind!r}")
    stacked = [_stack(s, "num_a, den_a, num_b, den_b") for s in strata]
    if any(s.shape[0] != 4 for s in stacked):
        raise ValueError("each stratum must be (num_a, den_a, num_b, den_b)")
    w = _weights(len(stacked), weights)

    def statistic(sums):
        a, b = _weighted_ratio(sums, w, 0, 1), _weighted_ratio(sums, w, 2, 3)
        return a - b if kind == "difference" else a / b

    return bootstrap_sums(stacked, statistic, **options)


def align_prompts(a: pd.DataFrame, b: pd.DataFrame, keys: Sequence[str], columns: Sequence[str]) -> pd.DataFrame:
    """Rows of ``a`` and ``b`` joined on ``keys`` (their intersection), ``columns`` suffixed _a and _b.

    Rows sharing a key on one side (the same prompt in two repeated cells) are summed first: every
    statistic here is a ratio of sums, which that leaves unchanged.
    """
    keys, columns = list(keys), list(columns)
    for name, frame in (("a", a), ("b", b)):
        missing = [c for c in keys + columns if c not in frame]
        if missing:
            raise ValueError(f"records of {name} lack columns {missing}")
    sides = [frame.groupby(keys, dropna=False)[columns].sum(min_count=1).reset_index() for frame in (a, b)]
    return sides[0].merge(sides[1], on=keys, how="inner", suffixes=("_a", "_b"))


# --------------------------------------------------------------------------------------------------
# Quality: paired binary outcomes
# --------------------------------------------------------------------------------------------------


def wilson_interval(successes: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Wilson score interval of a proportion (statsmodels); NaN bounds when n = 0."""
    if n == 0:
        return (math.nan, math.nan)
    low, high = proportion_confint(int(successes), int(n), alpha=1 - level, method="wilson")
    # At k = 0 (k = n) the Wilson bound is exactly 0 (1); statsmodels' arithmetic leaves 1 - 1e-16 there.
    return (0.0 if successes == 0 else float(low), 1.0 if successes == n else float(high))



@dataclass(frozen=True)
class PairedOutcomes:
    """Two methods' correct/incorrect outcomes on the same prompts, and McNemar's exact test."""

    n: int
    correct_a: int
    correct_b: int
    only_a: int  # prompts a got right and b wrong
    only_b: int
    p_value: float  # exact McNemar: two-sided binomial test of only_a among the discordant pairs, p = 1/2

    @property
    def accuracy_a(self) -> float:
        return self.correct_a / self.n if self.n else math.nan

    @property
    def accuracy_b(self) -> float:
        return self.correct_b / self.n if self.n else math.nan

    @property
    def wilson_a(self) -> tuple[float, float]:
        return wilson_interval(self.correct_a, self.n)

    @property
    def wilson_b(self) -> tuple[float, float]:
        return wilson_interval(self.correct_b, self.n)


def mcnemar_exact(correct_a, correct_b) -> PairedOutcomes:
    """McNemar's exact test on paired booleans (same prompts, same order). p = 1 without discordant pairs."""
    a = np.asarray(correct_a)
    b = np.asarray(correct_b)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"outcomes must be 1-D of equal length; got {a.shape} and {b.shape}")
    if not (np.isin(a, (0, 1)).all() and np.isin(b, (0, 1)).all()):
        raise ValueError("outcomes must be booleans (or 0/1)")
    a, b = a.astype(bool), b.astype(bool)
    only_a, only_b = int((a & ~b).sum()), int((~a & b).sum())
    discordant = only_a + only_b
    p_value = float(binomtest(only_a, discordant, 0.5).pvalue) if discordant else 1.0
    return PairedOutcomes(len(a), int(a.sum()), int(b.sum()), only_a, only_b, p_value)


# Per-prompt quality outcomes (one row per prompt per cell): what ``quality_parity`` reads.
QUALITY_OUTCOME_COLUMNS = ("model_pair", "dataset", "temperature", "method", "prompt_id", "correct")
# A prompt is the same prompt in two cells when these agree (absent ones are ignored).
QUALITY_PAIR_KEYS = ("model_pair", "dataset", "temperature", "seed", "max_new_tokens")


def quality_parity(outcomes: pd.DataFrame, baseline: str = "ar") -> pd.DataFrame:
    """Each method against ``baseline`` on the prompts both scored: accuracies with Wilson intervals,
    the discordant counts and McNemar's exact p-value. One row per (setting, method)."""
    missing = [c for c in QUALITY_OUTCOME_COLUMNS if c not in outcomes]
    if missing:
        raise ValueError(f"quality outcomes lack columns {missing}")
    setting = [c for c in QUALITY_PAIR_KEYS if c in outcomes]
    variant = [c for c in ("K", "L") if c in outcomes]
    rows = []
    for key, group in outcomes.groupby(setting, dropna=False):
        base = group[group["method"] == baseline]
        for method_key, cell in group[group["method"] != baseline].groupby(["method", *variant], dropna=False):
            aligned = align_prompts(cell, base, ["prompt_id"], ["correct"])
            test = mcnemar_exact(aligned["correct_a"] > 0, aligned["correct_b"] > 0)
            rows.append(
                {
                    **dict(zip(setting, key)),
                    **dict(zip(["method", *variant], method_key)),
                    "n_paired": test.n,
                    "n_method": cell["prompt_id"].nunique(),
                    "n_baseline": base["prompt_id"].nunique(),
                    "accuracy": test.accuracy_a,
                    "accuracy_low": test.wilson_a[0],
                    "accuracy_high": test.wilson_a[1],
                    "baseline_accuracy": test.accuracy_b,
                    "baseline_low": test.wilson_b[0],
                    "baseline_high": test.wilson_b[1],
                    "only_method": test.only_a,
                    "only_baseline": test.only_b,
                    "p_value": test.p_value,
                }
            )
    return pd.DataFrame(rows)


__all__ = [
    "LEVEL", "MIN_PROMPTS_FOR_VERDICT", "QUALITY_OUTCOME_COLUMNS", "RESAMPLES", "SEED", "SPEEDUP_EXCLUSIONS",
    "Interval", "PairedOutcomes", "align_prompts", "bootstrap_sums", "mcnemar_exact", "mean_of_ratios",
    "paired_comparison", "quality_parity", "ratio_of_sums", "speedup_comparable", "speedup_exclusion",
    "wilson_interval",
]
