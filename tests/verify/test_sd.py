"""SD (token-level speculative decoding), what is its own: a longer block and vocabulary, one draft only,
seeds. Losslessness (exact and Monte-Carlo), sampler = law and the contract: test_registry_contract.py."""

from __future__ import annotations

import pytest
import torch

from spectr_repro.theory.toy import block_tensors, toy_pair
from spectr_repro.verify import get_verifier
from tests.verify.verify_helpers import (
    EXACT_TV,
    contract_inputs,
    exact_tv,
    fixed_drafts,
)


def test_exact_law_longer_block_and_larger_vocabulary():
    assert exact_tv(get_verifier("sd"), toy_pair(vocab_size=4, seed=5), K=1, L=3, n=3) < EXACT_TV


def test_rejects_more_than_one_draft():
    tokens, q, p = contract_inputs(K=2)
    with pytest.raises(ValueError, match="single draft"):
        get_verifier("sd")(tokens, q, p)


def test_same_seed_same_result(toys):
    target, draft = toys[0]
    tokens = fixed_drafts(1)
    q, p = block_tensors(target, draft, (), tokens)
    verifier = get_verifier("sd")
    def run(seed):
        return verifier(tokens, q, p, generator=torch.Generator().manual_seed(seed)).tokens.tolist()

    runs = [[run(seed) for seed in range(20)] for _ in range(2)]
    assert runs[0] == runs[1] and len({tuple(r) for r in runs[0]}) > 1
