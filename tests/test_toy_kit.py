"""The test kit itself: exact laws, Monte-Carlo driver and the chi-square checker.

A rule that ignores the drafts and samples one token from p ("AR as a verifier") is lossless by
construction, and one that always emits the draft's first token is not: the kit must tell them apart.
"""

import math

import pytest
import torch

from spectr_repro.sampling import sample
from spectr_repro.theory.lawcheck import chi_square_test, total_variation
from spectr_repro.theory.toy import (
    block_tensors,
    draft_tuples,
    exact_decoded_law,
    sample_decoded,
    target_law,
    toy_pair,
)
from spectr_repro.verify.base import Outcome, Verifier, VerifyResult


class TargetOnly(Verifier):
    name = "target_only"
    lossless = True

    def _sample(self, draft_tokens, draft_probs, target_probs, generator, state):
        token = sample(target_probs[0, 0], generator)
        return VerifyResult(token.view(1), 0, 0, None)

    def _law(self, draft_tokens, draft_probs, target_probs, state):
        return [Outcome(float(p), (v,)) for v, p in enumerate(target_probs[0, 0].tolist())]


class FirstDraftToken(Verifier):
    """Emits the first draft token unconditionally: its law is q, not p."""

    name = "first_draft_token"

    def _sample(self, draft_tokens, draft_probs, target_probs, generator, state):
        return VerifyResult(draft_tokens[0, :1].clone(), 0, 0, None)

    def _law(self, draft_tokens, draft_probs, target_probs, state):
        return [Outcome(1.0, (int(draft_tokens[0, 0]),))]


def test_toy_conditionals_depend_on_context_and_are_normalised():
    target, draft = toy_pair(vocab_size=4, seed=1)
    a, b = target.probs((0,)), target.probs((1, 0))
    assert not torch.allclose(a, b)
    assert torch.allclose(target.probs((0,)), a)  # deterministic
    for ctx in [(), (3,), (2, 2, 1)]:
        assert abs(float(draft.probs(ctx).sum()) - 1) < 1e-12 and float(draft.probs(ctx).min()) > 0


def test_draft_tuples_form_a_distribution():
    _, draft = toy_pair(vocab_size=3, seed=0)
    tuples = draft_tuples(draft, (1,), K=2, L=2)
    assert len(tuples) == 3**4
    assert math.isclose(sum(p for p, _ in tuples), 1.0, rel_tol=1e-12)
    dp, tp = block_tensors(*toy_pair(3, 0), (1,), tuples[5][1])
    assert dp.shape == (2, 2, 3) and tp.shape == (2, 3, 3)


def test_exact_law_separates_lossless_from_biased():
    target, draft = toy_pair(vocab_size=3, seed=2)
    reference = target_law(target, 3)
    assert math.isclose(sum(reference.values()), 1.0, rel_tol=1e-12)
    good = exact_decoded_law(TargetOnly(), target, draft, K=2, L=2, n=3)
    bad = exact_decoded_law(FirstDraftToken(), target, draft, K=1, L=2, n=3)
    assert total_variation(good, reference) < 1e-12
    assert total_variation(bad, reference) > 0.05


def test_monte_carlo_check_has_power():
    # 3000 samples of a 9-bin law: sampling TV is ~0.02; q differs from p by TV ~0.1 per token, so
    # the biased rule's p-value is astronomically small while the lossless one passes at 1e-4.
    target, draft = toy_pair(vocab_size=3, seed=3)
    reference = target_law(target, 2)
    good = chi_square_test(sample_decoded(TargetOnly(), target, draft, 1, 2, 2, 3000, seed=0), reference)
    bad = chi_square_test(sample_decoded(FirstDraftToken(), target, draft, 1, 2, 2, 3000, seed=0), reference)
    assert good.p_value > 1e-4 and good.tv < 4 * good.expected_tv
    assert bad.p_value < 1e-6


def test_chi_square_rejects_impossible_outcomes_and_merges_small_bins():
    law = {(0,): 0.98, (1,): 0.01, (2,): 0.01}
    assert chi_square_test({(3,): 1, (0,): 9}, law).p_value == 0.0
    # expected counts 50, 40, 5, 3, 2: the two smallest (< 5) pool together -> 4 bins, 3 dof
    law = {(0,): 0.5, (1,): 0.4, (2,): 0.05, (3,): 0.03, (4,): 0.02}
    check = chi_square_test({(0,): 50, (1,): 40, (2,): 5, (3,): 3, (4,): 2}, law)
    assert check.dof == 3 and check.p_value > 0.99
    with pytest.raises(ValueError):
        chi_square_test({}, law)


def test_sample_matches_its_law_and_never_draws_zero_mass():
    from scipy import stats

    from spectr_repro.sampling import sample

    probs = torch.tensor([[0.0, 0.5, 0.2, 0.0, 0.3], [0.25, 0.25, 0.25, 0.25, 0.0]], dtype=torch.float64)
    draws = sample(probs.expand(4000, 2, 5), torch.Generator().manual_seed(0))
    assert draws.shape == (4000, 2)
    for row in range(2):
        counts = torch.bincount(draws[:, row], minlength=5)
        assert int(counts[probs[row] == 0].sum()) == 0
        expected = probs[row][probs[row] > 0] * 4000
        # p > 1e-4 for the right law (4000 draws, fixed seed); the same check rejects a 40/20/20/20 law
        assert stats.chisquare(counts[probs[row] > 0].double(), expected).pvalue > 1e-4
    observed = torch.bincount(draws[:, 1], minlength=5)[:4].double()
    wrong = stats.chisquare(observed, torch.tensor([1600.0, 800.0, 800.0, 800.0]))
    assert wrong.pvalue < 1e-6
    with pytest.raises(ValueError):
        sample(torch.zeros(3))
