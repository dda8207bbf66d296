"""block_estimates on toy pairs: sub-blocks of one K_max x L_max block are valid (K, L) blocks.

Averaging a rule's value on every draft tuple of K_max rows and L_max tokens, weighted by q, must give
its exact E[tau] + 1 at every K <= K_max, L <= L_max (``theory.exact``): this fails if rows or positions
are sliced wrong, and (negative control) if the sub-blocks are not i.i.d. drafts.
"""

from __future__ import annotations

import math

import pytest
import torch

from spectr_repro.replay import block_estimates, check_grid, grid
from spectr_repro.theory.exact import rule_expected_accepted
from spectr_repro.theory.toy import block_tensors, draft_tuples, toy_pair
from spectr_repro.verify import VERIFIERS, get_verifier

EXACT_TOLERANCE = 1e-9  # float64 sums of at most a few hundred products: round-off is ~1e-15
METHODS = list(VERIFIERS)


def weighted_replay(target, draft, K_max, L_max, K_values, L_values, reorder=None, methods=METHODS,
                    row_groups="disjoint"):
    """Sum over every draft tuple of q(tuple) x block_estimates (mode="law": exact per block)."""
    totals = {}
    for prob, tokens in draft_tuples(draft, (), K_max, L_max):
        if reorder is not None:
            tokens = reorder(tokens, draft)
        draft_probs, target_probs = block_tensors(target, draft, (), tokens)
        for estimate in block_estimates(tokens, draft_probs, target_probs, methods, K_values, L_values,
                                        draws=1, mode="law", row_groups=row_groups):
            key = (estimate.method, estimate.K, estimate.L)
            totals[key] = totals.get(key, 0.0) + prob * estimate.tokens
    return totals


@pytest.mark.parametrize("K_max, L_max, seed, row_groups", [(2, 2, 1, "disjoint"), (3, 1, 2, "disjoint"),
                                                            (2, 2, 1, "first")])
def test_weighted_replay_equals_exact_expectation(K_max, L_max, seed, row_groups):
    target, draft = toy_pair(vocab_size=2, seed=seed)
    K_values, L_values = list(range(1, K_max + 1)), list(range(1, L_max + 1))
    totals = weighted_replay(target, draft, K_max, L_max, K_values, L_values, row_groups=row_groups)
    assert set(totals) == set(grid(METHODS, K_values, L_values))
    for (method, K, L), value in totals.items():
        exact = rule_expected_accepted(method, target, draft, K, L) + 1
        assert value == pytest.approx(exact, abs=EXACT_TOLERANCE), (method, K, L)


def _rows_by_draft_probability(tokens: torch.Tensor, draft) -> torch.Tensor:
    """The drafts sorted most likely first: sub-blocks are then no longer i.i.d. draws from q."""
    probs = torch.tensor([draft.sequence_prob((), row.tolist()) for row in tokens])
    return tokens[probs.argsort(descending=True, stable=True)]


def test_negative_control_sorted_rows_break_the_identity():
    """With rows [:K] alone, sorting the rows makes the K = 1 sub-block the likelier draft (averaging every row, as
    row_groups="disjoint" does at K = 1, is immune to the order, rightly)."""
    target, draft = toy_pair(vocab_size=2, seed=1)
    totals = weighted_replay(target, draft, 2, 2, [1, 2], [1, 2], reorder=_rows_by_draft_probability,
                             methods=["sd", "spectr"], row_groups="first")
    gaps = {key: abs(value - rule_expected_accepted(key[0], target, draft, key[1], key[2]) - 1)
            for key, value in totals.items()}
    # K = 1 sub-blocks now hold the likelier draft: far more than round-off away from the exact value.
    assert gaps[("sd", 1, 2)] > 1e-3 and gaps[("spectr", 1, 2)] > 1e-3


def test_negative_control_dependent_rows_break_the_identity_of_disjoint_groups():
    """Rows 2 and 3 both copies of row 0: the second group of K = 2 is one draft twice, no independent pair, so
    spectr at K = 2, averaged over both groups, is off."""
    target, draft = toy_pair(vocab_size=2, seed=1)
    totals = {}
    for prob, tokens in draft_tuples(draft, (), 2, 2):
        tokens = torch.cat([tokens, tokens[:1], tokens[:1]])
        for estimate in block_estimates(tokens, *block_tensors(target, draft, (), tokens), ["spectr"], [2], [2],
                                        draws=1, mode="law"):
            totals[estimate.K] = totals.get(estimate.K, 0.0) + prob * estimate.tokens
    assert abs(totals[2] - rule_expected_accepted("spectr", target, draft, 2, 2) - 1) > 1e-3


