"""HSD (Zhou et al., arXiv 2601.05724) as released: known answers, its relation to BV, and why it is biased.

The rule (spectr_repro/verify/hsd.py) is BV's backward scan with BV's capped branch tests and corrections, except
that the whole block passes on its joint ratio min(1, P(X^L) / Q(X^L)) instead of BV's running clipped ratio.
The shared suite (test_registry_contract.py) already checks the contract, the sampler against its law and that the
registry's ``lossless=False`` is honest; here: the paper's worked example (section 5.4), the worked toy of the
authors' README / simulation.py (the example of Sun et al.'s BV paper), reductions, the exact expectation, and the
lossless reading with its negative control. The paper's text (section 5.2, Eq. 19's h_gamma = min(r*, 1)) caps the
last test as ``final_test="capped"`` does (BV law for law); its code listing (Appendix F) and the release do not.
"""

from __future__ import annotations

import pytest
import torch

from spectr_repro.theory.exact import iteration_law
from spectr_repro.theory.lawcheck import total_variation
from spectr_repro.theory.toy import ToyLM, block_tensors, draft_tuples, exact_decoded_law, target_law, toy_pair
from spectr_repro.verify import get_verifier
from spectr_repro.verify.common import clipped_stop_probability
from spectr_repro.verify.hsd import HierarchicalSpeculativeDecoding, capped_scale, log_joint_ratios
from tests.verify.verify_helpers import law_dict

EXACT = 1e-12  # float64 round-off of these laws is ~1e-16


class ConstantLM(ToyLM):
    """p(. | context) = probs for every context (the README's context-independent toy)."""

    def __init__(self, probs: list[float]) -> None:
        super().__init__(len(probs), seed=0)
        self.fixed = torch.tensor(probs, dtype=torch.float64)

    def _draw(self, context):
        return self.fixed


def readme_toy():
    """The authors' toy (README, 'Compare the expected number of accepted tokens'; simulation.py's Mb/Ms_probs):
    target p(A) = 1/3, p(B) = 2/3, draft q(A) = 2/3, q(B) = 1/3 in every context (A = 0, B = 1)."""
    return ConstantLM([1 / 3, 2 / 3]), ConstantLM([2 / 3, 1 / 3])


def expected_tau(verifier, target, draft, L: int) -> float:
    law = iteration_law(verifier, target, draft, 1, L)
    return sum(prob * (len(tokens) - 1) for tokens, prob in law.items())


def test_readme_toy_first_iteration_expected_accepted_lengths():
    """L = 2 on the README toy: token-wise 10/9 and BV 11/9 (Sun et al.'s worked example, the LP limit at K = 1);
    HSD as released 12/9: draft BA (r_1 = 2, r_2 = 1) passes whole with probability min(1, r_2) = 1 where BV's
    w_2 = min(1, w_1 * 1/2) = 1/2. Above the LP limit, so the release cannot be lossless. (The README's own numbers
    for this toy, 5/9, 4/9 and 7/9, have block-wise below token-wise, which BV's optimality rules out; they are not
    reproducible here, and simulation.py, which should print them, does not run as committed.)"""
    target, draft = readme_toy()
    assert expected_tau(get_verifier("sd"), target, draft, 2) == pytest.approx(10 / 9, abs=EXACT)
    assert expected_tau(get_verifier("bv"), target, draft, 2) == pytest.approx(11 / 9, abs=EXACT)
    assert expected_tau(get_verifier("hsd"), target, draft, 2) == pytest.approx(12 / 9, abs=EXACT)


def test_readme_toy_is_the_minimal_counterexample():
    """V = 2, L = 2, context-free p and q: the decoded law of the first two tokens has P(BA) = 2/9 + 1/9 (the extra
    half of draft BA passed whole) and P(BB) = 4/9 - 1/9 (the correction BV emits after B in that half: with w_1 = 1,
    norm((p - q)+) = B); everything else is the target's. TV = 1/9 exactly."""
    target, draft = readme_toy()
    law = exact_decoded_law(get_verifier("hsd"), target, draft, 1, 2, 2)
    assert law[(1, 0)] == pytest.approx(3 / 9, abs=EXACT)
    assert law[(1, 1)] == pytest.approx(3 / 9, abs=EXACT)
    assert law[(0, 0)] == pytest.approx(1 / 9, abs=EXACT) and law[(0, 1)] == pytest.approx(2 / 9, abs=EXACT)
    assert total_variation(law, target_law(target, 2)) == pytest.approx(1 / 9, abs=EXACT)


