"""Negative controls: deliberately broken rules that the SAME checkers used on the real rules must reject.

- always accept: emit the whole first draft and a bonus (the law of q, not p);
- correction drawn from p instead of the residual (sd, bv, spectr);
- q taken from other logits than the ones the drafts were sampled from (here: the draft's logits at
  temperature 0.5, i.e. q^2 renormalised, while the tokens came from q), fed to the real sd, bv, spectr, rbv;
- a sampler that disagrees with its own exact law (for the sampler-vs-law cross-check).

A control that passed would mean the corresponding positive test has no power.
"""

from __future__ import annotations

import pytest
import torch

from spectr_repro.theory.toy import block_tensors
from spectr_repro.verify import get_verifier
from spectr_repro.verify.base import Outcome, Verifier, VerifyResult
from spectr_repro.verify.bv import BlockSegment, BlockVerification
from spectr_repro.verify.common import normalize, sample
from spectr_repro.verify.sd import SpeculativeDecoding
from spectr_repro.verify.spectr import SpecTr
from tests.verify.verify_helpers import (
    ALPHA,
    EXACT_TV,
    MC_SAMPLES,
    POWER_ALPHA,
    exact_tv,
    monte_carlo_check,
    sampler_check,
)


class AlwaysAccept(Verifier):
    """Accepts the first draft whole, then a bonus from p: its output law is q's, not p's."""

    name = "always_accept"

    def _sample(self, draft_tokens, draft_probs, target_probs, generator, state):
        L = draft_tokens.shape[1]
        bonus = sample(target_probs[0, L], generator)
        return VerifyResult(torch.cat([draft_tokens[0].long(), bonus.view(1)]), L, 0, None)

    def _law(self, draft_tokens, draft_probs, target_probs, state):
        prefix, L = tuple(draft_tokens[0].tolist()), draft_tokens.shape[1]
        return [Outcome(p, prefix + (y,)) for y, p in enumerate(target_probs[0, L].tolist()) if p > 0]


class SDCorrectionFromP(SpeculativeDecoding):
    name = "sd_correction_from_p"
    lossless = False

    def correction(self, p, q):
        return p


class _PCorrectionSegment(BlockSegment):
    def correction(self, tau):
        return self.target(tau)


class BVCorrectionFromP(BlockVerification):
    name = "bv_correction_from_p"
    lossless = False

    @staticmethod
    def _segment(draft_tokens, draft_probs, target_probs):
        L = draft_tokens.shape[1]
        return _PCorrectionSegment(target_probs[0, :L], draft_probs[0], draft_tokens[0].long())


class SpecTrCorrectionFromP(SpecTr):
    name = "spectr_correction_from_p"
    lossless = False

    def correction(self, p, q, rho, k):
        return p


class WrongLogits(Verifier):
    """Hands the real rule q from other logits (temperature 0.5) than the ones the drafts came from."""

    lossless = False

    def __init__(self, rule: str) -> None:
        super().__init__()
        self.inner = get_verifier(rule)
        self.single_draft = self.inner.single_draft
        self.name = f"{rule}_wrong_logits"

    @staticmethod
    def _other_logits(draft_probs):
        return normalize(draft_probs**2)

    def _sample(self, draft_tokens, draft_probs, target_probs, generator, state):
        other = self._other_logits(draft_probs)
        return self.inner._sample(draft_tokens, other, target_probs, generator, state)

    def _law(self, draft_tokens, draft_probs, target_probs, state):
        return self.inner._law(draft_tokens, self._other_logits(draft_probs), target_probs, state)


class BVSamplerDisagreesWithLaw(BlockVerification):
    """BV's exact law, but the sampler of BVCorrectionFromP: only the sampler-vs-law check can see it."""

    name = "bv_sampler_disagrees"

    def _sample(self, draft_tokens, draft_probs, target_probs, generator, state):
        return BVCorrectionFromP()._sample(draft_tokens, draft_probs, target_probs, generator, state)


CONTROLS = {
    "always_accept": (AlwaysAccept, 1),
    "sd_correction_from_p": (SDCorrectionFromP, 1),
    "bv_correction_from_p": (BVCorrectionFromP, 1),
    "spectr_correction_from_p": (SpecTrCorrectionFromP, 2),
    "sd_wrong_logits": (lambda: WrongLogits("sd"), 1),
    "bv_wrong_logits": (lambda: WrongLogits("bv"), 1),
    "spectr_wrong_logits": (lambda: WrongLogits("spectr"), 2),
    "rbv_wrong_logits": (lambda: WrongLogits("rbv"), 2),
}


@pytest.mark.parametrize("control", list(CONTROLS))
def test_exact_check_rejects(toys, control):
    factory, K = CONTROLS[control]
    tv = exact_tv(factory(), toys[0], K=K, L=2)
    assert tv > 1e3 * EXACT_TV, tv  # far outside round-off (lossless rules: ~1e-16)


@pytest.mark.parametrize("control", list(CONTROLS))
def test_monte_carlo_check_rejects(mc_toy, control):
    """Same checker, toy, sample count and threshold as the positive Monte-Carlo tests."""
    factory, K = CONTROLS[control]
    check = monte_carlo_check(factory(), mc_toy, K=K, num_samples=MC_SAMPLES, seed=0)
    assert check.p_value < POWER_ALPHA, check


def test_sampler_vs_law_check_rejects_a_sampler_that_disagrees_with_its_law(toys):
    """Same inputs, sample count and threshold as test_bv.py's sampler-vs-law test."""
    target, draft = toys[0]
    # Drafts [0, 2]: a correction follows in ~1/4 of the runs, so drawing it from p instead of the
    # residual moves the outcome law by TV ~0.2 (on [0, 1] corrections are rare, TV ~0.005, and
    # whether 3000 draws see the difference is a matter of luck).
    tokens = torch.tensor([[0, 2]])
    inputs = block_tensors(target, draft, (), tokens)
    check = sampler_check(BVSamplerDisagreesWithLaw(), tokens, *inputs, 3000, seed=1)
    assert check.p_value < POWER_ALPHA, check
    honest = sampler_check(get_verifier("bv"), tokens, *inputs, 3000, seed=1)
    assert honest.p_value > ALPHA, honest
