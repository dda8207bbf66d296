"""SBV-F (selection block verification with fallback): exact validity, reductions (K = 1 is BV, no fallback is
SBV), never below SBV, the candidates' laws, sampler = law, Monte Carlo with negative controls.

Exact checks enumerate every draft tuple and integrate the rule's randomness: a lossless rule matches the target
law to float64 round-off, so the threshold is TV < 1e-9 (observed ~1e-16). The fallback's mistakes are small
(wrong candidate laws move the law by 1e-5 to 1e-3 on these toys), far above 1e-9 and far below what Monte Carlo
can see: the exact tests carry the proof, Monte Carlo checks that the sampler runs the audited law.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from spectr_repro.theory.lawcheck import chi_square_test, total_variation
from spectr_repro.theory.toy import block_tensors, draft_tuples, exact_decoded_law, sample_decoded, target_law, toy_pair
from spectr_repro.theory.validity import check_validity
from spectr_repro.verify import get_verifier
from spectr_repro.verify.sbvf import BELOW, FREE, REJECTED, SelectionBlockVerificationFallback, candidate_laws
from spectr_repro.verify.selection import ranked_head, rules_at
from tests.verify.verify_helpers import (
    ALPHA,
    EXACT_TV,
    POWER_ALPHA,
    iteration_inputs,
    iteration_law,
    law_dict,
    sampler_check,
)

from .selection_oracle import choose_rho


class FreshCandidatesControl(SelectionBlockVerificationFallback):
    """Negative control: treats the candidates as fresh draws from q at depth tau+1 (ignores what the scan saw)."""

    @staticmethod
    def _candidate_laws(rules, depth, Q_row, count, token, statuses):
        return (Q_row.double() / Q_row.sum()).expand(len(statuses), -1)


class PlainTargetControl(SelectionBlockVerificationFallback):
    """Negative control: the candidates are verified against p instead of the residual r (a gross error)."""

    @staticmethod
    def _fallback_target(correction, P):
        return P


def _mean_accepted_given_drafts(verifier, tokens, dp, tp) -> float:
    return sum(o.probability * (len(o.tokens) - 1) for o in verifier.law(tokens, dp, tp))


# ---------------------------------------------------------------------------------------------- validity
@pytest.mark.parametrize(
    "vocab, L, K, seed",
    [(3, 2, 1, 0), (4, 2, 1, 1)]  # K = 1
    + [(3, 2, 2, 0), (3, 2, 2, 1), (3, 2, 2, 2), (2, 3, 2, 3), (4, 2, 2, 4)]  # K = 2
    + [(3, 1, 3, 5), (4, 1, 3, 6), (2, 2, 3, 7)],  # K = 3 (V = 3, L = 2 below, slow)
)
def test_exact_decoded_law_is_the_target_law(vocab, L, K, seed):
    target, draft = toy_pair(vocab, seed)
    law = exact_decoded_law(get_verifier("sbvf"), target, draft, K=K, L=L, n=3)
    assert total_variation(law, target_law(target, 3)) < EXACT_TV


@pytest.mark.parametrize("vocab, L, K, seed", [(3, 2, 2, 1), (2, 3, 3, 2), (4, 2, 2, 3)])
def test_iteration_law_passes_the_validity_condition(vocab, L, K, seed):
    """R >= 0 everywhere and R = 0 at length L+1 (docs/methods.md, Validity), on the law of one iteration."""
    target, draft = toy_pair(vocab, seed)
    report = check_validity(iteration_law(get_verifier("sbvf"), target, draft, K, L), target, L)
    assert report.valid, report.reason
    assert report.min_residual > -1e-12 and report.max_terminal_residual < 1e-12


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_exact_validity_three_drafts_two_positions(seed):
    target, draft = toy_pair(3, seed)
    law = exact_decoded_law(get_verifier("sbvf"), target, draft, K=3, L=2, n=3)
    assert total_variation(law, target_law(target, 3)) < EXACT_TV


@pytest.mark.parametrize("control", [FreshCandidatesControl, PlainTargetControl])
def test_negative_controls_are_not_lossless_exactly(control):
    """The exact test has power: a wrong candidate law or a wrong target in the fallback is caught."""
    target, draft = toy_pair(3, 1)
    law = exact_decoded_law(control(), target, draft, K=2, L=2, n=3)
    assert total_variation(law, target_law(target, 3)) > 1e-4  # measured 4.8e-4 (fresh) and 0.017 (plain target)


@pytest.mark.parametrize("vocab, L, K, seed", [(3, 2, 2, 0), (2, 3, 2, 1), (3, 1, 3, 2), (2, 2, 3, 3)])
def test_without_fallback_it_is_sbv_and_with_it_never_below(vocab, L, K, seed):
    """fallback=False gives SBV's law draft tuple by draft tuple; with the fallback, the expected accepted
    length given the drafts is never below SBV's (the fallback only replaces SBV's last token)."""
    target, draft = toy_pair(vocab, seed)
    sbv, plain, ours = get_verifier("sbv"), get_verifier("sbvf", fallback=False), get_verifier("sbvf")
    gain = 0.0
    for prob, tokens, dp, tp in iteration_inputs(target, draft, K, L):
        reference = law_dict(sbv.law(tokens, dp, tp))
        assert total_variation(law_dict(plain.law(tokens, dp, tp)), reference) < 1e-12
        ours_length = _mean_accepted_given_drafts(ours, tokens, dp, tp)
        sbv_length = _mean_accepted_given_drafts(sbv, tokens, dp, tp)
        assert ours_length >= sbv_length - 1e-12
        gain += prob * (ours_length - sbv_length)
    assert gain > 1e-4, gain  # the fallback does help: measured 0.0008, 0.0067, 0.0002, 0.0081 on these toys


@pytest.mark.parametrize("agreement", ["independent", "shared"])
def test_without_fallback_it_is_sbv_on_a_real_vocabulary(agreement):
    """At Qwen's vocabulary with the default ranked head (rank_size < V: a tail exists), sbvf fallback=False
    emits SBV's tokens for the same generator seed, draw for draw; with the fallback on, the outputs differ on
    some seed (the control: the comparison can see a difference)."""
    from spectr_repro.bench.blocks import synthetic_block

    block = synthetic_block(3, 12, 151_936, agreement=agreement, seed=7, draft_noise=1.0)
    # The bench's blocks ("independent": rows not tied by the shared context), run as the engine runs rules.
    sbv, plain, ours = (get_verifier(name, check_inputs=False, **options)
                        for name, options in [("sbv", {}), ("sbvf", {"fallback": False}), ("sbvf", {})])
    differs = 0
    for seed in range(4):
        reference = sbv(*block, generator=torch.Generator().manual_seed(seed))
        same = plain(*block, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(same.tokens, reference.tokens) and same.draft_index == reference.draft_index
        fallback = ours(*block, generator=torch.Generator().manual_seed(seed))
        differs += not torch.equal(fallback.tokens, reference.tokens)
        assert fallback.num_accepted >= 0 and fallback.tokens.shape[0] == fallback.num_accepted + 1
    if agreement == "independent":
        assert differs > 0  # the fallback runs after an early stop with candidates (q far from p: most seeds)


# ---------------------------------------------------------------------------------------------- closed forms
def _random_rows(V: int, seed: int, zero: int | None = None):
    generator = torch.Generator().manual_seed(seed)
    P = torch.rand(V, generator=generator, dtype=torch.float64) ** 2
    Q = torch.rand(V, generator=generator, dtype=torch.float64) ** 2
    if zero is not None:
        Q[zero] = 0.0  # a token the draft never proposes: ratio +inf, f = 0
    return P / P.sum(), Q / Q.sum()


def _enumerated_candidates(P, Q, rho, k):
    """By enumeration of k i.i.d. draws and the scan: for each selected v, scan outcome and draw position of a
    non-carrier, the law of that draw's token. Returns {(v, accepted_at, position): {token: prob}}."""
    V = P.shape[0]
    accept = [min(1.0, float(P[x]) / (rho * float(Q[x]))) if Q[x] > 0 else 0.0 for x in range(V)]
    ratio = [(float(P[x]) / float(Q[x]) if Q[x] > 0 else math.inf, x) for x in range(V)]
    out: dict = {}
    for draws in itertools.product(range(V), repeat=k):
        prob = math.prod(float(Q[x]) for x in draws)
        if prob == 0:
            continue
        none = 1.0
        events = []
        for position, x in enumerate(draws):
            events.append((x, none * accept[x], position))
            none *= 1.0 - accept[x]
        events.append((max(draws, key=lambda x: ratio[x]), none, -1))
        for v, p_event, accepted_at in events:
            for position, x in enumerate(draws):
                if x != v and p_event > 0:
                    cell = out.setdefault((v, accepted_at, position), {})
                    cell[x] = cell.get(x, 0.0) + prob * p_event
    return out


