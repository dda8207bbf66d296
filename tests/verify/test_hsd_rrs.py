"""HSD over K drafts with recursive rejection sampling (Zhou et al., arXiv 2601.05724, Appendix G, Algorithm 3):
known answers, the two readings, and which of the release's two changes moves the law.

The shared suite (test_registry_contract.py) already checks the contract, the sampler against its exact law, the
registry's lossless flags on the standard toys and the reductions at K = 1 (hsd_rrs = BV, hsd_rrs_release = hsd).
Here: Algorithm 3 at L = 1 is recursive rejection sampling with replacement (Yang et al. 2024, the method the
paper's appendix names), the sub-block's tests in each reading, the paper's reading exact at K = 2, 3 on a toy built
to reach the states where the readings differ, and the minimal counterexample for the release's carried prefix,
derived by hand.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from spectr_repro.theory.exact import iteration_law
from spectr_repro.theory.lawcheck import chi_square_test, total_variation
from spectr_repro.theory.toy import ToyLM, block_tensors, exact_decoded_law, target_law, toy_pair
from spectr_repro.verify import get_verifier
from spectr_repro.verify.hsd_rrs import sub_block_tests
from tests.verify.verify_helpers import law_dict

EXACT = 1e-12  # float64 round-off of these laws is ~1e-16


class TableLM(ToyLM):
    """p(. | context) from a table, ``default`` for every context it does not name."""

    def __init__(self, table: dict[tuple[int, ...], list[float]], default: list[float]) -> None:
        super().__init__(len(default), seed=0)
        self.table = {context: torch.tensor(probs, dtype=torch.float64) for context, probs in table.items()}
        self.default = torch.tensor(default, dtype=torch.float64)

    def _draw(self, context):
        return self.table.get(tuple(context), self.default)


UNIFORM = [1 / 3, 1 / 3, 1 / 3]


def carried_prefix_toy() -> tuple[TableLM, TableLM]:
    """The smallest toy where the release's carried prefix shows (V = 3, L = 2):
    p(. | ()) = (0.2, 0.4, 0.4), q(. | ()) = (0.6, 0.2, 0.2): the first draft token 0 has ratio r_1 = 1/3 < 1;
    p(. | 0) = (0.5, 0.45, 0.05), q(. | 0) = (0.1, 0.1, 0.8): after it, the correction has two tokens."""
    target = TableLM({(): [0.2, 0.4, 0.4], (0,): [0.5, 0.45, 0.05]}, UNIFORM)
    draft = TableLM({(): [0.6, 0.2, 0.2], (0,): [0.1, 0.1, 0.8]}, UNIFORM)
    return target, draft


def decoded_tv(name: str, target, draft, K: int, L: int, n: int, **options) -> float:
    law = exact_decoded_law(get_verifier(name, **options), target, draft, K, L, n)
    return total_variation(law, target_law(target, n))


def test_at_one_token_it_is_recursive_rejection_sampling_with_replacement():
    """L = 1: each draft's only test is min(1, rho(x) / q(x)) and each correction norm((rho - q)+), rho = p at
    first (Algorithm 3 with gamma = 1; Yang et al. 2024's recursive rejection sampling). So P(a draft token is
    accepted) = 1 - prod_k (1 - sum_x min(rho_k, q)), rho_1 = p, rho_{k+1} = norm((rho_k - q)+): the value is
    computed here from p and q alone, not from the rule."""
    target = TableLM({}, [0.5, 0.3, 0.2])
    draft = TableLM({}, [0.2, 0.2, 0.6])
    p, q = target.default, draft.default
    for K in (1, 2, 3):
        rho, none_accepted = p, 1.0
        for _ in range(K):
            none_accepted *= 1.0 - float(torch.minimum(rho, q).sum())
            rho = (rho - q).clamp_min(0) / (rho - q).clamp_min(0).sum()
        law = iteration_law(get_verifier("hsd_rrs"), target, draft, K, 1)
        accepted = sum(prob for tokens, prob in law.items() if len(tokens) == 2)
        assert accepted == pytest.approx(1.0 - none_accepted, abs=EXACT)
    # Control: the K = 3 value is not the K = 1 one (the later drafts do add acceptances).
    assert 1.0 - none_accepted > 1.0 - (1.0 - float(torch.minimum(p, q).sum())) + 0.05


def test_the_sub_block_tests_of_each_reading():
    """Ratios 2 then 0.25 after a prefix of joint ratio R = 1/3 (c = log 1/3).
    Paper (fresh, capped): s = (1, min(1, 2), min(1, 2 * 0.25 / 2)) = (1, 1, 0.25), h_n = s_n = 0.25.
    Release (carried, joint): s_i = R_i / max(1, R_0..R_i) with R = (1/3, 2/3, 1/6): (1/3, 2/3, 1/6), and the last
    test the raw ratio of the sub-path, min(1, 2 * 0.25) = 0.5 (R is not in it)."""
    carry = float(torch.log(torch.tensor(1 / 3, dtype=torch.float64)))
    scale, log_ratio, last = sub_block_tests([2.0, 0.25], carry, "fresh", "capped")
    assert scale == pytest.approx([1.0, 1.0, 0.25]) and last == pytest.approx(0.25)
    assert log_ratio == pytest.approx([0.0, float(torch.log(torch.tensor(2.0))), float(torch.log(torch.tensor(0.5)))])
    scale, _, last = sub_block_tests([2.0, 0.25], carry, "carried", "joint")
    assert scale == pytest.approx([1 / 3, 2 / 3, 1 / 6]) and last == pytest.approx(0.5)
    # A prefix with R >= 1 carries nothing: the cap absorbs it (s_0 = 1, the same tests as the paper's reading).
    assert sub_block_tests([2.0, 0.25], 0.7, "carried", "capped")[0] == pytest.approx([1.0, 1.0, 0.25])


@pytest.mark.parametrize("K", [2, 3])
def test_the_papers_reading_is_exact_where_the_readings_differ(K):
    """On the carried-prefix toy every state the release treats differently is reached; the paper's reading (each
    draft's sub-block on its own, Eq. 19's capped last test) still decodes the target's law exactly."""
    target, draft = carried_prefix_toy()
    assert decoded_tv("hsd_rrs", target, draft, K, 2, 2) < EXACT


