"""BV (block verification), what is its own: reduction to SD at L = 1, the ordering E[tau] of BV >= E[tau] of SD
(exact), the scan. Losslessness, sampler = law and the contract: test_registry_contract.py."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from spectr_repro.theory.lawcheck import total_variation
from spectr_repro.theory.toy import toy_pair
from spectr_repro.verify import get_verifier
from tests.verify.verify_helpers import (
    ALPHA,
    EXACT_TV,
    contract_inputs,
    exact_mean_accepted,
    exact_tv,
    iteration_inputs,
    law_dict,
    sampler_check,
)


def test_exact_law_longer_block_and_larger_vocabulary():
    assert exact_tv(get_verifier("bv"), toy_pair(vocab_size=4, seed=5), K=1, L=3, n=3) < EXACT_TV


def test_scan_takes_the_largest_passing_position():
    """A block whose weight drops below 1 at every position (w = 0.5, 0.8, 0.24): the law of tau is
    h_i * prod_{m > i} (1 - h_m) with the paper's h, computed here by hand; the sampler agrees."""
    q = torch.tensor([[0.2, 0.4, 0.4], [0.1, 0.2, 0.7], [1 / 3, 1 / 3, 1 / 3]], dtype=torch.float64)
    p = torch.tensor([[0.1, 0.45, 0.45], [0.5, 0.32, 0.18], [0.5, 0.4, 0.1], [0.5, 0.25, 0.25]],
                     dtype=torch.float64)
    tokens = torch.tensor([[0, 1, 2]])
    w = [1.0, 0.5, 0.8, 0.24]
    z = [float((w[i] * p[i] - q[i]).clamp_min(0).sum()) for i in range(3)]
    h = [1.0, z[1] / (z[1] + 1 - w[1]), z[2] / (z[2] + 1 - w[2]), w[3]]
    expected_tau = [h[i] * math.prod(1 - h[m] for m in range(i + 1, 4)) for i in range(4)]
    law = law_dict(get_verifier("bv").law(tokens, q[None], p[None]))
    tau_law = [sum(v for o, v in law.items() if len(o) == i + 1) for i in range(4)]
    assert all(x > 0.05 for x in expected_tau)  # every tau is reachable
    assert max(abs(a - b) for a, b in zip(tau_law, expected_tau)) < 1e-12
    check = sampler_check(get_verifier("bv"), tokens, q[None], p[None], 4000, seed=2)
    assert check.p_value > ALPHA, check


@pytest.mark.parametrize("toy_index", [0, 1, 2])
def test_block_of_one_token_is_sd(toys, toy_index):
    """L = 1: BV's law equals SD's for every draft token (exactly, up to round-off)."""
    bv, sd = get_verifier("bv"), get_verifier("sd")
    target, draft = toys[toy_index]
    for _, tokens, dp, tp in iteration_inputs(target, draft, 1, 1, context=(1,)):
        assert total_variation(law_dict(bv.law(tokens, dp, tp)), law_dict(sd.law(tokens, dp, tp))) < 1e-15


@pytest.mark.parametrize("toy_index, L", [(0, 2), (1, 2), (2, 2), (0, 3)])
def test_mean_accepted_length_at_least_sd(toys, toy_index, L):
    target, draft = toys[toy_index]
    bv = exact_mean_accepted(get_verifier("bv"), target, draft, 1, L)
    sd = exact_mean_accepted(get_verifier("sd"), target, draft, 1, L)
    assert bv >= sd - 1e-12
    assert bv > sd + 1e-4  # strictly better on these toys (the paper's point), not just equal


def test_no_nan_with_zero_target_mass_at_drafted_tokens():
    """p(X_i) = 0 makes the clipped weight 0 for the rest of the block; the law stays a distribution."""
    V = 3
    q = torch.full((1, 2, V), 1 / 3, dtype=torch.float64)
    p = torch.tensor([[[0.0, 0.5, 0.5], [0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]], dtype=torch.float64)
    for tokens in itertools.product(range(V), repeat=2):
        law = law_dict(get_verifier("bv").law(torch.tensor([tokens]), q, p))
        assert abs(sum(law.values()) - 1) < 1e-12 and all(v >= 0 for v in law.values())
        assert all(o[0] != 0 for o in law)  # p(0) = 0 at position 1: token 0 is never emitted first


def test_rejects_more_than_one_draft():
    tokens, q, p = contract_inputs(K=2)
    with pytest.raises(ValueError, match="single draft"):
        get_verifier("bv")(tokens, q, p)
