"""Known answers printed in the papers this harness implements, reproduced exactly on context-free toys.

Each test cites the paper and section and holds the paper's number. Sources read in this session: the BV paper's
motivating example as summarised at chatpaper.com/es/paper/1125 (the arXiv HTML, arxiv.org/html/2403.10444v3,
was found but not read to that paragraph), so the two models below are our reading: the binary models whose values
reproduce all three of the paper's numbers at once.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from spectr_repro.theory.bounds import gbv_value
from spectr_repro.theory.exact import rule_expected_accepted
from spectr_repro.theory.lp import optimal_expected_accepted
from spectr_repro.theory.toy import ToyLM


class ContextFree(ToyLM):
    """The same conditional after every context (the papers' examples use context-independent models)."""

    def __init__(self, probs: list[float]) -> None:
        super().__init__(len(probs), seed=-1)
        self.fixed = torch.tensor(probs, dtype=torch.float64)

    def _draw(self, context):
        return self.fixed


# Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami, Suresh, "Block Verification Accelerates Speculative Decoding",
# ICLR 2025 (arXiv 2403.10444), §1, motivating example: vocabulary {a, b}, the target favours b, the draft a,
# blocks of 2 draft tokens. Printed: token verification 10/9 accepted tokens per iteration, block verification 11/9,
# an idealised verifier that sees the joint block probabilities 12/9.
TARGET, DRAFT = ContextFree([1 / 3, 2 / 3]), ContextFree([2 / 3, 1 / 3])


def _fraction(value: float) -> Fraction:
    return Fraction(value).limit_denominator(1000)


def test_bv_paper_motivating_example_token_verification_is_10_9():
    assert _fraction(rule_expected_accepted("sd", TARGET, DRAFT, 1, 2)) == Fraction(10, 9)


def test_bv_paper_motivating_example_block_verification_is_11_9():
    assert _fraction(rule_expected_accepted("bv", TARGET, DRAFT, 1, 2)) == Fraction(11, 9)


def test_bv_paper_motivating_example_joint_verifier_is_12_9_and_above_every_valid_rule():
    """12/9 = Σ_i Σ_x^i min(P, Q), GBV's first-iteration value; BV's 11/9 is the LP limit of rules valid as is (the
    paper's optimality theorem), so 12/9 needs a carried state (GBV's carry-over)."""
    assert _fraction(gbv_value(TARGET, DRAFT, 2)) == Fraction(12, 9)
    assert _fraction(rule_expected_accepted("gbv", TARGET, DRAFT, 1, 2)) == Fraction(12, 9)
    assert optimal_expected_accepted(TARGET, DRAFT, 1, 2).value == pytest.approx(11 / 9, abs=1e-7)


@pytest.mark.parametrize("p, q, L", [([0.5, 0.3, 0.2], [0.2, 0.3, 0.5], 3), ([0.9, 0.1], [0.6, 0.4], 4)])
def test_sd_expected_tokens_per_iteration_is_leviathan_closed_form(p, q, L):
    """Leviathan, Kalman, Matias, "Fast Inference from Transformers via Speculative Decoding", ICML 2023, §3.1:
    with context-free models the expected number of tokens an iteration produces is (1 − α^(γ+1)) / (1 − α),
    α = Σ_x min(p(x), q(x)), γ = L."""
    alpha = sum(min(a, b) for a, b in zip(p, q))
    expected = (1 - alpha ** (L + 1)) / (1 - alpha)
    assert rule_expected_accepted("sd", ContextFree(p), ContextFree(q), 1, L) + 1 == pytest.approx(expected, abs=1e-12)