def test_the_carried_prefix_alone_moves_the_law_by_the_amount_derived_by_hand():
    """K = 2, L = 2, the carried-prefix toy, the capped last test (so only the carried prefix differs).
    Draft 1 = (0, 2) has probability 0.6 * 0.8 = 0.48. Its depth-1 test: s_1 = 1/3, Z_1 = (1/6 - 0.1) + (0.15 -
    0.1) = 7/60, h_1 = Z_1 / (Z_1 + 2/3) = 7/47; its last test s_2 = (1/3)(0.05/0.8) = 1/48. So it stops at depth 1
    with probability (7/47)(47/48) = 7/48, leaving rho = (4/7, 3/7, 0) after the prefix 0, R = 1/3.
    Draft 2 keeps the prefix with probability 0.6. The paper's reading then emits rho exactly. The release tests
    min(1, rho(x) / (3 q(x))) = 1 for x = 0, 1 (probability 0.2) and corrects from norm((rho / 3 - q)+) =
    (19/28, 9/28, 0): the token 0 gets 0.1 + 0.8 * 19/28 = 9/14 instead of 8/14. Every other path decodes as in
    the paper's reading, so TV = 0.48 * 7/48 * 0.6 * 1/14 = 0.003."""
    target, draft = carried_prefix_toy()
    carried = decoded_tv("hsd_rrs", target, draft, 2, 2, 2, prefix="carried")
    assert carried == pytest.approx(0.48 * 7 / 48 * 0.6 / 14, abs=EXACT)
    # Negative control: the same toy and K, the prefix not carried.
    assert decoded_tv("hsd_rrs", target, draft, 2, 2, 2) < EXACT


def test_the_release_is_biased_by_both_changes_and_each_alone():
    """The audit's decomposition, on the standard V = 3, L = 2 toy (seed 0) at K = 2, three tokens: the raw joint
    last test alone is biased (as hsd's is at K = 1), and so is the release, which adds the carried prefix; the
    carried prefix alone is on the carried-prefix toy (above). Threshold 1e-2: the audit measures 0.1 for both."""
    target, draft = toy_pair(3, 0)
    paper = decoded_tv("hsd_rrs", target, draft, 2, 2, 3)
    joint = decoded_tv("hsd_rrs", target, draft, 2, 2, 3, final_test="joint")
    release = decoded_tv("hsd_rrs_release", target, draft, 2, 2, 3)
    assert paper < EXACT
    assert joint > 1e-2 and release > 1e-2


