"""Readable per-row views of the selection core's closed forms (``spectr_repro.verify.selection``).

``DepthRule``, ``selection_law``, ``choose_rho`` and ``count_likelihood`` evaluate, for one pair P = p(.|z),
Q = q(.|z), what the verifier computes in batches: f(.; rho, c), the rho choice, the count likelihood. The tests
compare them with enumerations of c i.i.d. draws and with the scan (tests/verify/test_sbv.py); the scripts that
study selections depth by depth (scripts/mpbv_vs_sbv_by_depth.py) use them as they are.
"""

from __future__ import annotations

import math

import torch

from spectr_repro.verify.selection import (
    DEFAULT_GRID_SIZE,
    DEFAULT_HEAD_SIZE,
    DEFAULT_TAIL_THRESHOLD,
    Rules,
    _count_likelihoods,
    _locate,
    _mixture,
    _selected_law_rows,
    best_rho,
    ranked_head,
    rules_at,
    single_draft_rules,
)

_F64 = torch.float64


class DepthRule:
    """The rule at one depth for one pair P = p(.|z), Q = q(.|z) ([V]), with ``rho`` = {count: rho_c} given.

    A readable per-row view of the closed forms the verifier evaluates in batches (tests, other rules).
    ``head_size`` None ranks every token with P + Q >= tail_threshold (the verifier caps the ranked set at
    its rank_size). Counts missing from ``rho`` use rho = +inf (the greedy selection).
    """

    def __init__(self, P, Q, tail_threshold: float = DEFAULT_TAIL_THRESHOLD, rho: dict | None = None,
                 head_size: int | None = None) -> None:
        self.P, self.Q, self.tail_threshold, self.head_size = P, Q, tail_threshold, head_size
        self.rho: dict[int, float] = dict(rho or {})
        self._head = ranked_head(P[None], Q[None], head_size, tail_threshold)
        self.ranked = self._head.ids[0][self._head.ranked[0]].sort().values  # ranked token ids, ascending
        self.has_tail = self.ranked.shape[0] < P.shape[-1]
        self.P_ranked = P[self.ranked] / self._head.psum  # normalised, float64
        self.Q_ranked = Q[self.ranked] / self._head.qsum

    def _rules(self, K: int) -> Rules:
        if K < 2:
            return single_draft_rules(self._head)
        rho = torch.tensor([[self.rho.get(c, math.inf) for c in range(2, K + 1)]], dtype=_F64, device=self.P.device)
        return rules_at(self._head, rho, K)

    def full(self, weights: dict[int, float]) -> torch.Tensor:
        """q_sel = sum_c w_c f_c on the whole vocabulary, float64 [V] (weights: a law over counts, normalised)."""
        K = max(weights)
        w = torch.zeros(1, K, dtype=_F64, device=self.P.device)
        for c, value in weights.items():
            w[0, c - 1] = value
        rules = self._rules(K)
        head, tail_scale = _mixture(rules, w / w.sum())
        return _selected_law_rows(self.Q[None], rules.ids, rules.ranked, head, tail_scale / rules.qsum)[0]

    def law(self, c: int) -> torch.Tensor:
        """f(.; rho_c, c) on the whole vocabulary, float64 [V]."""
        return self.full({c: 1.0})

    def token_terms(self, c: int, v: int) -> tuple[float, float, float, float]:
        """(Q(v), a(v), alpha, G^-(v)) for count c (a = 1 and G^- = 0 on the tail)."""
        q_v = float(self.Q[v]) / float(self._head.qsum)
        if c == 1:
            return q_v, 1.0, 1.0, 0.0
        rules = self._rules(c)
        position, ranked = _locate(rules, torch.tensor([[v]], device=self.P.device))
        alpha = 1.0 - float(rules.reject[0, c - 2])
        if not bool(ranked):
            return q_v, 1.0, alpha, 0.0
        j = int(position)
        a_v = float(rules.accepted[0, c - 2, j]) / q_v if q_v > 0 else 0.0  # Q = 0: never drafted
        return q_v, a_v, alpha, float(rules.g_minus[0, c - 2, j])

    def accept_probability(self, c: int, token: int) -> float:
        """a = min(1, P/(rho_c Q)) at a drafted ``token`` (1 for a tail token or a single survivor)."""
        return self.token_terms(c, token)[1]


def selection_law(
    P: torch.Tensor, Q: torch.Tensor, rho: float, c: int, tail_threshold: float = DEFAULT_TAIL_THRESHOLD
) -> torch.Tensor:
    """Closed-form law f(.; rho, c), float64 [V], of the token selected among c i.i.d. Q-draws."""
    if c == 1:
        return Q.double().clone()
    return DepthRule(P, Q, tail_threshold, {c: rho}).law(c)


def choose_rho(
    P: torch.Tensor, Q: torch.Tensor, counts: list[int], grid_size: int = DEFAULT_GRID_SIZE,
    head_size: int = DEFAULT_HEAD_SIZE,
) -> dict[int, float]:
    """rho_c for each count c >= 2: the log-grid point over [1, 50 max r] maximising sum_v min(f, P).

    P, Q: float64 [n] over tokens in ascending id order, used as given (not renormalised). The head is the
    ``head_size`` tokens of largest P + Q (all of them when n <= head_size, i.e. exactly the docs/methods.md
    rule), and f is evaluated on the head alone (alpha = the head's accepted mass). Ties: the smallest rho.
    """
    counts = [c for c in counts if c >= 2]
    if not counts:
        return {}
    if P.shape[-1] == 0:
        return {c: 1.0 for c in counts}
    head = ranked_head(P[None], Q[None], head_size, 0.0, normalise=False)
    values = best_rho(head, grid_size, max(counts))[0].tolist()
    return {c: values[c - 2] for c in counts}


def count_likelihood(q_v: float, a_v: float, alpha: float, g_minus_v: float, c: int) -> list[float]:
    """[P(v selected and m of the c survivors carry v) for m = 0..c] (entry 0 is 0); sums to f(v).

    Accepted at draw j: draws 1..j-1 rejected (each carries v with probability s_v given rejection),
    draws j+1..c free (each carries v with probability Q(v)): m - 1 ~ Bin(j-1, s_v) + Bin(c-j, Q(v)).
    No draw accepted and v of top rank: C(c, m) (Q(v)(1 - a(v)))^m G^-(v)^(c - m).
    """
    row = lambda x: torch.full((1, c), float(x), dtype=_F64)  # noqa: E731 - the same value at every count
    lik = _count_likelihoods(torch.tensor([float(q_v)], dtype=_F64), row(a_v), row(1.0 - alpha), row(g_minus_v))
    return [0.0] + lik[0, c - 1].tolist()

__all__ = ["DepthRule", "choose_rho", "count_likelihood", "selection_law"]
