"""The first-token bias estimators and test, on toys whose exact laws are known (spectr_repro.theory.exact).

Thresholds: the test's level is estimators.ALPHA = 0.05 and its stated power 0.90 (module doc). Monte-Carlo
checks of level and power use 200 fixed-seed replicates: the standard error of a rate near 0.05 is 0.015
and near 0.9 is 0.021, so the bounds below (level <= 0.095, power >= 0.85) sit ~3 and ~2.4 SE away.
"""

from __future__ import annotations

import math

import pytest
import torch

from spectr_repro.bias import estimators as E
from spectr_repro.theory.exact import rule_law
from spectr_repro.theory.toy import block_tensors, draft_tuples, sample_drafts, toy_pair
from spectr_repro.verify import get_verifier


def first_token_marginal(outcomes, V: int) -> torch.Tensor:
    law = torch.zeros(V, dtype=torch.float64)
    for outcome in outcomes:
        law[outcome.tokens[0]] += outcome.probability
    return law


@pytest.mark.parametrize("method,K", [("sd", 1), ("spectr", 2), ("spectr", 3)])
def test_closed_form_first_token_law_is_the_rules_own_law_given_the_drafts(method, K):
    """For every draft tuple of a V=3, L=2 toy, the closed form equals ``.law()``'s first-token marginal."""
    target, draft = toy_pair(3, seed=0)
    verifier = get_verifier(method)
    generator = torch.Generator().manual_seed(0)
    worst = 0.0
    for _, tokens in draft_tuples(draft, (), K, 2):
        draft_probs, target_probs = block_tensors(target, draft, (), tokens)
        expected = first_token_marginal(verifier.law(tokens, draft_probs, target_probs), 3)
        draws = E.closed_form_draws(method, target_probs[0, 0], draft_probs[0, 0], tokens[None, :, 0], generator)
        worst = max(worst, float((E.mean_law(draws, 3) - expected).abs().max()))
    assert worst < 1e-12


@pytest.mark.parametrize("control", E.CONTROLS)
def test_control_exact_law_integrates_its_law_given_the_draft(control):
    target, draft = toy_pair(3, seed=2)
    p, q = target.probs(()), draft.probs(())
    generator = torch.Generator().manual_seed(0)
    total = torch.zeros(3, dtype=torch.float64)
    for prob, tokens in draft_tuples(draft, (), 1, 1):
        draws = E.closed_form_draws(control, p, q, tokens[None, :, 0], generator)
        total += prob * E.mean_law(draws, 3)
    assert torch.allclose(total, E.control_exact_law(control, p, q), atol=1e-12)
    assert float(E.total_variation(total, p)) > 0.01  # a control that is not biased would control nothing


def test_sparse_bootstrap_tv_equals_the_dense_one():
    generator = torch.Generator().manual_seed(3)
    V = 5000
    p = torch.softmax(torch.randn(V, generator=generator) * 2, 0)
    q = torch.softmax(torch.randn(V, generator=generator) * 2, 0)
    first = torch.multinomial(q, 40 * 3, replacement=True, generator=generator).view(40, 3)
    counts = torch.distributions.Multinomial(40, torch.ones(40) / 40).sample((30,)).double()
    for method in ("spectr", *E.CONTROLS):
        draws = E.closed_form_draws(method, p, q, first if method == "spectr" else first[:, :1], generator)
        dense = E.total_variation(E._laws(draws, counts, V), p)
        assert torch.allclose(E.resampled_tv(draws, counts, p), dense, atol=1e-12), method
    tokens = torch.multinomial(p, 7 * 50, replacement=True, generator=generator).view(7, 50)
    dense = torch.stack([E.total_variation(torch.bincount(row, minlength=V).double() / 50, p) for row in tokens])
    assert torch.allclose(E.empirical_tv(tokens, p), dense, atol=1e-12)


@pytest.mark.parametrize("V", [2, 2000])
def test_level_and_stated_power_hold_in_simulation(V):
    """Under H0 the test rejects at most ~5 %; at the stated detectable TV it rejects >= ~90 %."""
    generator = torch.Generator().manual_seed(V)
    # V=2: the release toy's target; V=2000: a Zipf law (top token ~0.4, a long tail, as an LM's next token)
    zipf = 1 / torch.arange(1, V + 1, dtype=torch.float64) ** 1.5
    p = torch.tensor([0.373, 0.627], dtype=torch.float64) if V == 2 else zipf / zipf.sum()
    S = 200
    calibration = E.calibrate(p, S, generator)
    assert math.isfinite(calibration.detectable_tv)
    null_p = E.mc_p_values(E.simulated_tv(p, p, S, 200, generator), calibration.null)
    assert float((null_p <= E.ALPHA).double().mean()) <= 0.095
    shifted = E.shifted_law(p, calibration.detectable_tv)
    assert abs(float(E.total_variation(shifted, p)) - calibration.detectable_tv) < 1e-12
    alt_p = E.mc_p_values(E.simulated_tv(shifted, p, S, 200, generator), calibration.null)
    assert float((alt_p <= E.ALPHA).double().mean()) >= 0.85
    # Half the detectable TV must not pass for detectable (the threshold is the first grid point reaching 0.9).
    half = E.shifted_law(p, calibration.detectable_tv / 2)
    half_p = E.mc_p_values(E.simulated_tv(half, p, S, 200, generator), calibration.null)
    assert float((half_p <= E.ALPHA).double().mean()) < 0.9