def released_loop(tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator: torch.Generator) -> tuple:
    """One draw of the authors' multi-draft HSD, written as their code computes it (transformers/generation/utils.py
    of github ZhouYuxuanYX/Hierarchical-Speculative-Decoding, the ``backward`` branch with ``multidraft`` and
    ``parallel``): joint probabilities, not logs; the joint p and q of the accepted prefix carried into the next
    draft (``joint_p_previous``, ``joint_q_previous``); the capped joint p through ``cummax`` of max(ratio, 1); the
    step-back draws from 1 - sum(p'); the last test on the cumulative product of p_i / q_i of the draft's own tokens;
    the token after the loop from the last p' row. tokens [K, L], q [K, L, V], p [K, L+1, V] float64."""
    K, L = tokens.shape

    def rand(*shape):
        return torch.rand(*shape, generator=generator, dtype=torch.float64)

    n_matches, current, ind = 0, 0, 0
    p_primes = joint_p = joint_q = None  # the last tried draft's, read by the next
    for b in range(K):
        if not torch.equal(tokens[ind, :n_matches], tokens[b, :n_matches]):
            continue
        ind, m = b, L - n_matches
        x = tokens[ind, n_matches:]
        p_rows = p[ind, n_matches:L].clone()
        if b > 0:
            p_rows[0] = p_primes[current] / p_primes[current].sum()
            start_p, start_q = joint_p[current], joint_q[current]
        else:
            start_p = start_q = torch.tensor(1.0, dtype=torch.float64)
        p_i = p_rows[torch.arange(m), x]
        q_i = q[ind, n_matches + torch.arange(m), x]
        joint_q = start_q * torch.cumprod(torch.cat([torch.ones(1, dtype=torch.float64), q_i[:-1]]), 0)
        joint_p = start_p * torch.cumprod(torch.cat([torch.ones(1, dtype=torch.float64), p_i[:-1]]), 0)
        previous_max = torch.cummax(torch.clamp_min(joint_p / joint_q, 1.0), 0).values
        diffs = (joint_p / previous_max)[:, None] * p_rows - joint_q[:, None] * q[ind, n_matches:L]
        p_plus, p_minus = diffs.clamp_min(0), (-diffs).clamp_min(0)
        p_primes = p_plus / torch.maximum(p_plus.sum(-1, keepdim=True), p_minus.sum(-1, keepdim=True))
        step_back = rand(m) < 1 - p_primes.sum(-1)
        stop = 0 if bool(step_back.all()) else int(torch.nonzero(~step_back).max())
        accepted = bool(rand(1) <= torch.cumprod(p_i / q_i, 0)[-1])
        current = m if accepted else stop
        n_matches += current
        if n_matches == L:
            last = torch.multinomial(p[ind, L], 1, generator=generator)
            return tuple(int(t) for t in torch.cat([tokens[ind], last]))
    last = torch.multinomial(p_primes[current] / p_primes[current].sum(), 1, generator=generator)
    return tuple(int(t) for t in torch.cat([tokens[ind, :n_matches], last]))


def test_the_release_rule_is_the_authors_code_law_for_law():
    """The authors' loop, as their code computes it (``released_loop``), drawn 5,000 times on a block where every
    part of it acts (V = 3, L = 2, the toy's p and q; the first two drafts share their first token, so the second
    runs with the carried prefix, and the third leaves it), against hsd_rrs_release's exact law: Pearson's test at
    1e-4 (the audit's threshold; a faithful rule fails it with probability 1e-4). Negative control, the same draws
    against the paper's reading, whose law is 0.54 away in TV on this block (the largest over every K = 3 block of
    this toy): rejected."""
    target, draft = toy_pair(3, 0)
    tokens = torch.tensor([[2, 1], [2, 2], [1, 1]])
    q, p = block_tensors(target, draft, (), tokens)
    release = law_dict(get_verifier("hsd_rrs_release").law(tokens, q, p))
    paper = law_dict(get_verifier("hsd_rrs").law(tokens, q, p))
    generator = torch.Generator().manual_seed(0)
    counts = Counter(released_loop(tokens, q, p, generator) for _ in range(5_000))
    assert chi_square_test(counts, release).p_value > 1e-4
    assert total_variation(release, paper) > 0.5
    assert chi_square_test(counts, paper).p_value < 1e-4