def test_disjoint_row_groups_shrink_the_variance_of_paired_differences_exactly():
    """Over every draft tuple of a K_max = 4 toy block (weighted by q), sd at K=1 minus spectr at K=2: averaging sd
    over the 4 rows and spectr over the 2 disjoint pairs keeps the mean (both are unbiased) and lowers the
    variance of the per-block difference (exact enumeration, no sampling)."""
    target, draft = toy_pair(vocab_size=2, seed=1)
    moments = {}
    for row_groups in ("first", "disjoint"):
        mean = square = 0.0
        for prob, tokens in draft_tuples(draft, (), 4, 2):
            values = {(e.method, e.K): e.tokens for e in block_estimates(
                tokens, *block_tensors(target, draft, (), tokens), ["sd", "spectr"], [1, 2], [2], draws=1,
                mode="law", row_groups=row_groups)}
            difference = values[("sd", 1)] - values[("spectr", 2)]
            mean, square = mean + prob * difference, square + prob * difference ** 2
        moments[row_groups] = (mean, square - mean ** 2)
    assert moments["disjoint"][0] == pytest.approx(moments["first"][0], abs=EXACT_TOLERANCE)
    assert moments["disjoint"][1] < 0.5 * moments["first"][1]  # 0.00085 vs 0.0069 (8x) on this toy


