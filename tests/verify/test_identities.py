"""Exact float64 identities behind the rules: the token-level decomposition, K-SEQ's rho* and residual,
block verification's residual and its expected accepted length. Tolerances are float64 round-off."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from spectr_repro.verify import get_verifier
from spectr_repro.verify.bv import BlockSegment, clipped_weights
from spectr_repro.verify.sd import SpeculativeDecoding
from spectr_repro.verify.spectr import EXCESS_SLACK, kseq_residual, optimal_rho
from tests.verify.verify_helpers import exact_mean_accepted, law_dict

TOL = 1e-12


def _dirichlet(V: int, generator: torch.Generator, alpha: float = 1.0) -> torch.Tensor:
    gamma = torch._standard_gamma(torch.full((V,), alpha, dtype=torch.float64), generator=generator)
    return gamma / gamma.sum()


def distribution_pairs(V: int = 4, count: int = 6, seed: int = 0):
    """(p, q) pairs: random ones (some sparse) plus the edge cases every rule must survive."""
    g = torch.Generator().manual_seed(seed)
    pairs = [(_dirichlet(V, g, a), _dirichlet(V, g, a)) for a in (1.0, 0.3) for _ in range(count // 2)]
    one_hot = torch.eye(V, dtype=torch.float64)
    half = torch.tensor([0.5, 0.5] + [0.0] * (V - 2), dtype=torch.float64)
    rest = torch.tensor([0.0, 0.0] + [1.0 / (V - 2)] * (V - 2), dtype=torch.float64)
    p = _dirichlet(V, g)
    pairs += [
        (p, p.clone()),  # p = q
        (half, rest),  # disjoint supports
        (one_hot[0], one_hot[1]),  # one-hot, different
        (one_hot[2], one_hot[2].clone()),  # one-hot, equal
        (torch.tensor([0.0, 0.2, 0.8] + [0.0] * (V - 3), dtype=torch.float64), p),  # zeros in p
        (p, torch.tensor([0.0, 0.5, 0.5] + [0.0] * (V - 3), dtype=torch.float64)),  # zeros in q
    ]
    return pairs


PAIRS = distribution_pairs()


@pytest.mark.parametrize("p, q", PAIRS)
def test_token_level_decomposition(p, q):
    """q * min(1, p/q) + (1 - sum min(p, q)) * norm((p - q)+) = p, with SD's own correction law."""
    residual = SpeculativeDecoding().correction(p, q)
    accepted = torch.minimum(p, q)  # = q * min(1, p/q), also where q = 0
    rebuilt = accepted + (1 - accepted.sum()) * residual
    assert torch.isfinite(residual).all()
    assert torch.allclose(rebuilt, p, atol=TOL, rtol=0)


@pytest.mark.parametrize("rule, K", [("sd", 1), ("bv", 1), ("spectr", 1), ("spectr", 2), ("spectr", 3),
                                     ("rbv", 1), ("rbv", 2), ("rbv", 3)])
@pytest.mark.parametrize("pair", range(len(PAIRS)))
def test_single_position_law_is_the_target(rule, K, pair):
    """L = 1: averaging the exact law of the first emitted token over K i.i.d. draft tokens gives p."""
    p, q = PAIRS[pair]
    V = p.numel()
    bonus = torch.full((V,), 1.0 / V, dtype=torch.float64)
    verifier = get_verifier(rule)
    first = torch.zeros(V, dtype=torch.float64)
    support = [v for v in range(V) if q[v] > 0]
    for drafts in itertools.product(support, repeat=K):
        weight = math.prod(float(q[v]) for v in drafts)
        tokens = torch.tensor(drafts).view(K, 1)
        law = law_dict(verifier.law(tokens, q.expand(K, 1, V), torch.stack([p, bonus]).expand(K, 2, V)))
        assert all(prob >= 0 and math.isfinite(prob) for prob in law.values())
        assert math.isclose(sum(law.values()), 1.0, abs_tol=TOL)
        for emitted, prob in law.items():
            first[emitted[0]] += weight * prob
    assert torch.allclose(first, p, atol=TOL, rtol=0)


def _brute_force_rho(p, q, k, steps=200):
    """Independent bisection with direct sums over the vocabulary (the docs/methods.md definition)."""
    def admissible(rho):
        beta = float(torch.minimum(q, p / rho).sum())
        return rho * beta - (1 - (1 - beta) ** k) >= -EXCESS_SLACK  # admissible up to round-off
    if admissible(1.0):
        return 1.0
    lo, hi = 1.0, float(k)
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if admissible(mid) else (mid, hi)
    return hi