@pytest.mark.parametrize("k", [2, 3])
def test_candidate_laws_match_enumeration(k):
    """Given the selected token and the scan's outcome, a non-carrier's token has the closed-form law g (SBV's
    rule at that prefix, every token ranked)."""
    P, Q = _random_rows(4, 10 + k)
    rho = choose_rho(P, Q, [k])[k]
    rho_per_count = torch.tensor([[rho] * (k - 1)], dtype=torch.float64)
    rules = rules_at(ranked_head(P[None], Q[None], None, 0.0), rho_per_count, k)
    cells = _enumerated_candidates(P, Q, rho, k)
    assert {BELOW, REJECTED, FREE} <= {BELOW if a < 0 else (REJECTED if pos < a else FREE) for _, a, pos in cells}
    for (v, accepted_at, position), cell in cells.items():
        status = BELOW if accepted_at < 0 else (REJECTED if position < accepted_at else FREE)
        total = sum(cell.values())
        laws = candidate_laws(rules, 0, Q, k, v, [FREE, REJECTED, BELOW, status])
        for x in range(4):
            assert abs(cell.get(x, 0.0) / total - float(laws[3, x])) < 1e-12, (v, accepted_at, position, x)


def test_candidate_laws_have_power():
    """Negative control for the enumeration check: the REJECTED law differs from the FREE one (Q restricted)."""
    P, Q = _random_rows(4, 12)
    rho = choose_rho(P, Q, [2])[2]
    rules = rules_at(ranked_head(P[None], Q[None], None, 0.0), torch.tensor([[rho]], dtype=torch.float64), 2)
    laws = candidate_laws(rules, 0, Q, 2, 0, [FREE, REJECTED])
    assert float((laws[0] - laws[1]).abs().sum()) > 1e-3


