"""RBV (recursive block verification), what is its own: K = 1 is BV exactly (law and sampler), the mean
accepted length is non-decreasing in K. Losslessness, sampler = law, contract: test_registry_contract.py."""

from __future__ import annotations

import pytest
import torch

from spectr_repro.theory.lawcheck import total_variation
from spectr_repro.verify import get_verifier
from tests.verify.verify_helpers import (
    ALPHA,
    exact_mean_accepted,
    iteration_inputs,
    law_dict,
    sampler_check,
)


@pytest.mark.parametrize("toy_index", [0, 1, 2])
def test_single_draft_samples_like_bv(toys, toy_index):
    """K = 1 runs the very same scan as BV: identical samples under one seed (the laws: the registry suite's
    K = 1 test, test_registry_contract.py)."""
    rbv, bv = get_verifier("rbv"), get_verifier("bv")
    target, draft = toys[toy_index]
    for _, tokens, dp, tp in iteration_inputs(target, draft, 1, 2, context=(0,)):
        for seed in range(3):
            a = rbv(tokens, dp, tp, generator=torch.Generator().manual_seed(seed))
            b = bv(tokens, dp, tp, generator=torch.Generator().manual_seed(seed))
            assert a.tokens.tolist() == b.tokens.tolist() and a.num_accepted == b.num_accepted


@pytest.mark.parametrize("toy_index", [0, 1, 2])
def test_mean_accepted_length_non_decreasing_in_drafts(toys, toy_index):
    """Exact E[tau]: K = 1 (= BV) <= K = 2 <= K = 3 (K = 3 on one toy only, for time)."""
    target, draft = toys[toy_index]
    Ks = (1, 2, 3) if toy_index == 0 else (1, 2)
    lengths = [exact_mean_accepted(get_verifier("rbv"), target, draft, K, 2) for K in Ks]
    assert all(a <= b + 1e-12 for a, b in zip(lengths, lengths[1:])), lengths
    assert lengths[-1] > lengths[0] + 1e-3, lengths  # extra drafts do help on these toys


def test_skips_drafts_that_leave_the_committed_prefix():
    """p = q at position 1, so draft 1's first token is always committed (w_1 = 1, h_1 = 1); draft 2
    starts with another token and must be skipped: the law is BV's on draft 1 alone."""
    V = 3
    q = torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.2, 0.6]], dtype=torch.float64)
    p = torch.tensor([[0.5, 0.3, 0.2], [0.3, 0.3, 0.4], [0.1, 0.1, 0.8]], dtype=torch.float64)
    tokens = torch.tensor([[0, 2], [1, 1]])
    law = law_dict(get_verifier("rbv").law(tokens, q.expand(2, 2, V), p.expand(2, 3, V)))
    alone = law_dict(get_verifier("bv").law(tokens[:1], q[None], p[None]))
    assert total_variation(law, alone) < 1e-15
    assert all(o[0] == 0 for o in law) and any(len(o) == 2 for o in law)  # corrections do occur
    check = sampler_check(get_verifier("rbv"), tokens, q.expand(2, 2, V), p.expand(2, 3, V), 1000, seed=5)
    assert check.p_value > ALPHA, check

