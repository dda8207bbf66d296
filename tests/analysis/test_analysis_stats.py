"""Paired statistics (spectr_repro.analysis.stats): interval calibration with negative controls, the
stratified average, the BCa fallback, McNemar and Wilson, and which speed-ups may be shown.

Calibration tests draw seeded synthetic prompt sets whose per-prompt block efficiency varies a lot
between prompts (difficulty 2 to 5 tokens per call) and little between methods on one prompt, which is
what real runs look like and why the comparisons are paired.
"""

import math

import numpy as np
import pandas as pd
import pytest

from spectr_repro.analysis import stats
from spectr_repro.analysis.stats import (
    align_prompts,
    bootstrap_sums,
    mcnemar_exact,
    mean_of_ratios,
    paired_comparison,
    quality_parity,
    ratio_of_sums,
    speedup_comparable,
    speedup_exclusion,
    wilson_interval,
)

CALLS = 10.0  # target calls per prompt in the synthetic prompt sets
FAST = {"resamples": 999}  # calibration loops: 999 resamples keep the 2.5 % quantile's MC error small


def _prompt_set(rng, n, shift=0.0, noise=1.0):
    """Tokens of methods a and b on n prompts: a shared difficulty, b = a's law + ``shift`` BE, own noise."""
    difficulty = rng.uniform(2.0, 5.0, n) * CALLS
    calls = np.full(n, CALLS)
    tokens_a = difficulty + rng.normal(0, noise, n)
    tokens_b = difficulty + shift * CALLS + rng.normal(0, noise, n)
    return tokens_a, tokens_b, calls


def test_identical_methods_give_a_zero_width_interval_at_the_null():
    rng = np.random.default_rng(1)
    tokens, _, calls = _prompt_set(rng, 20)
    difference = paired_comparison([(tokens, calls, tokens, calls)], "difference")
    assert difference.estimate == 0.0 and (difference.low, difference.high) == (0.0, 0.0)
    assert not difference.excludes(0.0)
    assert difference.method == "percentile (BCa undefined)"  # every resample is 0: BCa has no spread
    wall = rng.uniform(1, 3, 20)
    ratio = paired_comparison([(2 * wall, wall, 2 * wall, wall)], "ratio")
    assert ratio.estimate == pytest.approx(1.0) and not ratio.excludes(1.0)


def test_paired_difference_null_false_positives_and_power():
    """Same law: the 95 % interval excludes 0 in at most 10 % of 200 seeded prompt sets (nominal 5 %; the
    binomial s.d. of the rate is 1.5 %, so 10 % is 3 s.d. above nominal and leaves room for BCa's mild
    undercoverage at n = 30). A shift of 0.1 BE (≈ 3.9 standard errors of the paired mean) is found in at
    least 90 % of them. Pairing is what gives the power: resampling the two methods' prompts independently
    makes the interval more than 3 times wider on the same data."""
    rng = np.random.default_rng(2024)
    null_hits, shift_hits = 0, 0
    for _ in range(200):
        a, b, calls = _prompt_set(rng, 30)
        null_hits += paired_comparison([(b, calls, a, calls)], "difference", **FAST).excludes(0.0)
        a, b, calls = _prompt_set(rng, 30, shift=0.1)
        shifted = paired_comparison([(b, calls, a, calls)], "difference", **FAST)
        shift_hits += shifted.excludes(0.0) and shifted.estimate > 0
    assert null_hits <= 20, null_hits
    assert shift_hits >= 180, shift_hits

    a, b, calls = _prompt_set(np.random.default_rng(7), 30, shift=0.1)
    paired = paired_comparison([(b, calls, a, calls)], "difference")
    zeros, ones = np.zeros(30), np.ones(30)
    independent = bootstrap_sums(  # method b's prompts and method a's prompts in separate strata
        [np.stack([b, calls, zeros, ones]), np.stack([zeros, ones, a, calls])],
        lambda sums: sums[0][0] / sums[0][1] - sums[1][2] / sums[1][3],
    )
    assert paired.estimate == pytest.approx(independent.estimate)
    assert paired.excludes(0.0) and not independent.excludes(0.0)
    assert (independent.high - independent.low) > 3 * (paired.high - paired.low)


def _speed_set(rng, n, ratio):
    """AR wall times and two methods' wall times on n prompts; b is ``ratio`` times faster than a."""
    ar = rng.uniform(2.0, 6.0, n)
    wall_a = ar / 2.0 * rng.lognormal(0, 0.05, n)
    wall_b = ar / (2.0 * ratio) * rng.lognormal(0, 0.05, n)
    return ar, wall_a, wall_b