def test_monte_carlo_estimate_within_its_error_of_the_law():
    """draws=4000 on one block: the MC mean of tau+1 (range <= L+1 = 4) lies within 5 standard errors
    (the SE bound (L+1)/2/sqrt(draws) = 0.032; 5 SE makes a false failure ~6e-7 per comparison) of the law."""
    target, draft = toy_pair(vocab_size=3, seed=0)
    tokens = torch.tensor([[0, 1, 2], [1, 1, 0], [0, 2, 2]])
    draft_probs, target_probs = block_tensors(target, draft, (), tokens)
    methods = ["sd", "spectr", "rbv", "sbv", "spectr_gbv"]
    generator = torch.Generator().manual_seed(5)
    mc = block_estimates(tokens, draft_probs, target_probs, methods, [1, 3], [3], draws=4000,
                         generator=generator, mode="monte_carlo")
    law = block_estimates(tokens, draft_probs, target_probs, methods, [1, 3], [3], draws=1, mode="law")
    bound = 5 * 4 / 2 / math.sqrt(4000)
    for a, b in zip(mc, law):
        assert (a.method, a.K, a.L) == (b.method, b.K, b.L)
        assert a.estimator == "monte_carlo" and a.draws == 4000 * (3 // a.K)  # every row group draws
        assert abs(a.tokens - b.tokens) < bound, (a, b)


def test_monte_carlo_is_deterministic_for_a_seed_and_uses_common_random_numbers():
    target, draft = toy_pair(vocab_size=3, seed=0)
    tokens = torch.tensor([[0, 1], [1, 1]])
    draft_probs, target_probs = block_tensors(target, draft, (), tokens)

    def run(seed):
        generator = torch.Generator().manual_seed(seed)
        return [e.tokens for e in block_estimates(tokens, draft_probs, target_probs, ["sbv", "spectr"], [2], [2],
                                                  draws=16, generator=generator, mode="monte_carlo")]

    assert run(3) == run(3)
    assert any(run(3) != run(seed) for seed in (4, 5, 6))


def test_stateful_rules_are_flagged_first_iteration():
    target, draft = toy_pair(vocab_size=3, seed=0)
    tokens = torch.tensor([[0, 1]])
    estimates = block_estimates(tokens, *block_tensors(target, draft, (), tokens), ["gbv", "bv"], [1], [2],
                                draws=2, generator=torch.Generator().manual_seed(0))
    flags = {e.method: e.first_iteration for e in estimates}
    assert flags == {"gbv": True, "bv": False}


@pytest.mark.parametrize("methods, Ks, Ls, draws, message", [
    (["nope"], [1], [1], 1, "unknown method"),
    (["sbv"], [0], [1], 1, "K values"),
    (["sbv"], [1], [0], 1, "L values"),
    (["sd"], [3], [2], 1, "single-draft"),
    (["sbv"], [1], [1], 0, "draws"),
])
def test_bad_grids_are_refused(methods, Ks, Ls, draws, message):
    with pytest.raises(ValueError, match=message):
        check_grid(methods, Ks, Ls, draws)


def test_sub_blocks_larger_than_the_block_are_refused():
    target, draft = toy_pair(vocab_size=3, seed=0)
    tokens = torch.tensor([[0, 1]])
    with pytest.raises(ValueError, match="block's shape"):
        block_estimates(tokens, *block_tensors(target, draft, (), tokens), ["sd"], [1], [3], draws=1)


def _fallback_block():
    """A toy block (V = 3, seed 1, K = 3, L = 2; found by a search over every draft tuple) on which sbvf's fallback
    raises the law's mean by 0.24 tokens over sbv's."""
    target, draft = toy_pair(vocab_size=3, seed=1)
    tokens = torch.tensor([[0, 2], [0, 2], [0, 1]])
    draft_probs, target_probs = block_tensors(target, draft, (), tokens)
    law = {e.method: e.tokens for e in block_estimates(tokens, draft_probs, target_probs, ["sbv", "sbvf"], [3], [2],
                                                       draws=1, mode="law")}
    assert law["sbvf"] - law["sbv"] > 0.2
    return tokens, draft_probs, target_probs, law


def test_control_variate_is_unbiased_where_the_fallback_matters():
    """sbvf = sbv's exact value + the mean paired difference (sbvf draw - sbv draw, same seed): within 4 standard
    errors (the SE of the paired differences, measured on the same seeds; a false failure ~6e-5) of sbvf's law
    mean. Negative control: sbv's exact value alone lies outside that band (the correction term is needed)."""
    tokens, draft_probs, target_probs, law = _fallback_block()
    draws = 2000
    generator = torch.Generator().manual_seed(9)
    (estimate,) = block_estimates(tokens, draft_probs, target_probs, ["sbvf"], [3], [2], draws=draws,
                                  generator=generator)
    assert estimate.estimator == "control_variate" and estimate.draws == draws
    seeds = torch.randint(0, 2**62, (draws,), generator=torch.Generator().manual_seed(9)).tolist()
    rules = {name: get_verifier(name) for name in ("sbv", "sbvf")}

    def accepted(name: str, seed: int) -> int:
        return int(rules[name](tokens, draft_probs, target_probs, generator=torch.Generator().manual_seed(seed))
                   .num_accepted)

    differences = torch.tensor([accepted("sbvf", s) - accepted("sbv", s) for s in seeds], dtype=torch.float64)
    band = 4 * float(differences.std()) / math.sqrt(draws)
    assert 0 < band < 0.05
    assert abs(estimate.tokens - law["sbvf"]) < band
    assert abs(law["sbv"] - law["sbvf"]) > band


def test_a_sampled_rule_is_drawn_beside_the_others_exact_values():
    """replay.sampled: the release by its sampler's draws (its exact scan grows quickly with L), sd still exact;
    the draws' mean is E[tau] + 1 within 4 standard errors (400 draws, tau + 1 in [1, 3]: sd <= 1, so 4/sqrt(400)
    = 0.2 bounds the error at ~4 sigma); without ``sampled`` the release is exact (control)."""
    target, draft = toy_pair(4, seed=3)
    (_, tokens), *_ = list(draft_tuples(draft, (), 2, 2))
    draft_probs, target_probs = block_tensors(target, draft, (), tokens)
    generator = torch.Generator().manual_seed(0)
    sampled = block_estimates(tokens, draft_probs, target_probs, ["sd", "spectr_gbv"], [1, 2], [2], draws=400,
                              generator=generator, sampled=["spectr_gbv"])
    exact = block_estimates(tokens, draft_probs, target_probs, ["sd", "spectr_gbv"], [1, 2], [2], draws=400,
                            generator=torch.Generator().manual_seed(0))
    by_key = {(e.method, e.K, e.L): e for e in sampled}
    for reference in exact:
        estimate = by_key[(reference.method, reference.K, reference.L)]
        assert reference.estimator == "exact"
        assert estimate.estimator == ("monte_carlo" if reference.method == "spectr_gbv" else "exact")
        assert abs(estimate.tokens - reference.tokens) < (0.2 if reference.method == "spectr_gbv" else 1e-12)