@pytest.mark.parametrize("k", [2, 3, 7])
@pytest.mark.parametrize("pair", range(len(PAIRS)))
def test_kseq_rho_residual_nonnegative_and_normalised(k, pair):
    p, q = PAIRS[pair]
    rho = optimal_rho(p, q, k)
    assert 1.0 <= rho <= k
    assert math.isclose(rho, _brute_force_rho(p, q, k), rel_tol=1e-9)
    accepted = torch.minimum(q, p / rho)
    beta = float(accepted.sum())
    assert rho * beta - (1 - (1 - beta) ** k) >= -EXCESS_SLACK  # admissible
    if rho > 1:  # and the smallest such rho
        smaller = rho * (1 - 1e-9)
        beta_s = float(torch.minimum(q, p / smaller).sum())
        assert smaller * beta_s - (1 - (1 - beta_s) ** k) < -EXCESS_SLACK
    scale = (1 - (1 - beta) ** k) / beta if beta > 0 else 0.0
    unnormalised = p - accepted * scale
    assert float(unnormalised.min()) >= -TOL
    assert math.isclose(float(unnormalised.sum()), (1 - beta) ** k, abs_tol=TOL)
    residual = kseq_residual(p, q, rho, k)
    assert torch.isfinite(residual).all() and float(residual.min()) >= 0
    assert math.isclose(float(residual.sum()), 1.0, abs_tol=TOL)
    # accepted mass + rejected mass * residual law = p
    assert torch.allclose(accepted * scale + (1 - beta) ** k * residual, p, atol=TOL, rtol=0)


def test_kseq_rho_is_one_for_a_single_survivor_and_for_equal_or_disjoint_laws():
    p, q = PAIRS[0]
    assert optimal_rho(p, q, 1) == 1.0
    assert optimal_rho(p, p.clone(), 5) == 1.0
    half, rest = PAIRS[7]
    assert optimal_rho(half, rest, 3) == 1.0


@pytest.mark.parametrize("w", [0.0, 0.3, 0.999, 1.0])
@pytest.mark.parametrize("pair", range(len(PAIRS)))
def test_block_verification_residual(w, pair):
    """w p = min(w p, q) + Z norm((w p - q)+) with Z = sum (w p - q)+, and h = Z / (Z + 1 - w)."""
    p, q = PAIRS[pair]
    V = p.numel()
    other = torch.full((V,), 1.0 / V, dtype=torch.float64)
    segment = BlockSegment(torch.stack([other, p]), torch.stack([other, q]), torch.tensor([0, 0]))
    segment.weights = [1.0, w, w]  # pin w_1 to exercise the residual at position 1
    z = float((w * p - q).clamp_min(0).sum())
    correction = segment.correction(1)
    assert torch.isfinite(correction).all() and math.isclose(float(correction.sum()), 1.0, abs_tol=TOL)
    if z > 0:
        assert torch.allclose(torch.minimum(w * p, q) + z * correction, w * p, atol=TOL, rtol=0)
    h = segment.stop_probabilities()[1]
    expected_h = 1.0 if w == 1.0 else z / (z + 1 - w)
    assert math.isclose(h, expected_h, abs_tol=TOL)


@pytest.mark.parametrize("L", [2, 3])
def test_block_verification_mean_accepted_is_sum_of_expected_weights(toys, L):
    """E[tau] = sum_i E_q[p_i] (Sun et al.): the law's mean equals the clipped weights' expectation."""
    target, draft = toys[0]
    expected = 0.0
    for sequence in itertools.product(range(target.vocab_size), repeat=L):
        ratios, context = [], ()
        for token in sequence:
            ratios.append(float(target.probs(context)[token] / draft.probs(context)[token]))
            context += (token,)
        expected += draft.sequence_prob((), sequence) * sum(clipped_weights(ratios)[1:])
    assert math.isclose(exact_mean_accepted(get_verifier("bv"), target, draft, 1, L), expected, rel_tol=1e-12)


@pytest.mark.parametrize("rule, K", [("sd", 1), ("bv", 1), ("spectr", 3), ("rbv", 3)])
@pytest.mark.parametrize("pair", range(len(PAIRS)))
def test_samplers_survive_edge_cases(rule, K, pair):
    """Zeros, p = q, disjoint supports, one-hot rows: the sampler emits valid tokens of positive law."""
    p, q = PAIRS[pair]
    V = p.numel()
    g = torch.Generator().manual_seed(pair)
    draft_probs = q.expand(K, 2, V)
    target_probs = torch.stack([p, q, p]).expand(K, 3, V)  # the second target row is q itself
    verifier = get_verifier(rule)
    for _ in range(10):
        tokens = torch.multinomial(q, 2 * K, replacement=True, generator=g).view(K, 2)
        law = law_dict(verifier.law(tokens, draft_probs, target_probs))
        result = verifier(tokens, draft_probs, target_probs, generator=g)
        assert law.get(tuple(result.tokens.tolist()), 0.0) > 0
