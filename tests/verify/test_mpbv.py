"""MP-BV (greedy multi-path block verification, Thomas & Pal 2026): what is specific to it.

The shared suites (test_registry_contract, test_op_budgets, test_contract_fuzz) test it from the registry:
exact losslessness of the first 3 decoded tokens (TV < 1e-9), the Monte-Carlo chi-square through its sampler,
the sampler against its own law, the op and host-read budgets. Here: the selected path's law q_sel against
brute force, the reductions (K = 1 is BV; SBV's selection core with the greedy selection, the test oracle
``GreedySelectionBlockVerification``, is the same rule written independently),
and the negative control that shows why q_sel is needed (BV given the draft's own q on the greedy path is biased).
"""

from __future__ import annotations

import pytest
import torch

from spectr_repro.theory.lawcheck import total_variation
from spectr_repro.theory.toy import exact_decoded_law, target_law
from spectr_repro.verify import get_verifier
from spectr_repro.verify.base import Outcome, Verifier
from spectr_repro.verify.mpbv import greedy_path, path_block_test
from tests.verify.selection_oracle import GreedySelectionBlockVerification
from tests.verify.verify_helpers import EXACT_TV, iteration_inputs, law_dict

LAW_TOLERANCE = 1e-12  # float64 laws of V = 3 toys agree to ~1e-15; a wrong order statistic is off by > 1e-2


def _max_gap(a: dict, b: dict) -> float:
    return max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


@pytest.mark.parametrize("K", [2, 3])
@pytest.mark.parametrize("ties", [False, True])
def test_selected_path_law_matches_brute_force(toys, K, ties):
    """prod_i q_sel[i](x_{i+1}) = P(the greedy path is x), summed over every draft tuple, for every path x;
    ``ties``: q = p, every ratio is 1 (one key class: the first draft's token is selected, q_sel = q)."""
    target, draft = (toys[1][0], toys[1][0]) if ties else toys[1]
    L = 2
    brute: dict[tuple[int, ...], float] = {}
    claimed: dict[tuple[int, ...], float] = {}
    for prob, tokens, dp, tp in iteration_inputs(target, draft, K, L):
        path = greedy_path(tokens, dp, tp)
        key = tuple(path.tokens.tolist())
        brute[key] = brute.get(key, 0.0) + prob
        law = path.draft_law.gather(-1, path.tokens[:, None]).prod().item()
        assert abs(claimed.setdefault(key, law) - law) < LAW_TOLERANCE  # q_sel depends on the path only
        assert abs(path.draft_law.sum(-1) - 1).max() < LAW_TOLERANCE
    assert _max_gap(brute, claimed) < LAW_TOLERANCE
    assert len(brute) > 3  # several paths are selected: the check is not vacuous


def test_one_draft_is_block_verification(toys):
    mpbv, bv = get_verifier("mpbv"), get_verifier("bv")
    for target, draft in toys:
        for _, tokens, dp, tp in iteration_inputs(target, draft, 1, 3):
            assert _max_gap(law_dict(mpbv.law(tokens, dp, tp)), law_dict(bv.law(tokens, dp, tp))) < LAW_TOLERANCE


@pytest.mark.parametrize("K", [2, 3])
def test_equals_sbv_greedy_selection(toys, K):
    """SBV's selection core with the greedy selection (rho = inf; the oracle in selection_oracle.py) is the same rule
    written independently: equal laws per draft tuple."""
    reference = GreedySelectionBlockVerification()
    mpbv = get_verifier("mpbv")
    target, draft = toys[2]
    gaps = [_max_gap(law_dict(mpbv.law(tokens, dp, tp)), law_dict(reference.law(tokens, dp, tp)))
            for _, tokens, dp, tp in iteration_inputs(target, draft, K, 2)]
    assert max(gaps) < LAW_TOLERANCE


class _GreedyPathWithDraftQ(Verifier):
    """Negative control: the greedy path verified by BV with the draft's own q instead of the path's law."""

    name = "mpbv_with_q"
    lossless = False

    def _law(self, draft_tokens, draft_probs, target_probs, state):
        path = greedy_path(draft_tokens, draft_probs, target_probs)
        L = draft_tokens.shape[1]
        own_q = draft_probs[torch.tensor(path.draft_index[:L]), torch.arange(L)].double()
        stop, laws, _ = path_block_test(path.targets, own_q, path.tokens)
        h, prefix, none_above, outcomes = stop.tolist(), tuple(path.tokens.tolist()), 1.0, []
        for tau in range(L, -1, -1):
            weight, none_above = h[tau] * none_above, none_above * (1.0 - h[tau])
            outcomes += [Outcome(weight * p, prefix[:tau] + (y,)) for y, p in enumerate(laws[tau].tolist())
                         if weight * p > 0]
        return outcomes


def test_draft_law_matters_negative_control(toys):
    """BV on the greedy path given q is biased (exact TV >= 1e-3), mpbv on the same toys is exact: the exact
    test can tell the two apart, and the count-posterior law is what makes the rule lossless."""
    target, draft = toys[0]
    biased = total_variation(exact_decoded_law(_GreedyPathWithDraftQ(), target, draft, 3, 2, 3), target_law(target, 3))
    exact = total_variation(exact_decoded_law(get_verifier("mpbv"), target, draft, 3, 2, 3), target_law(target, 3))
    assert exact < EXACT_TV
    assert biased > 1e-3, biased


def test_sampler_reads_the_host_a_constant_number_of_times():
    """Three host reads per call whatever K and L (the shared budget is L + 4): drafts, posterior inputs, result;
    plus the sampler's on-device mass assertion, which is a read on the CPU only (counted here)."""
    from spectr_repro.bench.blocks import synthetic_block
    from spectr_repro.bench.counters import count_ops

    verifier = get_verifier("mpbv", check_inputs=False)
    for K, L in ((3, 4), (7, 12)):
        block = synthetic_block(K, L, 500, agreement="shared", seed=1, draft_noise=0.05)
        with count_ops() as counts:
            verifier(*block, generator=torch.Generator().manual_seed(0))
        assert counts.host_reads == 4, (K, L, counts.host_reads)
