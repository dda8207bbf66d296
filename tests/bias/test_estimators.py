"""The first-token bias estimators and test, on toys whose exact laws are known (spectr_repro.theory.exact).

Thresholds: the test's level is estimators.ALPHA = 0.05 and its stated power 0.90 (module doc). Monte-Carlo
checks of level and power use 400 fixed-seed replicates: the standard error of a rate near 0.05 is 0.011 and
near 0.9 is 0.015, so the bounds below (level <= 0.085, power >= 0.85) sit ~3 SE away from the stated values.
"""

from __future__ import annotations

import math

import pytest
import torch

from spectr_repro.bias import estimators as E
from spectr_repro.theory.exact import rule_law
from spectr_repro.theory.toy import block_tensors, draft_tuples, sample_drafts, toy_pair


def first_token_marginal(outcomes, V: int) -> torch.Tensor:
    law = torch.zeros(V, dtype=torch.float64)
    for outcome in outcomes:
        law[outcome.tokens[0]] += outcome.probability
    return law


@pytest.mark.parametrize("method,K", [("sd", 1), ("spectr", 2), ("spectr", 3), ("spectr_gbv", 2), ("sbv", 3)])
def test_exact_first_token_law_is_the_rules_own_law_given_the_drafts(method, K):
    """For every draft tuple of a V=3, L=2 toy, the estimator's law given the drafts equals ``.law()``'s
    first-token marginal (closed forms from row 0, and the rules' own ``first_token_law``)."""
    from spectr_repro.verify import get_verifier

    target, draft = toy_pair(3, seed=0)
    verifier = get_verifier(method)
    generator = torch.Generator().manual_seed(0)
    worst = 0.0
    for _, tokens in draft_tuples(draft, (), K, 2):
        draft_probs, target_probs = block_tensors(target, draft, (), tokens)
        expected = first_token_marginal(verifier.law(tokens, draft_probs, target_probs), 3)
        draws = E.rule_draws(method, tokens[None], draft_probs[None], target_probs[None], 1, generator)
        worst = max(worst, float((E.mean_law(draws, 3) - expected).abs().max()))
    assert worst < 1e-10
    assert E.estimator_name(method, 1) == "exact given drafts"


@pytest.mark.parametrize("control", E.CONTROLS)
def test_control_exact_law_integrates_its_law_given_the_draft(control):
    target, draft = toy_pair(3, seed=2)
    p, q = target.probs(()), draft.probs(())
    total = torch.zeros(3, dtype=torch.float64)
    for prob, tokens in draft_tuples(draft, (), 1, 1):
        draws = E.closed_form_draws(control, p, q, tokens[None, :, 0])
        total += prob * E.mean_law(draws, 3)
    assert torch.allclose(total, E.control_exact_law(control, p, q), atol=1e-12)
    assert float(E.total_variation(total, p)) > 0.01  # a control that is not biased would control nothing


def test_bins_are_fixed_by_p_and_the_sample_count_and_binned_tv_is_a_lower_bound():
    p = torch.tensor([0.05, 0.5, 0.3, 0.004, 0.146], dtype=torch.float64)
    # p >= 0.01, by p descending; token 0 (0.05) would leave the rest 0.004 < 0.01, so it joins the rest
    assert E.bins_of(p, 1000).tolist() == [1, 2, 4]
    assert E.bins_of(p, 40).tolist() == [1, 2]  # p >= 5/40; token 4 (0.146) would leave the rest 0.054 < 5/40
    assert E.bins_of(torch.tensor([0.05, 0.5, 0.3, 0.15], dtype=torch.float64), 1000).tolist() == [1, 2, 3]
    assert E.bins_of(torch.tensor([0.001] * 1000, dtype=torch.float64), 10).numel() == 1  # the top token at least
    law = torch.tensor([0.0, 0.5, 0.3, 0.05, 0.15], dtype=torch.float64)
    bins = E.bins_of(p, 40)
    assert float(E.binned_tv(law[bins], p[bins])) <= float(E.total_variation(law, p)) + 1e-15


