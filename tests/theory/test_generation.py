"""Whole-generation efficiency (tokens per target call), exact, against closed forms and Monte Carlo."""

from __future__ import annotations

import math

import pytest
import torch

from spectr_repro.theory.bounds import gbv_value
from spectr_repro.theory.generation import calls_law, generation_efficiency
from spectr_repro.theory.toy import block_tensors, sample_drafts, toy_pair
from spectr_repro.verify import get_verifier


@pytest.mark.parametrize("rule", ["bv", "gbv", "sd"])
def test_draft_equal_to_target_accepts_whole_blocks(rule):
    target, draft = toy_pair(2, 0, draft_noise=0.0)
    for N, L in [(1, 2), (4, 2), (5, 3)]:
        result = generation_efficiency(rule, target, draft, 1, L, N)
        assert result.expected_calls == pytest.approx(math.ceil(N / (L + 1)), abs=1e-12)
        assert result.first_iteration_accepted == pytest.approx(L, abs=1e-12)


def test_calls_law_is_a_distribution_and_first_iteration_matches_gbv_value():
    target, draft = toy_pair(2, 0)
    law, _ = calls_law(get_verifier("gbv"), target, draft, 1, 2, 4)
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)
    assert min(law) >= 2 and max(law) <= 4  # at most 3 tokens per call, at least 1
    result = generation_efficiency("gbv", target, draft, 1, 2, 4)
    assert result.first_iteration_accepted == pytest.approx(gbv_value(target, draft, 2), abs=1e-9)


def test_expected_calls_match_monte_carlo():
    # The exact E[C_N] for gbv (carry-over state threaded) against the real sampler: 2000 generations,
    # |difference| < 4 standard errors (false alarm ~6e-5), fixed seed.
    target, draft = toy_pair(2, 0)
    K, L, N, runs = 1, 2, 4, 2000
    exact = generation_efficiency("gbv", target, draft, K, L, N).expected_calls
    verifier = get_verifier("gbv")
    generator = torch.Generator().manual_seed(0)
    calls = []
    for _ in range(runs):
        ctx, state, count = (), None, 0
        while len(ctx) < N:
            tokens = sample_drafts(draft, ctx, K, L, generator)
            result = verifier(
                tokens, *block_tensors(target, draft, ctx, tokens), generator=generator, state=state
            )
            ctx, state, count = ctx + tuple(result.tokens.tolist()), result.state, count + 1
        calls.append(count)
    mean = sum(calls) / runs
    se = (sum((c - mean) ** 2 for c in calls) / (runs - 1) / runs) ** 0.5
    assert abs(mean - exact) < 4 * se


def test_rejects_bad_n():
    target, draft = toy_pair(2, 0)
    with pytest.raises(ValueError):
        generation_efficiency("bv", target, draft, 1, 2, 0)