def test_known_shift_and_known_speedup_ratio_are_covered():
    """Intervals around a known BE shift (0.5) and a known speed-up ratio (1.25) contain the truth in at
    least 88 % of 100 seeded sets each (nominal 95 %; binomial s.d. 2.2 %, so 88 % is 3 s.d. below) and
    exclude the null (0, 1) in every one of them (both effects are > 8 standard errors)."""
    rng = np.random.default_rng(3)
    covered, excluded = {"difference": 0, "ratio": 0}, {"difference": 0, "ratio": 0}
    for _ in range(100):
        a, b, calls = _prompt_set(rng, 40, shift=0.5, noise=2.0)
        difference = paired_comparison([(b, calls, a, calls)], "difference", **FAST)
        covered["difference"] += difference.low < 0.5 < difference.high
        excluded["difference"] += difference.excludes(0.0)
        ar, wall_a, wall_b = _speed_set(rng, 40, 1.25)
        ratio = paired_comparison([(ar, wall_b, ar, wall_a)], "ratio", **FAST)
        covered["ratio"] += ratio.low < 1.25 < ratio.high
        excluded["ratio"] += ratio.excludes(1.0)
    assert min(covered.values()) >= 88, covered
    assert excluded == {"difference": 100, "ratio": 100}

    # the statistics themselves: pooled ratios of sums, as in Table 1
    assert difference.estimate == pytest.approx(b.sum() / calls.sum() - a.sum() / calls.sum())
    assert difference.method == "BCa" and difference.n == 40
    assert ratio.estimate == pytest.approx((ar.sum() / wall_b.sum()) / (ar.sum() / wall_a.sum()))


def test_stratified_average_resamples_within_each_dataset():
    rng = np.random.default_rng(4)
    tokens, _, calls = _prompt_set(rng, 25)
    constant = (np.full(10, 30.0), np.full(10, CALLS))  # every prompt BE 3: no spread of its own
    single = mean_of_ratios([(tokens, calls)])
    average = mean_of_ratios([(tokens, calls), constant])
    assert average.estimate == pytest.approx((tokens.sum() / calls.sum() + 3.0) / 2)
    assert average.n == 35
    # the constant stratum is never mixed with the other: the average's interval is the single one halved
    assert (average.high - average.low) == pytest.approx((single.high - single.low) / 2, rel=0.15)
    weighted = mean_of_ratios([(tokens, calls), constant], weights=[0.25, 0.75])
    assert weighted.estimate == pytest.approx(0.25 * tokens.sum() / calls.sum() + 0.75 * 3.0)
    with pytest.raises(ValueError, match="one weight per stratum"):
        mean_of_ratios([(tokens, calls), constant], weights=[1.0])


def test_stratified_null_false_positives():
    """Average over two datasets of a paired difference under no difference: at most 10 % of 200 seeded
    sets exclude 0 (nominal 5 %; same reasoning as the single-stratum test)."""
    rng = np.random.default_rng(5)
    hits = 0
    for _ in range(200):
        strata = []
        for n in (15, 25):
            a, b, calls = _prompt_set(rng, n)
            strata.append((b, calls, a, calls))
        hits += paired_comparison(strata, "difference", **FAST).excludes(0.0)
    assert hits <= 20, hits


