"""Exact per-iteration laws of the rules against the validity check and the LP limit."""

from __future__ import annotations

import itertools

import pytest

from spectr_repro.theory.exact import expected_accepted_length, rule_law
from spectr_repro.theory.lp import optimal_expected_accepted
from spectr_repro.theory.toy import toy_pair
from spectr_repro.theory.validity import check_validity
from spectr_repro.verify import VERIFIERS

# Rules the harness uses as is (no carried state) and calls lossless.
AS_IS_LOSSLESS = [name for name, spec in VERIFIERS.items() if spec.lossless and name != "gbv"]
CASES = [(2, 2, 0, 1), (2, 2, 0, 2), (2, 2, 0, 3), (3, 2, 1, 1), (3, 2, 1, 2)]  # (V, L, seed, K)


@pytest.fixture(scope="module")
def lp_values():
    cache = {}

    def get(V, L, seed, K):
        if (V, L, seed, K) not in cache:
            target, draft = toy_pair(V, seed)
            cache[V, L, seed, K] = optimal_expected_accepted(target, draft, K, L).value
        return cache[V, L, seed, K]

    return get


def test_as_is_lossless_rules_are_the_expected_ones():
    assert {"sd", "spectr", "bv", "rbv", "sbv"} <= set(AS_IS_LOSSLESS)


@pytest.mark.parametrize("V,L,seed,K", CASES)
@pytest.mark.parametrize("rule", AS_IS_LOSSLESS)
def test_lossless_rule_is_valid_and_below_lp(rule, V, L, seed, K, lp_values):
    if VERIFIERS[rule].single_draft and K != 1:
        pytest.skip("single-draft rule")
    target, draft = toy_pair(V, seed)
    law = rule_law(rule, target, draft, K, L)
    report = check_validity(law, target, L)
    assert report.valid, f"{rule}: {report.reason}"
    assert expected_accepted_length(law) <= lp_values(V, L, seed, K) + 1e-7


def test_validity_rejects_gbv_without_carry_over():
    target, draft = toy_pair(3, 0)
    report = check_validity(rule_law("gbv", target, draft, 1, 2, carry_over=False), target, 2)
    assert not report.valid
    assert report.min_residual < -1e-3  # a clear violation, not round-off


def test_validity_rejects_released_spectr_gbv_at_k2():
    target, draft = toy_pair(3, 0)
    assert not check_validity(rule_law("spectr_gbv", target, draft, 2, 2), target, 2).valid


def test_validity_negative_controls():
    target, draft = toy_pair(3, 1)
    law = rule_law("bv", target, draft, 1, 2)
    assert check_validity(law, target, 2).valid
    # Move a little mass from one output to another of the same length: some R goes negative.
    keys = sorted(k for k in law if len(k) == 3)
    moved = dict(law)
    moved[keys[0]] -= 1e-4
    moved[keys[1]] += 1e-4
    assert not check_validity(moved, target, 2).valid
    # Always emitting L+1 tokens of the DRAFT's law: mass in the wrong places.
    words = list(itertools.product(range(3), repeat=3))
    draft_only = {w: draft.sequence_prob((), w) for w in words}
    assert not check_validity(draft_only, target, 2).valid
    # Outputs longer than L+1 are rejected outright.
    assert not check_validity({(0, 0, 0, 0): 1.0}, target, 2).valid


def test_validity_positive_controls():
    target, _ = toy_pair(3, 1)
    # Autoregressive decoding (emit one token from p) and "emit L+1 tokens from p" are both valid.
    ar = {(x,): float(target.probs(())[x]) for x in range(3)}
    assert check_validity(ar, target, 2).valid
    full = {w: target.sequence_prob((), w) for w in itertools.product(range(3), repeat=3)}
    assert check_validity(full, target, 2).valid


def test_rbv_at_least_bv_and_non_decreasing_in_k():
    for V, L, seed in [(2, 2, 0), (3, 2, 1), (2, 3, 2)]:
        target, draft = toy_pair(V, seed)
        bv = expected_accepted_length(rule_law("bv", target, draft, 1, L))
        rbv = [expected_accepted_length(rule_law("rbv", target, draft, K, L)) for K in (1, 2, 3)]
        assert rbv[0] == pytest.approx(bv, abs=1e-12)  # K = 1 is exactly BV
        assert rbv[0] <= rbv[1] + 1e-12 <= rbv[2] + 2e-12
        assert rbv[2] > bv  # strictly better with more drafts on these toys
