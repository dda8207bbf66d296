"""HSD in the shared-block replay: evaluated like bv and gbv (K = 1 on each disjoint row of the block), by its
closed form ("exact"), which equals the mean of its exact law on the same sub-blocks."""

from __future__ import annotations

import pytest
import torch

from spectr_repro.replay import block_estimates, grid
from spectr_repro.theory.toy import block_tensors, sample_drafts, toy_pair


def _block(K_max: int, L_max: int, seed: int):
    target, draft = toy_pair(vocab_size=4, seed=seed)
    tokens = sample_drafts(draft, (), K_max, L_max, torch.Generator().manual_seed(seed))
    return (tokens, *block_tensors(target, draft, (), tokens))


def test_hsd_is_replayed_at_K1_only_like_the_single_draft_rules():
    assert grid(["hsd", "bv"], [1, 3], [2, 4]) == [("hsd", 1, 2), ("hsd", 1, 4), ("bv", 1, 2), ("bv", 1, 4)]


@pytest.mark.parametrize("seed", [0, 1])
def test_replay_value_is_exact_and_equals_the_law_on_a_small_block(seed):
    block = _block(K_max=3, L_max=3, seed=seed)
    methods, Ks, Ls = ["hsd", "bv"], [1, 2], [1, 2, 3]
    auto = {(e.method, e.K, e.L): e for e in block_estimates(*block, methods, Ks, Ls, draws=1)}
    law = {(e.method, e.K, e.L): e for e in block_estimates(*block, methods, Ks, Ls, draws=1, mode="law")}
    assert {key for key in auto if key[0] == "hsd"} == {("hsd", 1, L) for L in Ls}
    for key, estimate in auto.items():
        assert estimate.estimator == "exact" and not estimate.first_iteration
        assert estimate.tokens == pytest.approx(law[key].tokens, abs=1e-12), key
    # L = 1: HSD is SD, hence BV; above it the joint last test accepts at least as much as BV
    assert auto[("hsd", 1, 1)].tokens == pytest.approx(auto[("bv", 1, 1)].tokens, abs=1e-12)
    assert all(auto[("hsd", 1, L)].tokens >= auto[("bv", 1, L)].tokens - 1e-12 for L in Ls)
