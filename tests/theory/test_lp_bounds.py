"""The LP limit and the closed-form bounds, against exact rule laws and brute force."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from spectr_repro.theory.bounds import gbv_value, paper_bound
from spectr_repro.theory.exact import rule_expected_accepted
from spectr_repro.theory.lp import draft_set_weights, optimal_expected_accepted, optimal_expected_accepted_nodes
from spectr_repro.theory.structure import myopic_selection_limit
from spectr_repro.theory.toy import toy_pair
from spectr_repro.theory.validity import check_validity

TOYS = [(2, 2, 0), (3, 2, 1), (2, 3, 2), (3, 2, 3)]  # (V, L, seed)


@pytest.mark.parametrize("V,L,seed", TOYS)
def test_lp_at_k1_equals_block_verification(V, L, seed):
    # BV is optimal among single-draft rules used as is (ICLR 2025); the LP must find exactly that value.
    target, draft = toy_pair(V, seed)
    lp = optimal_expected_accepted(target, draft, 1, L)
    assert lp.value == pytest.approx(rule_expected_accepted("bv", target, draft, 1, L), abs=1e-6)
    # ... and strictly less than GBV's per-iteration value, which no valid-as-is rule reaches.
    assert lp.value < gbv_value(target, draft, L) - 1e-4


@pytest.mark.parametrize("V,L,seed", TOYS[:2])
def test_lp_law_is_valid_and_grows_with_k(V, L, seed):
    target, draft = toy_pair(V, seed)
    values = []
    for K in (1, 2, 3):
        lp = optimal_expected_accepted(target, draft, K, L)
        report = check_validity(lp.law, target, L, tolerance=1e-7)
        assert report.valid, report.reason
        assert lp.value == pytest.approx(sum(p * (len(z) - 1) for z, p in lp.law.items()), abs=1e-7)
        values.append(lp.value)
    assert values[0] < values[1] < values[2] <= L + 1e-7


def test_draft_set_weights_match_tuple_enumeration():
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(4))
    K = 3
    sets, weights = draft_set_weights(probs, K)
    brute: dict[tuple[int, ...], float] = {}
    for combo in itertools.product(range(4), repeat=K):
        key = tuple(sorted(set(combo)))
        brute[key] = brute.get(key, 0.0) + math.prod(probs[list(combo)])
    assert dict(zip(sets, weights.tolist())) == pytest.approx(brute, abs=1e-15)
    assert weights.sum() == pytest.approx(1.0, abs=1e-14)


def test_lp_rejects_bad_sizes():
    target, draft = toy_pair(2, 0)
    with pytest.raises(ValueError):
        optimal_expected_accepted(target, draft, 0, 2)


def _brute_force_bound(target, draft, K, L):
    total = 0.0
    for i in range(1, L + 1):
        for prefix in itertools.product(range(target.vocab_size), repeat=i):
            P, Q = target.sequence_prob((), prefix), draft.sequence_prob((), prefix)
            total += P * (1 - (1 - min(1.0, Q / P)) ** K)
    return total


@pytest.mark.parametrize("V,L,seed", TOYS[:3])
def test_paper_bound_and_gbv_value(V, L, seed):
    target, draft = toy_pair(V, seed)
    for K in (1, 2, 3):
        brute = _brute_force_bound(target, draft, K, L)
        assert paper_bound(target, draft, K, L) == pytest.approx(brute, abs=1e-12)
    # K = 1: the bound is GBV's value sum min(P, Q), which the gbv rule's first iteration reaches exactly.
    assert paper_bound(target, draft, 1, L) == pytest.approx(gbv_value(target, draft, L), abs=1e-12)
    gbv_first_iteration = rule_expected_accepted("gbv", target, draft, 1, L)
    assert gbv_first_iteration == pytest.approx(gbv_value(target, draft, L), abs=1e-9)
    # Increasing in K, to L as K grows (the draft has full support).
    bounds = [paper_bound(target, draft, K, L) for K in (1, 2, 4, 256)]
    assert all(a < b for a, b in zip(bounds, bounds[1:]))
    assert bounds[-1] == pytest.approx(L, abs=1e-6)


def test_paper_bound_is_not_an_upper_limit_for_valid_rules():
    # Finding reported in THEORY.md: at K = 2 the LP limit of valid rules exceeds the paper's bound.
    target, draft = toy_pair(3, 0)
    assert optimal_expected_accepted(target, draft, 2, 2).value > paper_bound(target, draft, 2, 2) + 1e-3


# ------------------------------------------------------------------------------------------------ node LP
@pytest.mark.parametrize("V,L,K,seed", [(2, 2, 2, 0), (3, 2, 2, 1), (2, 3, 3, 2), (3, 2, 3, 3), (4, 2, 2, 4),
                                        (3, 2, 1, 5)])
def test_node_lp_equals_the_draft_set_lp(V, L, K, seed):
    """The node formulation (one variable per node, antichain cuts) has the draft-set LP's optimum, and the
    law it returns is valid with E[tau] equal to its value."""
    target, draft = toy_pair(V, seed)
    nodes = optimal_expected_accepted_nodes(target, draft, K, L)
    sets = optimal_expected_accepted(target, draft, K, L)
    assert nodes.value == pytest.approx(sets.value, abs=1e-8)
    report = check_validity(nodes.law, target, L, tolerance=1e-8)
    assert report.valid, report.reason
    assert nodes.value == pytest.approx(sum(p * (len(z) - 1) for z, p in nodes.law.items()), abs=1e-9)


def test_node_lp_respects_every_antichain_capacity():
    """Brute force over every antichain of a small tree: nu(B) <= 1 - (1 - Q(B))^K at the optimum."""
    target, draft = toy_pair(2, 0)
    K, L = 2, 3
    result = optimal_expected_accepted_nodes(target, draft, K, L)

    def antichains(prefix):
        """Every antichain of the subtree strictly below ``prefix`` (the empty one included)."""
        if len(prefix) == L:
            return [[]]
        out = [[]]
        for x in range(2):
            child = prefix + (x,)
            options = [[child]] + antichains(child)
            out = [a + b for a in out for b in options]
        return out

    worst = max(sum(result.nu[w] for w in group) - (1 - (1 - sum(draft.sequence_prob((), w) for w in group)) ** K)
                for group in antichains(()) if group)
    assert worst < 1e-9
    assert result.num_cuts > 0  # this toy needs antichain constraints beyond single nodes (3 cuts)


def test_node_lp_at_k1_is_block_verification():
    target, draft = toy_pair(3, 1)
    assert optimal_expected_accepted_nodes(target, draft, 1, 2).value == pytest.approx(
        rule_expected_accepted("bv", target, draft, 1, 2), abs=1e-9)


# ------------------------------------------------------------------------------------------------ myopic limit
@pytest.mark.parametrize("V,L,K,seed", [(2, 2, 2, 2), (3, 2, 2, 1), (2, 3, 2, 1)])
def test_myopic_selection_limit_sits_between_sbv_and_the_lp(V, L, K, seed):
    """SBV is a depth-by-depth selection + BV, so it cannot beat the myopic limit, which cannot beat the LP;
    on these toys both gaps are strict (the LP's optimum looks at later tokens when it picks a token)."""
    target, draft = toy_pair(V, seed)
    myopic = myopic_selection_limit(target, draft, K, L)
    sbv = rule_expected_accepted("sbv", target, draft, K, L)
    lp = optimal_expected_accepted_nodes(target, draft, K, L).value
    assert sbv <= myopic + 1e-9 and myopic <= lp + 1e-9
    assert myopic < lp - 1e-3, (myopic, lp)


def test_myopic_selection_limit_is_the_lp_for_one_position():
    """With L = 1 there is nothing later to look at: the myopic limit is the LP limit."""
    target, draft = toy_pair(4, 3)
    assert myopic_selection_limit(target, draft, 3, 1) == pytest.approx(
        optimal_expected_accepted_nodes(target, draft, 3, 1).value, abs=1e-8)