def test_pearson_keeps_its_level_when_the_rest_of_the_vocabulary_is_rare():
    """The case found on 2026-12-06 (hsd, HumanEval/68+12): two tokens hold all but 0.0005 of p. A lossless counted
    rule (first tokens drawn from p, S = 192) is rejected at the test's level with the bins ``bins_of`` picks; with
    both tokens as bins (the rest an expected 0.1 draws: one draw there reads as p ~ 0.002) it is rejected about
    9 % more often, the chance of one or more draws in the rest. Threshold: 2000 replicates give a standard error
    of 0.5 % at a 5 % rate, so <= 7 % is the level with 4 SE of room and >= 10 % is 10 SE past it."""
    generator = torch.Generator().manual_seed(5)
    S, replicates = 192, 2000
    p = torch.cat([torch.tensor([0.6, 0.3995], dtype=torch.float64), torch.full((1000,), 0.0005 / 1000,
                                                                                  dtype=torch.float64)])
    bins = E.bins_of(p, S)
    assert bins.tolist() == [0]  # token 1 would leave the rest 0.0005 < 5/192: it joins the rest
    firsts = torch.multinomial(p.float(), replicates * S, replacement=True, generator=generator).view(replicates, S)

    def rejected(bins):
        rates = [E.pearson((row[:, None] == bins[None, :]).double(), p[bins]).p_value <= E.ALPHA for row in firsts]
        return sum(rates) / replicates

    assert rejected(bins) <= 0.07
    assert rejected(torch.tensor([0, 1])) >= 0.10  # negative control: the bins before the fix


def lossless_binned_laws(p, q, S, replicates, generator):
    """y [replicates, S, m] for sd's exact laws given S independent single drafts (a lossless rule)."""
    firsts = torch.multinomial(q.float(), replicates * S, replacement=True, generator=generator).view(replicates, S)
    bins = E.bins_of(p, S)
    return torch.stack([E.binned_laws(E.closed_form_draws("sd", p, q, row[:, None]), bins) for row in firsts]), bins


def zipf_pair(V: int, generator):
    zipf = 1 / torch.arange(1, V + 1, dtype=torch.float64) ** 1.5  # top token ~0.4 and a long tail, as an LM's
    p = zipf / zipf.sum()
    q = torch.softmax(p.log() + 0.7 * torch.randn(V, generator=generator, dtype=torch.float64), 0)
    return p, q


def test_level_and_stated_power_hold_in_simulation():
    """Under H0 (sd, lossless) the test rejects at most ~5 %; shifted by the stated detectable TV's alternative it
    rejects >= ~90 %, and by half of it < 90 % (so the stated TV is not loose by a factor 2)."""
    generator = torch.Generator().manual_seed(7)
    p, q = zipf_pair(2000, generator)
    S = 300
    y, bins = lossless_binned_laws(p, q, S, 400, generator)
    tests = [E.hotelling(row, p[bins]) for row in y]
    assert float(sum(t.p_value <= E.ALPHA for t in tests) / len(tests)) <= 0.085
    detectable = E.detectable_of(E.power_model(tests[0], p, bins))
    assert math.isfinite(detectable) and detectable < 0.2

    def rejection_rate(tv):
        shift = E.shifted_law(p, tv)[bins] - p[bins]
        return float(sum(E.hotelling(row + shift, p[bins]).p_value <= E.ALPHA for row in y) / len(y))

    assert rejection_rate(detectable) >= 0.85
    assert rejection_rate(detectable / 2) < 0.9


