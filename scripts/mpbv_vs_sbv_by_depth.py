"""Where greedy multi-path BV (mpbv) beats SBV, and the selection that beats both (docs/methods.md, MP-BV).

The E[tau] of any selection-then-BV rule is a function of its path law alone (BV run on the selected path with
the path's exact law), so selection rules can be mixed depth by depth. At K = 2, L = 2 the law of the path is
law1(x1) law2(x2 | x1) with law2 = pi f(. | 2) + (1 - pi) q(. | x1), pi = q(x1)^2 / law1(x1) (both drafts carry
x1, whatever the rule). This script prints, per toy, E[tau] of: SBV (rho per count, docs/sbv.md), mpbv
(greedy), each with the other's selection at one depth, and the proposed selection (SBV's grid plus rho = inf at
the root; at the last depth rho chosen for the count MIXTURE against w1 * p, the exact last-depth objective).

    python scripts/mpbv_vs_sbv_by_depth.py
"""

from __future__ import annotations

import math

import torch

from spectr_repro.theory.selection_rows import choose_rho, selection_law  # per-row views of SBV's closed forms
from spectr_repro.theory.toy import toy_pair
from spectr_repro.verify.mpbv import _rank_keys, path_block_test

GRID_POINTS = 64  # SBV's default grid size; its span is [1, 50 max r]


def greedy_law(P, Q, c):
    """Law of the highest-ratio token among c i.i.d. Q draws (no ties on these toys)."""
    order = torch.sort(_rank_keys(P, Q), stable=True).indices
    ranked = Q[order]
    cumulative = ranked.cumsum(0)
    law = torch.empty_like(ranked)
    law[order] = cumulative**c - (cumulative - ranked) ** c
    return law


def sbv_law(P, Q, c):
    return selection_law(P, Q, choose_rho(P, Q, [c])[c], c) if c > 1 else Q.clone()


def rho_grid(P, Q):
    top = 50 * float((P / Q).max())
    return [math.exp(math.log(top) * k / (GRID_POINTS - 1)) for k in range(GRID_POINTS)] + [math.inf]


def sbv_with_greedy_point(P, Q, c):
    """SBV's per-count criterion over its grid plus rho = inf (greedy)."""
    best = max(rho_grid(P, Q), key=lambda rho: float(torch.minimum(selection_law(P, Q, rho, c), P).sum()))
    return selection_law(P, Q, best, c)


def _best_mixture(P, Q, both, w):
    """q_sel = both f(.; rho, 2) + (1 - both) Q with rho (grid + inf) maximising sum_v min(q_sel, w P)."""
    mixtures = [both * selection_law(P, Q, rho, 2) + (1 - both) * Q for rho in rho_grid(P, Q)]
    return max(mixtures, key=lambda law: float(torch.minimum(law, w * P).sum()))


def expected_accepted(target, draft, first, last, mixture_last=False) -> float:
    """E[tau] at K = 2, L = 2 of BV on the path selected by ``first`` at depth 1 and ``last`` at depth 2;
    ``mixture_last``: rho at depth 2 maximises the overlap of the count mixture with w1 * p instead."""
    V = target.vocab_size
    P0, Q0 = target.probs(()).double(), draft.probs(()).double()
    law1 = first(P0, Q0, 2)
    total = 0.0
    for x1 in range(V):
        P1, Q1 = target.probs((x1,)).double(), draft.probs((x1,)).double()
        both = float(Q0[x1] ** 2 / law1[x1])
        if mixture_last:
            law2 = _best_mixture(P1, Q1, both, min(1.0, float(P0[x1] / law1[x1])))
        else:
            law2 = both * last(P1, Q1, 2) + (1 - both) * Q1
        for x2 in range(V):
            targets = torch.stack([P0, P1, target.probs((x1, x2)).double()])
            h, _, _ = path_block_test(targets, torch.stack([law1, law2]), torch.tensor([x1, x2]))
            h1, h2 = float(h[1]), float(h[2])
            total += float(law1[x1] * law2[x2]) * (2 * h2 + h1 * (1 - h2))
    return total


def main() -> None:
    print("V seed |    SBV  greedy-last  greedy-first    MP-BV | proposed  proposed-MP-BV")
    for V in (2, 3, 4):
        for seed in (0, 1, 2):
            target, draft = toy_pair(V, seed)
            sbv = expected_accepted(target, draft, sbv_law, sbv_law)
            last = expected_accepted(target, draft, sbv_law, greedy_law)
            first = expected_accepted(target, draft, greedy_law, sbv_law)
            mpbv = expected_accepted(target, draft, greedy_law, greedy_law)
            proposed = expected_accepted(target, draft, sbv_with_greedy_point, None, mixture_last=True)
            print(f"{V} {seed:4d} | {sbv:.4f}  {last:11.4f}  {first:12.4f}  {mpbv:.4f} | {proposed:.4f}  "
                  f"{proposed - mpbv:+.4f}")


if __name__ == "__main__":
    main()