# The paper's worked example (section 5.4, "Illustrative example": a GSM8K prefix, gamma = 10): the target's and the
# draft's conditionals of the ten drafted tokens ("she work ed 45 - 40 = 5 hours of"), as printed to 4 decimals.
PAPER_P = [0.7156, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.4968]
PAPER_Q = [0.8771, 0.7900, 0.6514, 0.2592, 0.6773, 0.1490, 0.5775, 1.0, 0.4611, 0.3630]
PAPER_R = [0.8159, 1.0327, 1.5855, 6.1171, 0, 0, 0, 0, 0, 0]  # {r(X_1:t)}: joint ratios
PAPER_R_STAR = [0.8159, 1, 1, 1, 0, 0, 0, 0, 0, 0]  # {r*(X_1:t)} (Def. 5, Eq. 16), printed clipped at 1
PAPER_D_PQ = [0.0227, 0.2416, 0.3343]  # D*_Branch(p, q | X_1:t), t = 1..3 (Eq. 17)
PAPER_D_QP = [0.1842, 0.2416, 0.3343]  # D*_Branch(q, p | X_1:t), t = 1..3 (Eq. 18)
PAPER_H1 = 0.1231  # h_1 (Eq. 19); h_2 = h_3 = h_4 = 1


def test_the_papers_worked_example_section_5_4():
    """Our joint ratios and running-max cap give the paper's r and r* (Defs. 4-5, Eq. 16: r* = r_t / r_m with m the
    prefix's argmax when it exceeds 1, i.e. min(1, r*) = r_t / max(1, r_1..r_t), BV's w_t); and our depth test
    h = Z / (Z + 1 - s) is Eq. 19 on the paper's own capped divergences, with D*(q, p) - D*(p, q) = Q(X_1:t)(1 - s_t)
    (Eqs. 17-18 summed over the branch). Tolerances: the paper prints 4 decimals."""
    tokens = torch.arange(10)
    targets = torch.zeros(10, 11, dtype=torch.float64)  # each row: the drafted token's probability, the rest on 10
    drafts = torch.zeros(10, 11, dtype=torch.float64)
    targets[tokens, tokens], drafts[tokens, tokens] = torch.tensor(PAPER_P, dtype=torch.float64), torch.tensor(
        PAPER_Q, dtype=torch.float64)
    targets[:, 10], drafts[:, 10] = 1 - targets[tokens, tokens], 1 - drafts[tokens, tokens]
    log_ratio = log_joint_ratios(targets, drafts, tokens)  # [11]: log r_0..log r_10
    assert torch.exp(log_ratio[1:]).tolist() == pytest.approx(PAPER_R, abs=1e-3)
    scale = capped_scale(log_ratio, "running_max")
    assert scale[1:].tolist() == pytest.approx(PAPER_R_STAR, abs=1e-4)
    joint_q = torch.cumprod(torch.tensor(PAPER_Q, dtype=torch.float64), 0)
    for t in range(3):
        assert PAPER_D_QP[t] - PAPER_D_PQ[t] == pytest.approx(float(joint_q[t] * (1 - scale[t + 1])), abs=2e-4)
    excess = torch.tensor([PAPER_D_PQ[0] / float(joint_q[0])], dtype=torch.float64)  # Z_1 = D*(p, q | X_1) / Q(X_1)
    assert float(clipped_stop_probability(excess, scale[1:2])[0]) == pytest.approx(PAPER_H1, abs=2e-4)
    # the control: the uncapped ratio (no running max) is not the paper's r* once a prefix ratio exceeds 1
    assert torch.exp(log_ratio[3]).item() != pytest.approx(PAPER_R_STAR[2], abs=1e-2)


def test_at_L1_hsd_is_sd():
    """One draft token: h_1 = min(1, p/q) and the correction norm((p - q)+): token-level rejection sampling."""
    target, draft = toy_pair(vocab_size=4, seed=3)
    for _, tokens in draft_tuples(draft, (), 1, 1):
        block = (tokens, *block_tensors(target, draft, (), tokens))
        assert law_dict(get_verifier("hsd").law(*block)) == pytest.approx(law_dict(get_verifier("sd").law(*block)),
                                                                            abs=EXACT)


