"""SBV-F's ``selection="mixture"``: rho chosen for the count mixture BV sees, with the greedy point rho = inf.

Why (docs/theory.md, "Where MP-BV beats SBV-F"): BV on the selected path sees q_sel[i] = sum_c pi_i(c) f(.; rho_c, c),
the MIXTURE over the posterior of the survivor count, and accepts x_{i+1} against w_i p(.|x^i), w_i the selected
prefix's running clipped ratio. SBV picks each rho_c alone, to bring f(.; rho_c, c) close to p; but the c = 1 part
of the mixture is q itself, so where q is far below p on the high-ratio tokens the best mixture needs its c >= 2
part to overshoot towards them, up to the greedy selection (rho = inf, MP-BV's) which SBV's grid never reaches
(it stops at 50 max r). At the last depth sum_v min(q_sel(v), w_{L-1} p(v)) is exactly the part of E[tau] that
depth's law decides; before it, it is the one-step acceptance and a heuristic.

The choice at the prefix x^i: among (a) SBV's own rho_c (per count), (b) one rho for every count on SBV's grid,
(c) rho = inf (greedy), take the one maximising sum_v min(q_sel(v), w_i p(v)) on the ranked head (as SBV's
criterion does; ties: the first, SBV's own first). pi_i and w_i are functions of the selected prefix and the rows
along it, which every draft carrying the prefix shares, so the rule is still a deterministic function of the
prefix: SBV's closed forms (f for any rho, inf included; the count posterior; the candidates' laws of the
fallback) stay exact, and the rule stays lossless (checked exactly on toys: tests/verify/test_sbvf_mixture.py).
"""

from __future__ import annotations

import math

import torch

from spectr_repro.verify.common import running_ratio
from spectr_repro.verify.selection import (
    Head,
    Rules,
    best_rho,
    count_likelihoods_at,
    log_grid,
    selection_laws,
)

__all__ = ["mixture_rho", "prefix_state"]

_F64 = torch.float64


def prefix_state(rules: Rules, P_rows: torch.Tensor, Q_rows: torch.Tensor, prefix: torch.Tensor, K: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(pi [K] the law of the survivor count 1..K at the end of ``prefix``, w the running clipped ratio there)
    from the rules [i] and rows [i, V] along the prefix's i depths (i >= 1), prefix [i] the selected tokens.

    The same chain as ``selection.count_posterior`` (pi_0 = delta_K; pi_{m+1} proportional to pi_m lik_m, whose
    sum is q_sel[m](x_{m+1})), carried one depth further, and w_i = prod_m min(1, ...) of p(x_{m+1}) / q_sel[m](x_{m+1})
    as BV computes it (p normalised; q_sel on the tail = A Q / sum Q)."""
    i = prefix.shape[0]
    tokens = prefix[:, None]
    q_at = Q_rows.gather(1, tokens).squeeze(1).to(_F64) / rules.qsum
    p_at = P_rows.gather(1, tokens).squeeze(1).to(_F64) / rules.psum
    lik = count_likelihoods_at(rules, q_at, tokens)  # [i, K, K]: P(x_{m+1}, m' survivors | c)
    pi = torch.zeros(K, dtype=_F64, device=lik.device)
    pi[K - 1] = 1.0
    selected = []
    for depth in range(i):
        joint = pi @ lik[depth]
        selected.append(joint.sum())  # q_sel[depth](x_{depth+1}) > 0: x_{depth+1} was selected
        pi = joint / joint.sum()
    q_sel_at = torch.stack(selected)
    w = running_ratio(torch.nan_to_num(p_at / q_sel_at, nan=0.0, posinf=0.0))
    return pi, w[-1]


def mixture_rho(head: Head, pi: torch.Tensor, w: torch.Tensor, grid_size: int, K: int) -> torch.Tensor:
    """[1, K - 1] rho_c for the counts 2..K at one prefix (``head``: its ranked head, one row, taken as the whole
    vocabulary as in ``selection.best_rho``; pi [K] the count law there, w the running ratio): the candidate of
    (SBV's own rho_c, one common rho on SBV's grid, inf) whose mixture q_sel = sum_c pi(c) f_c has the largest
    overlap sum_v min(q_sel(v), w p(v))."""
    C = K - 1
    own = best_rho(head, grid_size, K)  # [1, C]
    common = torch.cat([log_grid(head.r, grid_size), head.r.new_full((1, 1), math.inf)], 1)  # [1, G + 1]
    candidates = torch.cat([own, common.T.expand(-1, C)])  # [1 + G + 1, C]
    law = selection_laws(head.p, head.q, candidates.T[None], K, missing=1.0 - head.q.sum(-1))["law"][0]  # [C, n, N]
    mixture = pi[0] * head.q + torch.einsum("c,cnv->nv", pi[1:].to(law.dtype), law)  # [n, N]
    overlap = torch.minimum(mixture, w * head.p).sum(-1)
    return candidates[int(overlap.argmax())][None]
