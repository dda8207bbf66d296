"""SBV — selection block verification (ours; lossless for any K).

Two stages per iteration (derivation in docs/sbv.md):

1. *Select* one path x = (x_1..x_L) through the K drafts, top-down. At depth i (prefix z = x^i,
   survivors S = the drafts whose first i tokens equal z, k = |S|), with P = p(.|z), Q = q(.|z) and
   tokens ranked by r = P/Q ascending (ties: lower id first; r = +inf where Q = 0): scan the survivors in
   draft order, accepting survivor j's token with probability min(1, P/(rho_k Q)) at that token; if none
   is accepted take the survivor token of highest rank. The selected token's law given k = c survivors is

       f(v; rho, c) = Q(v) a(v) (1 - (1 - alpha)^c) / alpha + G(v)^c - G^-(v)^c,
       a = min(1, P/(rho Q)),  alpha = sum Q a,  G = cumsum of Q (1 - a) in rank order,  G^- = G - Q (1 - a),

   and rho_c is the point of a log grid over [1, 50 max r] maximising sum_v min(f(v; rho, c), P(v)).
   The survivor count is random, so the law of x_{i+1} given the selected prefix alone is
   q_sel[i] = sum_c pi(c) f(.; rho_c, c), pi = the exact posterior of the count given z (updated after
   each depth). ``count_posterior=False`` uses f(.; rho_k, k) at the observed count instead.
2. Run plain block verification (BV) on the selected path with q_sel as the draft law.

Shapes: draft_tokens [K, L], draft_probs [K, L, V], target_probs [K, L+1, V] (see verify.base).
Powers and cumulative sums are float64.

Cost (V large). The sampler never sorts the whole vocabulary on the common path:
- rho_c is chosen from the ``head_size`` tokens of largest P + Q (every token when V <= head_size,
  which is exactly METHODS.md's rule); any deterministic choice of rho keeps the method valid because
  f is evaluated exactly for the chosen rho;
- the selection and the posterior need f only at the selected token: one masked sum over V;
- BV's stop probabilities h_i and its residual need q_sel on the whole vocabulary; the sampler brackets
  q_sel between bounds that need no sort (the head is ranked exactly, the tail's rank is bounded), decides
  "eta_i <= h_i" from the bounds, and only computes the exact q_sel (one sort) in the rare event that the
  uniform falls between them. The residual is drawn by rejection from the bound's envelope, each
  candidate checked with its exact value. The draws therefore follow the exact law.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from spectr_repro.sampling import sample, uniform
from spectr_repro.verify.base import Outcome, Verifier, VerifyResult

__all__ = [
    "SelectionBlockVerification",
    "DepthRule",
    "choose_rho",
    "count_likelihood",
    "selection_law",
]

SELECTIONS = ("randomized", "greedy")
_MAX_RESIDUAL_TRIES = 32
_CACHE_MAX_VOCAB = 64  # memoise per-depth rules only for toy vocabularies
_CACHE_MAX_ENTRIES = 100_000


def _rank_key(P: torch.Tensor, Q: torch.Tensor) -> torch.Tensor:
    """r = P/Q, +inf where Q = 0 (such tokens are never drafted; their f is 0 whatever their rank)."""
    return torch.where(Q > 0, P / torch.where(Q > 0, Q, torch.ones_like(Q)), torch.full_like(P, math.inf))


def _rank_order(r: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
    """Positions of ``r`` in rank order: r ascending, ties broken by lower token id.

    ``ids`` (same length as r, ascending) are the token ids when r is a subset of the vocabulary.
    """
    # torch's stable sort keeps the input order among equal keys; the input is in ascending id order.
    del ids
    return torch.sort(r, stable=True).indices


def _power_difference(g: torch.Tensor, g_minus: torch.Tensor, c: int) -> torch.Tensor:
    """g^c - g_minus^c without cancellation: (g - g_minus) * sum_j g^(c-1-j) g_minus^j."""
    total = torch.zeros_like(g)
    for j in range(c):
        total = total + g.pow(c - 1 - j) * g_minus.pow(j)
    return (g - g_minus) * total


def _accept_scale(alpha: torch.Tensor | float, c: int):
    """A = (1 - (1 - alpha)^c) / alpha, with its limit c at alpha = 0 (then Q a = 0 everywhere anyway)."""
    if isinstance(alpha, torch.Tensor):
        safe = torch.where(alpha > 0, alpha, torch.ones_like(alpha))
        return torch.where(alpha > 0, (1 - (1 - alpha).pow(c)) / safe, torch.full_like(alpha, float(c)))
    return (1 - (1 - alpha) ** c) / alpha if alpha > 0 else float(c)


def _accepted_mass(P: torch.Tensor, Q: torch.Tensor, rho: torch.Tensor | float) -> torch.Tensor:
    """Q a = min(Q, P/rho); 0 everywhere when rho = +inf (the greedy selection)."""
    if isinstance(rho, float) and math.isinf(rho):
        return torch.zeros_like(Q)
    return torch.minimum(Q, P / rho)


def selection_law(P: torch.Tensor, Q: torch.Tensor, rho: float, c: int) -> torch.Tensor:
    """Closed-form law f(.; rho, c) [V] of the selected token among c i.i.d. Q-draws (exact, one sort)."""
    P = P.double()
    Q = Q.double()
    if c == 1:
        return Q.clone()
    m = _accepted_mass(P, Q, rho)
    d = Q - m
    alpha = m.sum()
    order = _rank_order(_rank_key(P, Q))
    d_sorted = d[order]
    g = torch.cumsum(d_sorted, 0)
    g_minus = g - d_sorted
    fallback = torch.empty_like(d)
    fallback[order] = _power_difference(g, g_minus, c)
    return m * _accept_scale(alpha, c) + fallback


def choose_rho(
    P: torch.Tensor, Q: torch.Tensor, counts: list[int], grid_size: int = 64, head_size: int = 1024
) -> dict[int, float]:
    """rho_c for each count c >= 2: the log-grid point over [1, 50 max r] maximising sum_v min(f, P).

    One batched [grid x head] evaluation per count and one sort of the head. The head is the
    ``head_size`` tokens of largest P + Q (the whole vocabulary when V <= head_size, i.e. exactly the
    METHODS.md rule); on larger vocabularies the objective ignores the tail's negligible mass, which
    changes which grid point wins at most marginally and never validity (f is exact for any rho).
    """
    counts = [c for c in counts if c >= 2]
    if not counts:
        return {}
    P = P.double()
    Q = Q.double()
    V = P.shape[-1]
    if V > head_size:
        ids = torch.topk(P + Q, head_size).indices.sort().values
        P, Q = P[ids], Q[ids]
    r = _rank_key(P, Q)
    order = _rank_order(r)
    Ps, Qs, rs = P[order], Q[order], r[order]
    finite = rs[torch.isfinite(rs)]
    r_max = max(float(finite.max()), 1.0) if finite.numel() else 1.0
    grid = torch.exp(torch.linspace(0.0, math.log(50.0 * r_max), grid_size, dtype=torch.float64, device=P.device))
    m = torch.minimum(Qs.unsqueeze(0), Ps.unsqueeze(0) / grid.unsqueeze(1))  # [grid, head]
    d = Qs.unsqueeze(0) - m
    alpha = m.sum(-1, keepdim=True)
    g = torch.cumsum(d, -1)
    g_minus = g - d
    rhos: dict[int, float] = {}
    values = grid.tolist()
    for c in counts:
        f = m * _accept_scale(alpha, c) + _power_difference(g, g_minus, c)
        objective = torch.minimum(f, Ps.unsqueeze(0)).sum(-1)
        rhos[c] = values[int(torch.argmax(objective))]  # argmax returns the first maximum
    return rhos


def count_likelihood(q_v: float, a_v: float, alpha: float, g_minus_v: float, c: int) -> list[float]:
    """[P(v selected and m of the c survivors carry v) for m = 0..c] (entry 0 is 0).

    Accepted at draw j: draws 1..j-1 rejected (each carries v with probability s_v given rejection),
    draws j+1..c free (each carries v with probability Q(v)): m - 1 ~ Bin(j-1, s_v) + Bin(c-j, Q(v)).
    No draw accepted and v of top rank: C(c, m) (Q(v)(1 - a(v)))^m G^-(v)^(c - m).
    """
    out = [0.0] * (c + 1)
    reject_v = q_v * (1.0 - a_v)  # P(a draw is v and rejected)
    reject = 1.0 - alpha
    s_v = reject_v / reject if reject > 0 else 0.0
    accept_v = q_v * a_v
    if accept_v > 0:
        for j in range(1, c + 1):
            weight = reject ** (j - 1) * accept_v
            if weight == 0:
                continue
            before = [math.comb(j - 1, t) * s_v**t * (1 - s_v) ** (j - 1 - t) for t in range(j)]
            after = [math.comb(c - j, t) * q_v**t * (1 - q_v) ** (c - j - t) for t in range(c - j + 1)]
            for t1, b1 in enumerate(before):
                for t2, b2 in enumerate(after):
                    out[1 + t1 + t2] += weight * b1 * b2
    if reject_v > 0:
        for m in range(1, c + 1):
            out[m] += math.comb(c, m) * reject_v**m * g_minus_v ** (c - m)
    return out


@dataclass
class DepthRule:
    """The selection rule at one depth: P = p(.|z), Q = q(.|z) (float64 [V]) and rho per count."""

    P: torch.Tensor
    Q: torch.Tensor
    rho: dict[int, float]
    r: torch.Tensor = field(init=False)
    _m: dict[int, torch.Tensor] = field(init=False, default_factory=dict)
    _alpha: dict[int, float] = field(init=False, default_factory=dict)
    _laws: dict[int, torch.Tensor] = field(init=False, default_factory=dict)
    _mixtures: dict[tuple, torch.Tensor] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.r = _rank_key(self.P, self.Q)

    def accepted(self, c: int) -> torch.Tensor:
        """Q a = min(Q, P/rho_c) [V]."""
        if c not in self._m:
            self._m[c] = _accepted_mass(self.P, self.Q, self.rho[c])
        return self._m[c]

    def alpha(self, c: int) -> float:
        if c not in self._alpha:
            self._alpha[c] = float(self.accepted(c).sum())
        return self._alpha[c]

    def precedes(self, v: int) -> torch.Tensor:
        """Boolean [V]: tokens ranked strictly below v."""
        ids = torch.arange(self.r.shape[0], device=self.r.device)
        rv = self.r[v]
        return (self.r < rv) | ((self.r == rv) & (ids < v))

    def token_terms(self, c: int, v: int, below: torch.Tensor) -> tuple[float, float, float, float]:
        """(Q(v), a(v), alpha, G^-(v)) for count c; ``below`` = self.precedes(v)."""
        q_v = float(self.Q[v])
        if c == 1:
            return q_v, 1.0, 1.0, 0.0
        m = self.accepted(c)
        a_v = float(m[v]) / q_v if q_v > 0 else 0.0
        g_minus = float(((self.Q - m) * below).sum())
        return q_v, min(a_v, 1.0), self.alpha(c), g_minus

    def token_law(self, c: int, v: int, below: torch.Tensor) -> float:
        """f(v; rho_c, c) at one token (exact; one masked sum over V)."""
        q_v, a_v, alpha, g_minus = self.token_terms(c, v, below)
        if c == 1:
            return q_v
        d_v = q_v * (1 - a_v)
        g = g_minus + d_v
        return q_v * a_v * _accept_scale(alpha, c) + float(
            _power_difference(torch.tensor(g, dtype=torch.float64), torch.tensor(g_minus, dtype=torch.float64), c)
        )

    def law(self, c: int) -> torch.Tensor:
        """f(.; rho_c, c) on the whole vocabulary (exact; one sort)."""
        if c not in self._laws:
            self._laws[c] = selection_law(self.P, self.Q, self.rho.get(c, 1.0), c)
        return self._laws[c]

    def mixture(self, weights: dict[int, float]) -> torch.Tensor:
        """sum_c weights[c] f(.; rho_c, c) [V]."""
        key = tuple(sorted(weights.items()))
        if key not in self._mixtures:
            out = torch.zeros_like(self.P)
            for c, w in key:
                if w > 0:
                    out = out + w * self.law(c)
            self._mixtures[key] = out
        return self._mixtures[key]

    def accept_probability(self, c: int, token: int) -> float:
        """min(1, P/(rho_c Q)) at ``token`` (a drafted token, so Q > 0)."""
        if c == 1:
            return 1.0
        q = float(self.Q[token])
        return min(1.0, float(self.accepted(c)[token]) / q) if q > 0 else 0.0

    def top_rank(self, tokens: list[int]) -> int:
        """The token of highest rank (largest r; ties: larger id) among ``tokens``."""
        rs = self.r[torch.tensor(tokens, device=self.r.device)].tolist()
        return max(zip(rs, tokens))[1]


class SelectionBlockVerification(Verifier):
    """SBV: select one path through the K drafts with a known law, then BV on it (lossless).

    Options: ``count_posterior`` (default True: q_sel mixes f over the posterior of the survivor count;
    False: f at the observed count), ``selection`` ("randomized" = METHODS.md; "greedy" = always the
    highest-ratio survivor token, i.e. greedy multi-path BV), ``grid_size`` (points of the rho grid),
    ``head_size`` (tokens used to choose rho and ranked exactly by the sampler's bounds).
    """

    name = "sbv"
    lossless = True
    claimed_lossless = True
    single_draft = False

    def __init__(
        self,
        check_inputs: bool = True,
        count_posterior: bool = True,
        selection: str = "randomized",
        grid_size: int = 64,
        head_size: int = 1024,
        **options,
    ) -> None:
        super().__init__(check_inputs=check_inputs, **options)
        if selection not in SELECTIONS:
            raise ValueError(f"sbv: selection must be one of {SELECTIONS}, got {selection!r}")
        if grid_size < 1 or head_size < 1:
            raise ValueError(f"sbv: grid_size and head_size must be >= 1, got {grid_size}, {head_size}")
        self.count_posterior = bool(count_posterior)
        self.selection = selection
        self.grid_size = int(grid_size)
        self.head_size = int(head_size)
        self._rules: dict[tuple, DepthRule] = {}

    # ---------------------------------------------------------------- selection, shared by both paths
    def _depth_rule(self, P: torch.Tensor, Q: torch.Tensor, counts: list[int]) -> DepthRule:
        P = P.double()
        Q = Q.double()
        counts = sorted(set(counts))
        # Toy vocabularies revisit the same (P, Q) many times in an exact law: memoise them there.
        key = None
        if P.shape[-1] <= _CACHE_MAX_VOCAB:
            key = (P.cpu().numpy().tobytes(), Q.cpu().numpy().tobytes(), tuple(counts))
            if key in self._rules:
                return self._rules[key]
        if self.selection == "greedy":
            rho = {c: math.inf for c in counts if c >= 2}
        else:
            rho = choose_rho(P, Q, counts, self.grid_size, self.head_size)
        rule = DepthRule(P, Q, rho)
        if key is not None:
            if len(self._rules) >= _CACHE_MAX_ENTRIES:
                self._rules.clear()
            self._rules[key] = rule
        return rule

    def _counts_needed(self, posterior: dict[int, float], k: int) -> list[int]:
        if self.count_posterior:
            return sorted(c for c, w in posterior.items() if w > 0)
        return [k]

    def _weights(self, posterior: dict[int, float], k: int) -> dict[int, float]:
        return dict(posterior) if self.count_posterior else {k: 1.0}

    def _update_posterior(self, rule: DepthRule, posterior: dict[int, float], v: int, below) -> dict[int, float]:
        """Posterior of the number of survivors carrying v, given the selected prefix and v."""
        new: dict[int, float] = {}
        for c, w in posterior.items():
            if w <= 0:
                continue
            q_v, a_v, alpha, g_minus = rule.token_terms(c, v, below)
            if c == 1:
                lik = [0.0, q_v]
            else:
                lik = count_likelihood(q_v, a_v, alpha, g_minus, c)
            for m, value in enumerate(lik):
                if value > 0:
                    new[m] = new.get(m, 0.0) + w * value
        total = sum(new.values())
        return {m: value / total for m, value in new.items()} if total > 0 else {1: 1.0}

    # ---------------------------------------------------------------- sampler
    def _sample(self, draft_tokens, draft_probs, target_probs, generator, state) -> VerifyResult:
        K, L = draft_tokens.shape
        device = draft_probs.device
        tokens = draft_tokens.tolist()  # one transfer; the selection branches on token values
        survivors = list(range(K))
        posterior = {K: 1.0}
        path: list[int] = []
        rules: list[DepthRule] = []
        weights: list[dict[int, float]] = []
        q_path: list[float] = []  # q_sel[i](x_{i+1})
        for i in range(L):
            k = len(survivors)
            row = survivors[0]
            rule = self._depth_rule(target_probs[row, i], draft_probs[row, i], self._counts_needed(posterior, k) + [k])
            candidates = [tokens[j][i] for j in survivors]
            v = candidates[0]
            if k > 1:
                u = uniform(k, generator, device=device).tolist()
                chosen = None
                for j, token in enumerate(candidates):
                    if u[j] < rule.accept_probability(k, token):
                        chosen = token
                        break
                v = chosen if chosen is not None else rule.top_rank(candidates)
            below = rule.precedes(v)
            mix = self._weights(posterior, k)
            q_path.append(sum(w * rule.token_law(c, v, below) for c, w in mix.items() if w > 0))
            rules.append(rule)
            weights.append(mix)
            if self.count_posterior:
                posterior = self._update_posterior(rule, posterior, v, below)
            path.append(v)
            survivors = [j for j in survivors if tokens[j][i] == v]
        row = survivors[0]
        bonus_target = target_probs[row, L].double()

        # Block verification on the selected path, scanned from the back: the first success from the
        # back is the largest i with eta_i <= h_i, so depths below the stop are never evaluated.
        w = [1.0]
        for i in range(L):
            p_x = float(rules[i].P[path[i]])
            w.append(min(1.0, w[-1] * p_x / q_path[i]) if q_path[i] > 0 else 0.0)
        eta = uniform(L, generator, device=device).tolist()
        tau = 0
        q_tau = None
        if eta[L - 1] <= w[L]:
            tau = L
        else:
            for i in range(L - 1, 0, -1):
                q_sel = rules[i].mixture(weights[i])
                z = float((w[i] * rules[i].P - q_sel).clamp_min(0).sum())
                denominator = z + 1.0 - w[i]
                h = z / denominator if denominator > 0 else 1.0
                if eta[i - 1] <= h:
                    tau, q_tau = i, q_sel
                    break
        if tau == L:
            extra = int(sample(bonus_target, generator))
        else:
            if q_tau is None:
                q_tau = rules[tau].mixture(weights[tau])
            residual = (w[tau] * rules[tau].P - q_tau).clamp_min(0)
            extra = int(sample(residual if float(residual.sum()) > 0 else rules[tau].P, generator))
        out = torch.tensor(path[:tau] + [extra], dtype=torch.long, device=draft_tokens.device)
        return VerifyResult(tokens=out, num_accepted=tau, draft_index=row, state=None)

    # ---------------------------------------------------------------- exact law
    def _law(self, draft_tokens, draft_probs, target_probs, state) -> list[Outcome]:
        K, L = draft_tokens.shape
        tokens = draft_tokens.tolist()
        law: dict[tuple[int, ...], float] = {}

        def descend(i, survivors, posterior, path, prob, q_rows):
            if i == L:
                self._bv_law(path, q_rows, target_probs, survivors[0], prob, law)
                return
            k = len(survivors)
            row = survivors[0]
            rule = self._depth_rule(target_probs[row, i], draft_probs[row, i], self._counts_needed(posterior, k) + [k])
            q_sel = rule.mixture(self._weights(posterior, k))
            candidates = [tokens[j][i] for j in survivors]
            for v, p_v in self._selection_events(rule, k, candidates).items():
                if p_v <= 0:
                    continue
                new_posterior = (
                    self._update_posterior(rule, posterior, v, rule.precedes(v)) if self.count_posterior else posterior
                )
                descend(
                    i + 1,
                    [j for j in survivors if tokens[j][i] == v],
                    new_posterior,
                    path + [v],
                    prob * p_v,
                    q_rows + [(rule.P, q_sel)],
                )

        descend(0, list(range(K)), {K: 1.0}, [], 1.0, [])
        return [Outcome(probability=p, tokens=t) for t, p in law.items() if p > 0]

    def _selection_events(self, rule: DepthRule, k: int, candidates: list[int]) -> dict[int, float]:
        """Law of the selected token given the survivors' tokens (scan in draft order, then top rank)."""
        events: dict[int, float] = {}
        if k == 1:
            return {candidates[0]: 1.0}
        none_accepted = 1.0
        for token in candidates:
            a = rule.accept_probability(k, token)
            events[token] = events.get(token, 0.0) + none_accepted * a
            none_accepted *= 1.0 - a
        top = rule.top_rank(candidates)
        events[top] = events.get(top, 0.0) + none_accepted
        return events

    @staticmethod
    def _bv_law(path, q_rows, target_probs, row, prob, law) -> None:
        """Add prob x (BV's law on ``path`` with draft laws q_rows[i] = (P_i, q_sel_i)) into ``law``."""
        L = len(path)
        w = [1.0]
        for i in range(L):
            P, q_sel = q_rows[i]
            q_x = float(q_sel[path[i]])
            w.append(min(1.0, w[-1] * float(P[path[i]]) / q_x) if q_x > 0 else 0.0)
        h = [1.0] * (L + 1)
        residuals = [None] * (L + 1)
        for i in range(L):
            P, q_sel = q_rows[i]
            residual = (w[i] * P - q_sel).clamp_min(0)
            z = float(residual.sum())
            denominator = z + 1.0 - w[i]
            h[i] = z / denominator if denominator > 0 else 1.0
            residuals[i] = residual / z if z > 0 else P
        h[0] = 1.0
        h[L] = w[L]
        residuals[L] = target_probs[row, L].double()
        survive = 1.0  # P(no success at depths > i)
        for i in range(L, -1, -1):
            stop = survive * h[i]
            survive *= 1.0 - h[i]
            if stop <= 0:
                continue
            prefix = tuple(path[:i])
            for y, p_y in enumerate(residuals[i].tolist()):
                if p_y > 0:
                    key = prefix + (y,)
                    law[key] = law.get(key, 0.0) + prob * stop * p_y