# ---------------------------------------------------------------------------------------------- sampler
def _sampler_inputs():
    """Two drafts that part at the first token; the second carries a token q rarely proposes but p likes, so
    where BV rejects the first draft's token the fallback often accepts the second draft (laws of SBV and SBV-F
    differ by TV 0.17 here, against at most 0.005 on the toys)."""
    def rows(*values):
        t = torch.tensor(values, dtype=torch.float64)
        return t / t.sum(-1, keepdim=True)

    q_root, p_root = rows(0.84, 0.03, 0.13), rows(0.55, 0.38, 0.07)
    q = torch.stack([torch.stack([q_root, rows(0.11, 0.57, 0.32)]), torch.stack([q_root, rows(0.22, 0.04, 0.74)])])
    p = torch.stack([torch.stack([p_root, rows(0.67, 0.15, 0.18), rows(0.69, 0.03, 0.28)]),
                     torch.stack([p_root, rows(0.81, 0.17, 0.02), rows(0.07, 0.88, 0.05)])])
    return torch.tensor([[0, 1], [1, 2]]), q, p


def test_sampler_matches_its_exact_law():
    tokens, dp, tp = _sampler_inputs()
    check = sampler_check(get_verifier("sbvf"), tokens, dp, tp, 4000, seed=3)
    assert check.p_value > ALPHA, check


def test_sampler_check_has_power():
    """Negative control: SBV's sampler (no fallback) checked against SBV-F's law on the same inputs."""
    tokens, dp, tp = _sampler_inputs()
    ours = law_dict(get_verifier("sbvf").law(tokens, dp, tp))
    assert total_variation(ours, law_dict(get_verifier("sbv").law(tokens, dp, tp))) > 0.1
    generator = torch.Generator().manual_seed(3)
    sbv = get_verifier("sbv")
    counts: dict = {}
    for _ in range(4000):
        out = tuple(sbv(tokens, dp, tp, generator=generator).tokens.tolist())
        counts[out] = counts.get(out, 0) + 1
    assert chi_square_test(counts, ours).p_value < POWER_ALPHA


def test_monte_carlo_joint_law_matches_target():
    """The real sampler over several iterations: the first 3 decoded tokens follow the target (chi-square)."""
    target, draft = toy_pair(3, 0, draft_noise=0.8)
    counts = sample_decoded(get_verifier("sbvf"), target, draft, K=3, L=2, n=3, num_samples=2000, seed=0)
    check = chi_square_test(counts, target_law(target, 3))
    assert check.p_value > ALPHA and check.tv < 3 * check.expected_tv, check


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="grid_size"):
        get_verifier("sbvf", grid_size=1)
    with pytest.raises(ValueError, match="selection"):  # "count" and "mixture" only (test_sbvf_mixture.py)
        get_verifier("sbvf", selection="greedy")


def test_float32_inputs_give_the_float64_law():
    target, draft = toy_pair(3, 2)
    verifier = get_verifier("sbvf")
    for _, tokens in draft_tuples(draft, (), 2, 2)[:20]:
        dp, tp = block_tensors(target, draft, (), tokens)
        law64 = law_dict(verifier.law(tokens, dp, tp))
        law32 = law_dict(verifier.law(tokens, dp.float(), tp.float()))
        assert total_variation(law64, law32) < 1e-5


@pytest.mark.parametrize("statuses", [[FREE, FREE], [REJECTED], [BELOW, BELOW], [REJECTED, FREE]])
def test_candidate_laws_leave_the_draft_row_intact(statuses):
    """candidate_laws zeroes v's entry in its laws: on copies, never in the caller's draft row (a float64 row
    reaches it as a view of the inputs, and a FREE law is that row)."""
    P, Q = _random_rows(5, 4)
    rules = rules_at(ranked_head(P[None], Q[None], None, 0.0), torch.tensor([[1.3, 1.1]], dtype=torch.float64), 3)
    before = Q.clone()
    v = int(rules.ids[0, -1])  # the token of top rank: every status is possible for it
    laws = candidate_laws(rules, 0, Q, 3, v, statuses)
    assert torch.equal(Q, before)
    assert torch.all(laws[:, v] == 0) and torch.allclose(laws.sum(-1), torch.ones(len(statuses), dtype=torch.float64))
