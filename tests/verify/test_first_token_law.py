"""``Verifier.first_token_law``: the exact law of the first emitted token given the drafts (what ``bias`` uses to
estimate a rule's first-token law on real models) equals the first-token marginal of the rule's own ``.law()`` on
every draft tuple of toys, and rules without a closed form say so (None) instead of answering wrongly."""

from __future__ import annotations

import pytest
import torch

from spectr_repro.theory.toy import block_tensors, draft_tuples, sample_drafts, toy_pair
from spectr_repro.verify import VERIFIERS, get_verifier


def first_token_marginal(outcomes, V: int) -> torch.Tensor:
    law = torch.zeros(V, dtype=torch.float64)
    for outcome in outcomes:
        law[outcome.tokens[0]] += outcome.probability
    return law


def law_from(first, draft_tokens: torch.Tensor, V: int) -> torch.Tensor:
    law = first.residual_weight * first.residual.cpu().double()
    return law.index_add(0, draft_tokens[:, 0].cpu().long(), first.draft_weights.cpu())


CASES = [("spectr_gbv", 2, 3, 2, 1), ("spectr_gbv", 3, 3, 2, 0), ("spectr_gbv", 2, 2, 3, 1), ("sbv", 2, 3, 2, 0),
         ("sbv", 3, 2, 2, 2), ("sbv", 2, 2, 3, 1)]


@pytest.mark.parametrize("method,K,V,L,seed", CASES)
def test_first_token_law_is_the_marginal_of_the_rules_law(method, K, V, L, seed):
    target, draft = toy_pair(V, seed=seed)
    verifier = get_verifier(method)
    worst, count = 0.0, 0
    for _, tokens in draft_tuples(draft, (), K, L):
        draft_probs, target_probs = block_tensors(target, draft, (), tokens)
        expected = first_token_marginal(verifier.law(tokens, draft_probs, target_probs), V)
        first = verifier.first_token_law(tokens, draft_probs, target_probs)
        got = law_from(first, tokens, V)
        assert abs(float(first.residual.sum()) - 1) < 1e-12
        worst = max(worst, float((got - expected).abs().max()))
        count += 1
    assert count == V ** (K * L)
    assert worst < 1e-10


def test_the_release_first_token_law_is_not_the_targets():
    """Integrated over the drafts, the release's first-token law is the biased 0.489 of the toy (p: 0.373), the
    number ``theory.exact.rule_law`` gives; sbv's integrates to p (the same check, which can fail, passes)."""
    target, draft = toy_pair(2, seed=1)
    p = target.probs(())
    for method, expected_first in (("spectr_gbv", 0.489), ("sbv", float(p[0]))):
        verifier = get_verifier(method)
        total = torch.zeros(2, dtype=torch.float64)
        for prob, tokens in draft_tuples(draft, (), 2, 3):
            draft_probs, target_probs = block_tensors(target, draft, (), tokens)
            total += prob * law_from(verifier.first_token_law(tokens, draft_probs, target_probs), tokens, 2)
        assert float(total[0]) == pytest.approx(expected_first, abs=5e-4), method


def test_rules_without_a_closed_form_return_none_not_a_wrong_law():
    """sbvf's fallback changes what follows a stop at depth 0: it must not inherit SBV's law."""
    target, draft = toy_pair(2, seed=1)
    _, tokens = next(iter(draft_tuples(draft, (), 2, 2)))
    draft_probs, target_probs = block_tensors(target, draft, (), tokens)
    assert get_verifier("sbvf").first_token_law(tokens, draft_probs, target_probs) is None
    with_law = set()
    for name, spec in VERIFIERS.items():
        width = 1 if spec.single_draft else 2
        if get_verifier(name).first_token_law(tokens[:width], draft_probs[:width], target_probs[:width]) is not None:
            with_law.add(name)
    assert with_law == {"spectr_gbv", "sbv"}


@pytest.mark.parametrize("method", ["spectr_gbv", "sbv"])
def test_first_token_law_matches_the_samplers_frequencies_on_a_large_vocabulary(method):
    """V = 300 (past sbv's toy path, V <= 64, so the batched rules of real models run): the exact law given one
    block against 3,000 calls of the rule's own sampler on it. Each token's frequency lies within 4.5 binomial
    standard errors of its law (a false failure ~1e-5 per token); a law off by 0.05 at its top token would not."""
    target, draft = toy_pair(300, seed=3)
    generator = torch.Generator().manual_seed(4)
    tokens = sample_drafts(draft, (), 3, 3, generator)
    draft_probs, target_probs = block_tensors(target, draft, (), tokens)
    verifier = get_verifier(method)
    law = law_from(verifier.first_token_law(tokens, draft_probs, target_probs), tokens, 300)
    calls = 3000
    firsts = torch.tensor([int(verifier(tokens, draft_probs, target_probs, generator=generator).tokens[0])
                           for _ in range(calls)])
    frequency = torch.bincount(firsts, minlength=300).double() / calls
    error = (law * (1 - law) / calls).sqrt()
    assert bool(((frequency - law).abs() <= 4.5 * error + 1e-12).all())
    top = int(law.argmax())
    assert abs(float(frequency[top]) - (float(law[top]) - 0.05)) > 4.5 * float(error[top])  # the test has power