def test_small_and_degenerate_inputs():
    assert ratio_of_sums([4.0, 8.0, 12.0], [1.0, 2.0, 3.0]).method == "percentile (BCa undefined)"
    one = ratio_of_sums([3.0], [1.0])
    assert one.estimate == 3.0 and math.isnan(one.low) and not one.has_interval and not one.excludes(0.0)
    # a one-prompt stratum enters as a constant; the other stratum still gives an interval
    mixed = mean_of_ratios([([3.0], [1.0]), ([10.0, 20.0, 35.0], [10.0, 10.0, 10.0])])
    assert mixed.has_interval and mixed.estimate == pytest.approx((3.0 + 65 / 30) / 2)
    assert ratio_of_sums([8.0, 10.0, 30.0], [2.0, 2.0, 4.0]) == ratio_of_sums([8.0, 10.0, 30.0], [2.0, 2.0, 4.0])
    with pytest.raises(ValueError, match="equal length"):
        ratio_of_sums([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="kind"):
        paired_comparison([([1.0, 2.0], [1.0, 1.0], [1.0, 2.0], [1.0, 1.0])], "sum")
    with pytest.raises(ValueError, match="at least one prompt"):
        bootstrap_sums([np.zeros((2, 0))], lambda sums: sums[0][0])


def test_align_prompts_uses_the_intersection_and_sums_repeated_prompts():
    a = pd.DataFrame({"prompt_id": ["p1", "p2", "p3", "p3"], "tok": [1, 2, 3, 4]})
    b = pd.DataFrame({"prompt_id": ["p2", "p3", "p4"], "tok": [20, 30, 40]})
    aligned = align_prompts(a, b, ["prompt_id"], ["tok"])
    assert list(aligned["prompt_id"]) == ["p2", "p3"]
    assert list(aligned["tok_a"]) == [2, 7] and list(aligned["tok_b"]) == [20, 30]
    with pytest.raises(ValueError, match="lack columns"):
        align_prompts(a, b, ["prompt_id"], ["calls"])


def _wilson_closed_form(k, n, z=1.959963984540054):
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


@pytest.mark.parametrize("k,n", [(0, 10), (3, 10), (10, 10), (57, 164)])
def test_wilson_interval_matches_the_closed_form(k, n):
    assert wilson_interval(k, n) == pytest.approx(_wilson_closed_form(k, n), abs=1e-12)
    low, high = wilson_interval(k, n)
    assert low <= k / n <= high


def _scipy_wilson(k, n):
    """The Wilson interval as spectr_repro computed it until 2026-12-03 (``quality.wilson_interval``, scipy's
    binomtest), kept here to check the statsmodels interval that replaced it."""
    from scipy.stats import binomtest

    interval = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    return interval.low, interval.high


@pytest.mark.parametrize("k,n", [(0, 1), (1, 1), (0, 10), (3, 10), (10, 10), (57, 164), (499, 1000)])
def test_wilson_interval_equals_the_scipy_interval_it_replaced(k, n):
    assert wilson_interval(k, n) == pytest.approx(_scipy_wilson(k, n), abs=1e-12)
    assert all(math.isnan(bound) for bound in wilson_interval(0, 0))


def test_mcnemar_exact():
    outcomes = [True, False, True, True, False]
    same = mcnemar_exact(outcomes, outcomes)
    assert same.p_value == 1.0 and same.only_a == same.only_b == 0  # identical outcomes: p = 1
    assert same.accuracy_a == same.accuracy_b == 0.6 and same.wilson_a == wilson_interval(3, 5)
    # 20 prompts a solves and b does not, none the other way: p = 2 · 0.5^20
    lopsided = mcnemar_exact([1] * 20 + [0] * 5, [0] * 20 + [0] * 5)
    assert (lopsided.only_a, lopsided.only_b) == (20, 0)
    assert lopsided.p_value == pytest.approx(2 * 0.5**20, rel=1e-12)
    # balanced discordance is no evidence; concordant pairs do not enter
    balanced = mcnemar_exact([1] * 5 + [0] * 5 + [1] * 50, [0] * 5 + [1] * 5 + [1] * 50)
    assert balanced.p_value == pytest.approx(1.0)
    assert mcnemar_exact([1] * 9 + [0], [0] * 9 + [1]).p_value == pytest.approx(22 / 1024)  # 2·P(X<=1), n=10
    with pytest.raises(ValueError, match="equal length"):
        mcnemar_exact([1, 0], [1])
    with pytest.raises(ValueError, match="booleans"):
        mcnemar_exact([0.5, 1], [1, 1])


def test_quality_parity_pairs_each_method_with_ar_on_shared_prompts():
    rows = []
    for method, correct in (("ar", [1, 1, 0, 0, 1, 0]), ("sd", [1, 1, 0, 0, 1, 0]), ("spectr_gbv", [0] * 6)):
        for index, value in enumerate(correct):
            rows.append({"model_pair": "p", "dataset": "gsm8k", "temperature": 0.4, "seed": 0, "method": method,
                         "prompt_id": f"q{index}", "correct": value})
    rows.append({"model_pair": "p", "dataset": "gsm8k", "temperature": 0.4, "seed": 0, "method": "sd",
                 "prompt_id": "q9", "correct": 1})  # a prompt AR did not run: left out, counted
    parity = quality_parity(pd.DataFrame(rows)).set_index("method")
    assert parity.loc["sd", "p_value"] == 1.0 and parity.loc["sd", "n_paired"] == 6
    assert parity.loc["sd", "n_method"] == 7 and parity.loc["sd", "n_baseline"] == 6
    assert parity.loc["spectr_gbv", "only_baseline"] == 3 and parity.loc["spectr_gbv", "only_method"] == 0
    assert parity.loc["spectr_gbv", "p_value"] == pytest.approx(0.25)  # 2 · 0.5^3
    assert parity.loc["spectr_gbv", "accuracy"] == 0.0 and parity.loc["spectr_gbv", "baseline_accuracy"] == 0.5
    with pytest.raises(ValueError, match="lack columns"):
        quality_parity(pd.DataFrame(rows).drop(columns="correct"))


def test_speedup_exclusion_reads_summary_flags(monkeypatch):
    assert speedup_exclusion({}) is None and speedup_comparable({})
    assert speedup_exclusion({"batch_prompts": 1, "contention": False, "offloaded": None}) is None
    assert speedup_exclusion(pd.Series({"batch_prompts": math.nan})) is None  # a column absent in this cell
    assert speedup_exclusion({"batch_prompts": 8}) == "batched"
    assert speedup_exclusion({"batch_prompts": 4.0, "offloaded": True}) == "batched, offloaded"
    assert speedup_exclusion({"batch_prompts": 8, "timed_prompts": 2}) is None  # timed alone: a batch-1 speed-up
    assert speedup_exclusion({"batch_prompts": 8, "timed_prompts": 0}) == "batched"
    assert not speedup_comparable({"contention": True})
    # the runner records contention as a dict: only other runners count (the load includes the timed process)
    assert speedup_exclusion({"contention": {"other_runners": [], "load_average_max": 2.5}}) is None
    assert speedup_exclusion({"contention": {"other_runners": ["host:12 sbv"]}}) == "contention"
    assert speedup_exclusion({"speedup_caveats": ["AR baseline: contention: .."]}) == "AR baseline not comparable"
    # a new flag is one entry
    monkeypatch.setitem(stats.SPEEDUP_EXCLUSIONS, "compiled_ar_only", (bool, "compiled AR only"))
    assert speedup_exclusion({"compiled_ar_only": True}) == "compiled AR only"


def _scipy_bca(strata, statistic):
    """The interval scipy.stats.bootstrap gives (BCa, 9999 resamples, seed 0) with the resampling the report used
    until 2026-12-07: one stratum as paired columns, several as one index sample each."""
    from scipy.stats import bootstrap

    full = [s.sum(axis=-1) for s in strata]
    if len(strata) == 1:
        def function(*columns, axis=-1):
            return statistic([np.stack([c.sum(axis=axis) for c in columns])])
        data, paired = tuple(strata[0]), True
    else:
        def function(*indices, axis=-1):
            return statistic([s[:, np.asarray(i, dtype=np.intp)].sum(axis=axis) for s, i in zip(strata, indices)])
        data, paired = tuple(np.arange(s.shape[1]) for s in strata), False
    result = bootstrap(data, function, paired=paired, vectorized=True, n_resamples=9999, method="BCa",
                       rng=np.random.default_rng(0))
    assert math.isfinite(float(statistic(full)))
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


@pytest.mark.parametrize("sizes", [(12,), (30,), (8, 15, 6)])
def test_bca_is_scipys_interval(sizes):
    """The vectorised bootstrap (multinomial counts times columns) gives scipy.stats.bootstrap's BCa interval on
    skewed paired ratio data: both bounds within 0.1 % of the interval's width (the two draw the same resamples,
    so they agree to ~1e-4 of the width or to rounding; the sums differ in rounding only). Negative control: the
    percentile interval of the same resamples, which lacks the bias correction and acceleration, is more than 0.5 %
    of the width from scipy's BCa on the same data (1.2 % to 8.5 % here)."""
    rng = np.random.default_rng(sum(sizes))
    strata = []
    for n in sizes:
        calls = rng.integers(3, 12, n).astype(float)
        a = calls * rng.lognormal(1.0, 0.5, n)
        strata.append(np.stack([a, calls, a * rng.lognormal(-0.05, 0.2, n), calls]))
    weights = np.full(len(strata), 1 / len(strata))

    def statistic(sums):
        return sum(w * (s[0] / s[1] - s[2] / s[3]) for w, s in zip(weights, sums))

    low, high = _scipy_bca(strata, statistic)
    ours = bootstrap_sums(strata, statistic)
    assert ours.method == "BCa"
    assert max(abs(ours.low - low), abs(ours.high - high)) <= 0.001 * (high - low), (ours, low, high)
    resampled = np.asarray(statistic([stats._resampled_sums(s, 9999, np.random.default_rng(0)) for s in strata]))
    percentile = np.quantile(resampled, [0.025, 0.975])
    assert max(abs(percentile[0] - low), abs(percentile[1] - high)) > 0.005 * (high - low)