def test_pooling_adds_power_and_stays_a_p_value():
    generator = torch.Generator().manual_seed(5)
    zipf = 1 / torch.arange(1, 301, dtype=torch.float64) ** 1.5
    p = zipf / zipf.sum()
    calibration = E.calibrate(p, 100, generator)
    pooled_p, pooled_detectable = E.pooled([0.5] * 4, [calibration.alternative_p_values] * 4)
    assert pooled_detectable < calibration.detectable_tv
    assert 0.5 < pooled_p <= 1.0  # four middling p-values are no evidence
    assert E.pooled([0.01] * 4, [calibration.alternative_p_values] * 4)[0] < 0.01


@pytest.fixture(scope="module")
def release_toy_samples():
    """The toy of issue 23 (V=2, L=3, seed 1, K=2): S=600 independent draft sets with their target rows."""
    target, draft = toy_pair(2, seed=1)
    generator = torch.Generator().manual_seed(23)
    blocks = [sample_drafts(draft, (), 2, 3, generator) for _ in range(600)]
    tensors = [block_tensors(target, draft, (), tokens) for tokens in blocks]
    return (target, draft, torch.stack(blocks), torch.stack([t[0] for t in tensors]),
            torch.stack([t[1] for t in tensors]))


def test_release_first_token_bias_is_estimated_within_its_interval_and_detected(release_toy_samples):
    target, draft, tokens, draft_probs, target_probs = release_toy_samples
    p = target.probs(())
    law = rule_law("spectr_gbv", target, draft, 2, 3)
    rule_first = sum(prob for z, prob in law.items() if z[0] == 0)
    assert rule_first == pytest.approx(0.489, abs=5e-4) and float(p[0]) == pytest.approx(0.373, abs=5e-4)
    exact_tv = abs(rule_first - float(p[0]))
    generator = torch.Generator().manual_seed(0)
    draws = E.rule_draws("spectr_gbv", tokens, draft_probs, target_probs, 1, generator)
    result = E.analyse(draws, p, generator)
    low, high = result.interval
    assert low <= exact_tv <= high
    assert exact_tv > result.detectable_tv  # the power statement covers this bias ...
    assert result.p_value <= E.ALPHA  # ... and the test rejects
    assert E.verdict(result.p_value, result.detectable_tv) == "bias detected (p <= 0.05)"


@pytest.mark.parametrize("method", ["spectr", "sd", "control_draft"])
def test_closed_form_rules_and_the_control_on_the_same_samples(release_toy_samples, method):
    target, draft, tokens, draft_probs, target_probs = release_toy_samples
    p = target.probs(())
    width = 2 if method == "spectr" else 1
    generator = torch.Generator().manual_seed(1)
    draws = E.rule_draws(method, tokens[:, :width], draft_probs[:, :width], target_probs[:, :width], 1, generator)
    result = E.analyse(draws, p, generator)
    if method == "control_draft":  # law q: exact TV 0.076 > detectable (~0.066 at S=600): must be detected
        exact = float(E.total_variation(E.control_exact_law(method, p, draft.probs(())), p))
        assert exact > result.detectable_tv and result.p_value <= E.ALPHA
        assert result.interval[0] <= exact <= result.interval[1]
    else:
        assert result.p_value > E.ALPHA
        assert result.interval[0] == 0.0 or result.interval[0] < result.detectable_tv


@pytest.mark.slow
@pytest.mark.parametrize("method", ["sbv", "sbvf"])
def test_counted_lossless_rules_pass_on_the_release_toy(release_toy_samples, method):
    target, _, tokens, draft_probs, target_probs = release_toy_samples
    generator = torch.Generator().manual_seed(2)
    draws = E.rule_draws(method, tokens, draft_probs, target_probs, 1, generator)
    result = E.analyse(draws, target.probs(()), generator)
    assert result.p_value > E.ALPHA