@pytest.mark.parametrize("vocab_size, L, seed", [(2, 2, 0), (3, 2, 1), (2, 3, 2), (3, 3, 4)])
def test_capped_last_test_is_bv_law_for_law(vocab_size, L, seed):
    """final_test="capped" (h_L = s_L = BV's w_L) gives BV's law on every draft: the release differs from BV by its
    last test alone."""
    target, draft = toy_pair(vocab_size=vocab_size, seed=seed)
    capped, bv = HierarchicalSpeculativeDecoding(final_test="capped"), get_verifier("bv")
    for _, tokens in draft_tuples(draft, (), 1, L):
        block = (tokens, *block_tensors(target, draft, (), tokens))
        assert law_dict(capped.law(*block)) == pytest.approx(law_dict(bv.law(*block)), abs=EXACT)


@pytest.mark.parametrize("vocab_size, L, seed", [(2, 2, 0), (3, 2, 1), (2, 3, 2), (4, 2, 5)])
def test_lossless_reading_on_random_toys_and_the_release_as_its_negative_control(vocab_size, L, seed):
    """The same check (exact decoded law of 3 tokens across iterations vs the target's) passes the capped last test
    (TV <= 1e-12) and catches the release's joint last test, a perturbed acceptance (TV > 1e-3)."""
    target, draft = toy_pair(vocab_size=vocab_size, seed=seed)
    reference = target_law(target, 3)

    def tv(verifier) -> float:
        return total_variation(exact_decoded_law(verifier, target, draft, 1, L, 3), reference)

    assert tv(HierarchicalSpeculativeDecoding(final_test="capped")) <= EXACT
    assert tv(HierarchicalSpeculativeDecoding()) > 1e-3
    assert tv(HierarchicalSpeculativeDecoding(cap="joint_min")) > 1e-3


def _block(ratios_tokens: list[int], V: int = 3):
    """A hand block of L = 3 with token ratios p/q = 2, 3/4, 1/2 on tokens 0, 1, 2 in every row."""
    q = torch.tensor([0.25, 0.4, 0.35], dtype=torch.float64)
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    tokens = torch.tensor([ratios_tokens])
    L = tokens.shape[1]
    return tokens, q.expand(1, L, V).clone(), p.expand(1, L + 1, V).clone()


def test_the_two_released_caps_differ_where_the_joint_ratio_falls_from_a_peak():
    """Draft 0 1 2: r = 1, 2, 3/2, 3/4. running_max (GSM8K path) s_2 = (3/2)/2 = 3/4; joint_min (EAGLE-3H path)
    s_2 = min(1, 3/2) = 1, so h_2 = 1 there: the EAGLE-3H form never steps back below depth 2."""
    block = _block([0, 1, 2])
    log_ratio = torch.log(torch.tensor([1.0, 2.0, 1.5, 0.75], dtype=torch.float64))
    assert capped_scale(log_ratio, "running_max").tolist() == pytest.approx([1, 1, 0.75, 0.375], abs=EXACT)
    assert capped_scale(log_ratio, "joint_min").tolist() == pytest.approx([1, 1, 1, 0.75], abs=EXACT)
    running, joint = HierarchicalSpeculativeDecoding(), HierarchicalSpeculativeDecoding(cap="joint_min")
    law_running, law_joint = law_dict(running.law(*block)), law_dict(joint.law(*block))
    assert sum(prob for tokens, prob in law_joint.items() if len(tokens) <= 2) == pytest.approx(0.0, abs=EXACT)
    assert sum(prob for tokens, prob in law_running.items() if len(tokens) <= 2) > 0.01


@pytest.mark.parametrize("options", [{}, {"cap": "joint_min"}, {"final_test": "capped"}])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_expected_emitted_equals_the_law(options, dtype):
    """The closed form E[tau + 1 | drafts] the replay uses is the law's mean, on every draft of a toy."""
    target, draft = toy_pair(vocab_size=3, seed=7)
    verifier = HierarchicalSpeculativeDecoding(**options)
    for _, tokens in draft_tuples(draft, (), 1, 3):
        draft_probs, target_probs = block_tensors(target, draft, (), tokens)
        law = verifier.law(tokens, draft_probs, target_probs)
        mean = sum(outcome.probability * len(outcome.tokens) for outcome in law)
        value = verifier.expected_emitted(tokens, draft_probs.to(dtype), target_probs.to(dtype))
        assert value.dtype == torch.float64 and value.dim() == 0
        assert float(value) == pytest.approx(mean, abs=1e-12 if dtype == torch.float64 else 1e-5)


def test_bad_options_are_one_value_error():
    with pytest.raises(ValueError, match="cap must be"):
        HierarchicalSpeculativeDecoding(cap="max")
    with pytest.raises(ValueError, match="final_test must be"):
        HierarchicalSpeculativeDecoding(final_test="bv")