def test_pooling_adds_power_and_stays_a_p_value():
    generator = torch.Generator().manual_seed(5)
    p, q = zipf_pair(300, generator)
    y, bins = lossless_binned_laws(p, q, 100, 1, generator)
    model = E.power_model(E.hotelling(y[0], p[bins]), p, bins)
    pooled_p, pooled_detectable = E.pooled([0.5] * 4, [model] * 4)
    assert pooled_detectable < E.detectable_of(model)
    assert 0.5 < pooled_p <= 1.0  # four middling p-values are no evidence
    assert E.pooled([0.01] * 4, [model] * 4)[0] < 0.01
    assert E.pooled([0.5] * 4, [model.as_dict()] * 4) == (pooled_p, pooled_detectable)  # records store dicts


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
    assert low <= exact_tv <= high  # V = 2: the binned TV is the TV
    assert exact_tv > result.detectable_tv  # the power statement covers this bias ...
    assert result.p_value <= E.ALPHA  # ... and the test rejects
    assert E.verdict(result.p_value, result.detectable_tv) == "bias detected (p <= 0.05)"
    # Counting the rule's own draws instead (one call a draft set) is the noisier estimator: its interval is wider.
    counted = E.analyse(E.counted_draws("spectr_gbv", tokens, draft_probs, target_probs, 1, generator), p, generator)
    assert counted.interval[1] - counted.interval[0] > high - low


@pytest.mark.parametrize("method", ["spectr", "sd", "sbv", "control_draft"])
def test_lossless_rules_pass_and_the_control_is_detected_on_the_same_samples(release_toy_samples, method):
    target, draft, tokens, draft_probs, target_probs = release_toy_samples
    p = target.probs(())
    width = 1 if method in ("sd", "control_draft") else 2
    generator = torch.Generator().manual_seed(1)
    draws = E.rule_draws(method, tokens[:, :width], draft_probs[:, :width], target_probs[:, :width], 1, generator)
    result = E.analyse(draws, p, generator)
    if method == "control_draft":  # law q: exact TV 0.076, above the detectable TV at S=600: must be detected
        exact = float(E.total_variation(E.control_exact_law(method, p, draft.probs(())), p))
        assert exact > result.detectable_tv and result.p_value <= E.ALPHA
        assert result.interval[0] <= exact <= result.interval[1]
    else:
        assert result.p_value > E.ALPHA
        assert result.interval[0] < result.detectable_tv


@pytest.mark.slow
def test_counted_lossless_rule_passes_on_the_release_toy(release_toy_samples):
    target, _, tokens, draft_probs, target_probs = release_toy_samples
    generator = torch.Generator().manual_seed(2)
    draws = E.rule_draws("sbvf", tokens, draft_probs, target_probs, 1, generator)
    assert E.estimator_name("sbvf", 1).startswith("counted")
    result = E.analyse(draws, target.probs(()), generator)
    assert result.p_value > E.ALPHA


def test_counted_laws_get_pearsons_test_and_keep_its_level_where_a_bin_draws_nothing():
    """One-hot rows (one rule call per draft set) of a lossless rule: Pearson's test with the null covariance keeps
    its level; a covariance estimated from the rows (Hotelling's) would be singular whenever a bin drew no token:
    on the same rows it rejects far more often (the negative control that shows the check has power)."""
    generator = torch.Generator().manual_seed(11)
    p = torch.tensor([0.48, 0.25, 0.2, 0.03, 0.02, 0.02], dtype=torch.float64)
    S = 192
    bins = E.bins_of(p, S)  # the 0.03 bin is in: 0.03 >= 5 / 192, and the rest keeps 0.04 >= 5 / 192
    assert bins.tolist() == [0, 1, 2, 3]
    rows = torch.multinomial(p.float(), 400 * S, replacement=True, generator=generator).view(400, S)
    pearson, estimated = 0, 0
    for tokens in rows:
        draws = E.FirstTokenDraws(tokens[:, None], torch.ones(S, 1, dtype=torch.float64), None, counted=True)
        result = E.analyse(draws, p, generator, bootstrap_replicates=10)
        pearson += result.p_value <= E.ALPHA
        estimated += E.hotelling(E.binned_laws(draws, bins), p[bins]).p_value <= E.ALPHA
        assert result.test == "pearson"
    assert pearson / 400 <= 0.085
    assert estimated / 400 > pearson / 400 + 0.01
