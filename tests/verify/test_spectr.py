"""SpecTr (K-SEQ per depth), what is its own: reduction to SD at K = 1, growth with K, the survivor
bookkeeping. Losslessness for K = 1, 2, 3, sampler = law and the contract: test_registry_contract.py."""

from __future__ import annotations

import torch

from spectr_repro.verify import get_verifier
from tests.verify.verify_helpers import (
    ALPHA,
    exact_mean_accepted,
    law_dict,
    sampler_check,
)


def test_mean_accepted_length_grows_with_drafts(toys):
    target, draft = toys[0]
    lengths = [exact_mean_accepted(get_verifier("spectr"), target, draft, K, 2) for K in (1, 2, 3)]
    assert lengths[0] < lengths[1] < lengths[2], lengths


def test_duplicate_drafts_change_nothing_when_the_first_is_accepted():
    """Identical drafts: rho* is computed for k survivors, the survivors all continue together."""
    V = 3
    q = torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.2, 0.6]], dtype=torch.float64)
    p = torch.tensor([[0.2, 0.3, 0.5], [0.3, 0.3, 0.4], [0.1, 0.1, 0.8]], dtype=torch.float64)
    tokens = torch.tensor([[0, 2], [0, 2]])
    law = law_dict(get_verifier("spectr").law(tokens, q.expand(2, 2, V), p.expand(2, 3, V)))
    assert abs(sum(law.values()) - 1) < 1e-12
    assert all(o[:-1] in {(), (0,), (0, 2)} for o in law)
    check = sampler_check(get_verifier("spectr"), tokens, q.expand(2, 2, V), p.expand(2, 3, V), 1000, seed=5)
    assert check.p_value > ALPHA, check

