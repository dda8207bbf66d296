"""SD (token-level speculative decoding): exact and Monte-Carlo losslessness, sampler = law, contract."""

from __future__ import annotations

import pytest
import torch

from spectr_repro.toy import block_tensors, toy_pair
from spectr_repro.verify import get_verifier

from .conftest import (
    ALPHA,
    EXACT_TV,
    assert_contract,
    assert_draft_equal_target_accepts_all,
    assert_greedy_is_argmax,
    contract_inputs,
    exact_tv,
    fixed_drafts,
    monte_carlo_check,
    sampler_check,
)


@pytest.mark.parametrize("toy_index", [0, 1, 2])
def test_exact_law_of_three_tokens_is_the_target(toys, toy_index):
    assert exact_tv(get_verifier("sd"), toys[toy_index], K=1, L=2) < EXACT_TV


def test_exact_law_longer_block_and_larger_vocabulary():
    assert exact_tv(get_verifier("sd"), toy_pair(vocab_size=4, seed=5), K=1, L=3, n=3) < EXACT_TV


def test_sampler_matches_its_exact_law(toys):
    # Single iteration on fixed drafts: ~10 outcomes, 3000 draws; a lossless sampler/law pair gives
    # p > 1e-4 except with probability 1e-4 (fixed seed, so deterministic).
    target, draft = toys[0]
    tokens = fixed_drafts(1)
    check = sampler_check(get_verifier("sd"), tokens, *block_tensors(target, draft, (), tokens), 3000, seed=0)
    assert check.p_value > ALPHA, check


def test_monte_carlo_joint_law(mc_toy):
    check = monte_carlo_check(get_verifier("sd"), mc_toy, K=1)
    assert check.p_value > ALPHA and check.tv < 3 * check.expected_tv, check


def test_one_hot_distributions_emit_the_target_argmax(toys):
    assert_greedy_is_argmax(get_verifier("sd"), toys[1], K=1)


def test_draft_equal_to_target_accepts_every_block(toys):
    assert_draft_equal_target_accepts_all(get_verifier("sd"), toys[2], K=1)


def test_contract():
    assert_contract("sd", K=1)


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
