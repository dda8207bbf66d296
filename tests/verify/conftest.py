"""Fixtures of the verification-rule tests: the seeded toys (helpers are in verify_helpers.py)."""

from __future__ import annotations

import pytest

from spectr_repro.theory.toy import standard_toys, toy_pair


@pytest.fixture(scope="session")
def toys():
    """Three seeded (target, draft) pairs, V = 3 (exact-law tests)."""
    return standard_toys(3, 3)


@pytest.fixture(scope="session")
def mc_toy():
    """The Monte-Carlo toy: V = 3, a draft far from the target (80 % independent noise), so that about
    a third of the tokens are corrections and a wrong correction law is visible at MC_SAMPLES draws."""
    return toy_pair(vocab_size=3, seed=0, draft_noise=0.8)
