"""Per-context bias verdicts with Holm's family-wise correction (bias.estimators.context_verdicts): a lossless rule
is not flagged where the uncorrected per-context verdict cries wolf; a biased rule still is (negative control)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectr_repro.bias import estimators as est

CONTEXTS = 16  # as in the tiny_random run (sbv, 16 contexts, S = 400)
SAMPLES = 400
FAMILIES = 200
BIASED_TV = 0.10  # the release's first-token bias on the Qwen pair is 0.11-0.13 (issue 39)


def _family(rng: np.random.Generator, tv: float, with_models: bool = True) -> tuple[list[float], list]:
    """One method and setting: 16 contexts, each a target p over 50 tokens and S counted first tokens drawn from
    p (lossless) or from the law with mass ``tv`` moved off p's top token (biased); Pearson's test on p's bins, as
    the bias command runs it on counted laws."""
    p_values, models = [], []
    for _ in range(CONTEXTS):
        p = torch.from_numpy(rng.dirichlet(np.full(50, 0.2)))
        p = (p + 1e-6) / (p + 1e-6).sum()
        law = est.shifted_law(p, tv) if tv > 0 else p
        if law is None:  # p's top token below tv: draw a fresh context
            law, p = p, p
        tokens = torch.from_numpy(rng.choice(50, size=SAMPLES, p=law.numpy()))
        bins = est.bins_of(p, SAMPLES)
        y = (tokens.unsqueeze(-1) == bins.view(1, -1)).double()
        test = est.pearson(y, p[bins])
        p_values.append(test.p_value)
        if with_models:  # the power models are the slow part; the level checks need the p-values only
            models.append(est.power_model(test, p, bins))
    return p_values, models


def test_holm_matches_the_step_down_by_hand():
    reject, adjusted = est.holm([0.01, 0.04, 0.03, 0.5], alpha=0.05)
    # sorted 0.01, 0.03, 0.04, 0.5 against 0.05/4, 0.05/3, 0.05/2, 0.05: only 0.01 passes; adjusted = running max
    # of (n - i) p_(i): 0.04, 0.09, 0.09 (0.08 raised to the previous 0.09), 0.5
    assert reject == [True, False, False, False]
    assert adjusted == pytest.approx([0.04, 0.09, 0.09, 0.5])


def test_a_lossless_family_that_cries_wolf_uncorrected_is_silent_under_holm():
    """The issue's situation at fixed seeds: the first of the lossless families (seed 11) in which some context
    reads p <= 0.05 uncorrected; under Holm no context of it reads 'bias detected'. About one family in two cries
    wolf uncorrected, so 20 families find one unless the test stopped working."""
    rng = np.random.default_rng(11)
    for _ in range(20):
        p_values, _ = _family(rng, 0.0, with_models=False)
        if any(p <= est.ALPHA for p in p_values):
            break
    else:
        pytest.fail("no lossless family cried wolf uncorrected in 20: the simulation no longer tests anything")
    models = [est.PowerModel(df1=1, df2=None, noncentrality=[float("nan")] * len(est.TV_GRID))] * CONTEXTS
    verdicts = est.context_verdicts(p_values, models)
    assert not any(text.startswith("bias detected") for _, _, text in verdicts)
    assert min(adjusted for adjusted, _, _ in verdicts) > est.ALPHA


@pytest.mark.slow
def test_lossless_families_do_not_cry_wolf_under_holm():
    """200 lossless families (fixed seed). Uncorrected, a family has some 'bias detected' context with probability
    1 - 0.95^16 = 0.56 (Pearson's test is near its level here); Holm's family-wise error is <= 0.05 by
    construction. Thresholds: uncorrected rate > 0.40 (0.56 less 5 binomial sd of 0.035), Holm's < 0.10 (0.05 plus
    3 binomial sd of 0.015)."""
    rng = np.random.default_rng(2026)
    uncorrected, corrected, cried_wolf = 0, 0, None
    for _ in range(FAMILIES):
        p_values, _ = _family(rng, 0.0, with_models=False)
        naive = any(p <= est.ALPHA for p in p_values)
        holm = any(est.holm(p_values)[0])
        uncorrected += naive
        corrected += holm
        if naive and not holm and cried_wolf is None:
            cried_wolf = p_values
    assert uncorrected / FAMILIES > 0.40
    assert corrected / FAMILIES < 0.10
    # The verdict strings of a family where the uncorrected verdict cries wolf: no context reads 'bias detected'.
    models = [est.PowerModel(df1=1, df2=None, noncentrality=[float("nan")] * len(est.TV_GRID))] * CONTEXTS
    verdicts = est.context_verdicts(cried_wolf, models)
    assert not any(text.startswith("bias detected") for _, _, text in verdicts)


def test_a_biased_rule_is_still_flagged_under_holm():
    """Negative control: TV 0.10 at S = 400 on p's top bins; Pearson's power per context is near 1 there, so Holm
    flags some context in (almost) every family. Threshold: >= 9 of 10 families."""
    rng = np.random.default_rng(7)
    flagged = 0
    for _ in range(10):
        p_values, _ = _family(rng, BIASED_TV, with_models=False)
        flagged += any(est.holm(p_values)[0])
    assert flagged >= 9
    p_values, models = _family(rng, BIASED_TV)
    assert any(text.startswith("bias detected (Holm") for _, _, text in est.context_verdicts(p_values, models))


def test_context_verdicts_state_power_at_the_corrected_level():
    rng = np.random.default_rng(3)
    p_values, models = _family(rng, 0.0)
    verdicts = est.context_verdicts(p_values, models)
    assert len(verdicts) == CONTEXTS
    for (adjusted, detectable, text), raw, model in zip(verdicts, p_values, models):
        assert adjusted >= raw
        # power at alpha / n needs at least the TV it needs at alpha
        assert detectable >= est.detectable_of(model)
        assert "Holm" in text or text == "underpowered"
