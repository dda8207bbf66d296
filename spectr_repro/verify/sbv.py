"""SBV — selection block verification (ours; lossless for any K). Derivation: docs/sbv.md.

Two stages per iteration:

1. *Select* one path x = (x_1..x_L) through the K drafts, top-down. At depth i (prefix z = x^i,
   survivors S = the drafts whose first i tokens equal z, k = |S|), with P = p(.|z), Q = q(.|z) and
   tokens ranked by r = P/Q ascending (ties: lower id first; r = +inf where Q = 0): scan the survivors in
   draft order, accepting survivor j's token with probability a = min(1, P/(rho_k Q)) at that token; if
   none is accepted take the survivor token of highest rank. Given c survivors the selected token has law

       f(v; rho, c) = Q(v) a(v) (1 - (1 - alpha)^c) / alpha + G(v)^c - G^-(v)^c,
       alpha = sum Q a,  G = cumsum of Q (1 - a) in rank order,  G^- = G - Q (1 - a),

   and rho_c is the point of a log grid over [1, 50 max r] maximising sum_v min(f(v; rho, c), P(v)).
   The survivor count is random, so the law of x_{i+1} given the selected prefix alone is
   q_sel[i] = sum_c pi(c) f(.; rho_c, c), pi = the exact posterior of the count given z, updated after
   each depth. ``count_posterior=False`` uses f(.; rho_k, k) at the observed count instead (also valid).
2. Run plain block verification (BV) on the selected path with q_sel as the draft law.

Shapes: draft_tokens [K, L], draft_probs [K, L, V], target_probs [K, L+1, V] (see verify.base).
Powers and cumulative sums are float64.

Large vocabularies. The closed form above holds for ANY acceptance function a(.) in [0, 1] and any
total order, which lets the rule skip ranking the long tail: tokens with P + Q < ``tail_threshold``
(1e-6 by default) are accepted whenever drafted (a = 1), so they never enter G and need no rank; their
f is Q A exactly. Only the "ranked" tokens (P + Q >= threshold, a few thousand at most in practice)
are sorted, once per depth. On every toy vocabulary (all probabilities >= 1e-4) nothing is below the
threshold and the rule is exactly METHODS.md's. rho_c is chosen on the ``head_size`` ranked tokens of
largest P + Q (all of them when there are at most that many, again exactly METHODS.md's rule); any
deterministic choice of rho keeps the method valid, since f is evaluated exactly for the chosen rho.
The sampler needs full-vocabulary passes only to split the tail off at each depth, for BV's stop
probability when a bracket on the tail's share does not decide it, and for the final residual or bonus.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from spectr_repro.sampling import sample, uniform
from spectr_repro.verify.base import Outcome, Verifier, VerifyResult

__all__ = [
    "DepthRule",
    "SelectionBlockVerification",
    "choose_rho",
    "count_likelihood",
    "selection_law",
]

SELECTIONS = ("randomized", "greedy")
DEFAULT_TAIL_THRESHOLD = 1e-6
_CACHE_MAX_VOCAB = 64  # memoise per-depth rules only for toy vocabularies
_CACHE_MAX_ENTRIES = 100_000


def _rank_key(P: torch.Tensor, Q: torch.Tensor) -> torch.Tensor:
    """r = P/Q, +inf where Q = 0 (such tokens are never drafted; their f is 0 whatever their rank)."""
    return torch.nan_to_num(P / Q, nan=math.inf, posinf=math.inf)  # P/0 = inf; 0/0 = nan -> inf


def _rank_order(r: torch.Tensor) -> torch.Tensor:
    """Positions of ``r`` (given in ascending token id) in rank order: r ascending, ties lower id first."""
    return torch.sort(r, stable=True).indices  # a stable sort keeps ascending ids among equal keys


def _power_difference(g: torch.Tensor, g_minus: torch.Tensor, c: int) -> torch.Tensor:
    """g^c - g_minus^c without cancellation: (g - g_minus) * sum_j g^(c-1-j) g_minus^j."""
    total = torch.zeros_like(g)
    for j in range(c):
        total = total + g.pow(c - 1 - j) * g_minus.pow(j)
    return (g - g_minus) * total


def _accept_scale(alpha, c: int):
    """A = (1 - (1 - alpha)^c) / alpha, with its limit c at alpha = 0 (then Q a = 0 everywhere anyway)."""
    if isinstance(alpha, torch.Tensor):
        safe = torch.where(alpha > 0, alpha, torch.ones_like(alpha))
        return torch.where(alpha > 0, (1 - (1 - alpha).pow(c)) / safe, torch.full_like(alpha, float(c)))
    return (1 - (1 - alpha) ** c) / alpha if alpha > 0 else float(c)


def _accepted_mass(P: torch.Tensor, Q: torch.Tensor, rho: float) -> torch.Tensor:
    """Q a = min(Q, P/rho); 0 everywhere when rho = +inf (the greedy selection)."""
    if math.isinf(rho):
        return torch.zeros_like(Q)
    return torch.minimum(Q, P / rho)


def choose_rho(
    P: torch.Tensor, Q: torch.Tensor, counts: list[int], grid_size: int = 64, head_size: int = 256
) -> dict[int, float]:
    """rho_c for each count c >= 2: the log-grid point over [1, 50 max r] maximising sum_v min(f, P).

    P, Q: float64 [n] over tokens in ascending id order. One sort of the head and one batched
    [grid x head] evaluation per count; the head is the ``head_size`` tokens of largest P + Q (all of
    them when n <= head_size, i.e. exactly the METHODS.md rule). Ties: the smallest rho wins.
    """
    counts = [c for c in counts if c >= 2]
    if not counts:
        return {}
    if P.shape[-1] == 0:
        return {c: 1.0 for c in counts}
    if P.shape[-1] > head_size:
        ids = torch.topk(P + Q, head_size).indices.sort().values
        P, Q = P[ids], Q[ids]
    r = _rank_key(P, Q)
    order = _rank_order(r)
    Ps, Qs, rs = P[order], Q[order], r[order]
    finite = rs[torch.isfinite(rs)]
    r_max = max(float(finite.max()), 1.0) if finite.numel() else 1.0
    log_grid = torch.linspace(0.0, math.log(50.0 * r_max), grid_size, dtype=torch.float64, device=P.device)
    grid = torch.exp(log_grid)
    m = torch.minimum(Qs.unsqueeze(0), Ps.unsqueeze(0) / grid.unsqueeze(1))  # [grid, head]
    d = Qs.unsqueeze(0) - m
    alpha = m.sum(-1, keepdim=True)
    g = torch.cumsum(d, -1)
    g_minus = g - d
    values = grid.tolist()
    rhos: dict[int, float] = {}
    for c in counts:
        f = m * _accept_scale(alpha, c) + _power_difference(g, g_minus, c)
        objective = torch.minimum(f, Ps.unsqueeze(0)).sum(-1)
        rhos[c] = values[int(torch.argmax(objective))]  # argmax returns the first maximum
    return rhos


def count_likelihood(q_v: float, a_v: float, alpha: float, g_minus_v: float, c: int) -> list[float]:
    """[P(v selected and m of the c survivors carry v) for m = 0..c] (entry 0 is 0); sums to f(v).

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
    """The selection rule at one depth, for P = p(.|z), Q = q(.|z) ([V], any float dtype).

    ``ranked`` = the token ids with P + Q >= tail_threshold (ascending); everything per count is
    computed on them in float64. The other tokens (the tail, masses P_tail and Q_tail) have a = 1 and
    f = Q A. ``rho`` maps each count c >= 2 to rho_c (inf = greedy); set it before the first law.
    Only the ranked tokens that some count can reject (d = Q - min(Q, P/rho) > 0 at the largest rho,
    hence at every rho) are sorted: the others add nothing to G and their f is Q A too.
    """

    P: torch.Tensor
    Q: torch.Tensor
    tail_threshold: float = DEFAULT_TAIL_THRESHOLD
    rho: dict[int, float] = field(default_factory=dict)
    _per_count: dict[int, tuple] = field(init=False, default_factory=dict)
    _mixtures: dict[tuple, tuple] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        V = self.P.shape[-1]
        # Rows are renormalised in float64: float32 softmax rows over 150k tokens sum to 1 only within
        # ~1e-5, and the tokens were drawn from the normalised rows.
        p_total = float(self.P.sum(dtype=torch.float64))
        q_total = float(self.Q.sum(dtype=torch.float64))
        self.p_scale, self.q_scale = 1.0 / p_total, 1.0 / q_total
        self.ranked_mask = (self.P + self.Q) >= self.tail_threshold
        self.ranked = torch.nonzero(self.ranked_mask).squeeze(-1)
        P_ranked = self.P[self.ranked].double()
        Q_ranked = self.Q[self.ranked].double()
        self.has_tail = self.ranked.shape[0] < V
        if self.has_tail:  # clamped: a difference of two sums can round below 0
            self.P_tail = max(0.0, (p_total - float(P_ranked.sum())) * self.p_scale)
            self.Q_tail = max(0.0, (q_total - float(Q_ranked.sum())) * self.q_scale)
        else:
            self.P_tail = self.Q_tail = 0.0
        self.P_ranked = P_ranked * self.p_scale
        self.Q_ranked = Q_ranked * self.q_scale
        self.r_ranked = _rank_key(self.P_ranked, self.Q_ranked)
        self._order: torch.Tensor | None = None

    @property
    def order(self) -> torch.Tensor:
        """Positions (into the ranked arrays) of the rejectable tokens, in rank order."""
        if self._order is None:
            rho_max = max(self.rho.values()) if self.rho else math.inf
            rejectable = (self.Q_ranked - _accepted_mass(self.P_ranked, self.Q_ranked, rho_max)) > 0
            positions = torch.nonzero(rejectable).squeeze(-1)  # ascending, so ties keep the lower id first
            self._order = positions[_rank_order(self.r_ranked[positions])]
        return self._order

    def p_at(self, token: int) -> float:
        return float(self.P[token]) * self.p_scale

    def q_at(self, token: int) -> float:
        return float(self.Q[token]) * self.q_scale

    def p_full(self) -> torch.Tensor:
        """The normalised target row, float64 [V]."""
        return self.P.double() * self.p_scale

    def q_full(self) -> torch.Tensor:
        """The normalised draft row, float64 [V]."""
        return self.Q.double() * self.q_scale

    # -- per count ---------------------------------------------------------------------------------
    def count_terms(self, c: int) -> tuple[torch.Tensor, float, float, torch.Tensor, torch.Tensor]:
        """(Q a on ranked [n], alpha, A, G^- on ranked [n] (token order), f on ranked [n]) for count c."""
        if c not in self._per_count:
            m = _accepted_mass(self.P_ranked, self.Q_ranked, self.rho[c])
            d = self.Q_ranked - m
            alpha = float(m.sum()) + self.Q_tail  # tail tokens are always accepted
            scale = _accept_scale(alpha, c)
            d_sorted = d[self.order]
            g = torch.cumsum(d_sorted, 0)
            g_minus_sorted = g - d_sorted
            g_minus = torch.zeros_like(d)  # only read where d > 0
            g_minus[self.order] = g_minus_sorted
            f = m * scale
            f[self.order] += _power_difference(g, g_minus_sorted, c)
            self._per_count[c] = (m, alpha, scale, g_minus, f)
        return self._per_count[c]

    def _index(self, token: int) -> int | None:
        """Index of ``token`` among the ranked tokens, None if it is in the tail."""
        if not self.has_tail:
            return token
        if not bool(self.ranked_mask[token]):
            return None
        return int(torch.searchsorted(self.ranked, torch.tensor(token, device=self.ranked.device)))

    def token_terms(self, c: int, v: int) -> tuple[float, float, float, float]:
        """(Q(v), a(v), alpha, G^-(v)) for count c."""
        j = self._index(v)
        q_v = float(self.Q_ranked[j]) if j is not None else self.q_at(v)
        if c == 1:
            return q_v, 1.0, 1.0, 0.0
        m, alpha, _, g_minus, _ = self.count_terms(c)
        if j is None:
            return q_v, 1.0, alpha, 0.0
        a_v = min(1.0, float(m[j]) / q_v) if q_v > 0 else 0.0
        return q_v, a_v, alpha, float(g_minus[j])

    def accept_probability(self, c: int, token: int) -> float:
        """a = min(1, P/(rho_c Q)) at a drafted ``token`` (1 for a tail token or a single survivor)."""
        return self.token_terms(c, token)[1]

    def top_rank(self, tokens: list[int]) -> int:
        """The token of highest rank (largest r; ties: larger id) among ``tokens``."""
        keys = []
        for token in tokens:
            j = self._index(token)
            q = self.q_at(token)
            r = float(self.r_ranked[j]) if j is not None else (self.p_at(token) / q if q > 0 else math.inf)
            keys.append((r, token))
        return max(keys)[1]

    # -- laws --------------------------------------------------------------------------------------
    def mixture(self, weights: dict[int, float]) -> tuple[torch.Tensor, float]:
        """(sum_c w_c f_c on the ranked tokens [n], tail scale A_mix) with q_sel = Q A_mix on the tail."""
        key = tuple(sorted(weights.items()))
        if key not in self._mixtures:
            ranked = torch.zeros_like(self.P_ranked)
            tail_scale = 0.0
            for c, w in key:
                if w <= 0:
                    continue
                if c == 1:
                    ranked = ranked + w * self.Q_ranked
                    tail_scale += w
                else:
                    _, _, scale, _, f = self.count_terms(c)
                    ranked = ranked + w * f
                    tail_scale += w * scale
            self._mixtures[key] = (ranked, tail_scale)
        return self._mixtures[key]

    def token_mixture(self, weights: dict[int, float], v: int) -> float:
        """q_sel(v) = sum_c w_c f_c(v)."""
        ranked, tail_scale = self.mixture(weights)
        j = self._index(v)
        return float(ranked[j]) if j is not None else tail_scale * self.q_at(v)

    def full(self, weights: dict[int, float]) -> torch.Tensor:
        """q_sel on the whole vocabulary, float64 [V]."""
        ranked, tail_scale = self.mixture(weights)
        out = tail_scale * self.q_full() if self.has_tail else torch.zeros_like(self.P, dtype=torch.float64)
        out[self.ranked] = ranked
        return out

    def law(self, c: int) -> torch.Tensor:
        """f(.; rho_c, c) on the whole vocabulary, float64 [V]."""
        return self.full({c: 1.0})

    def residual(self, weights: dict[int, float], w: float) -> torch.Tensor:
        """(w P - q_sel)+ on the whole vocabulary, float64 [V] (unnormalised)."""
        return (w * self.p_full() - self.full(weights)).clamp_min(0)

    def residual_mass(self, weights: dict[int, float], w: float) -> tuple[float, float, float]:
        """Z = sum (w P - q_sel)+ as (ranked part, tail lower bound, tail upper bound), no tail pass.

        On the tail (w P - A Q)+ sums to between (w P_tail - A Q_tail)+ and w P_tail.
        """
        ranked, tail_scale = self.mixture(weights)
        z_ranked = float((w * self.P_ranked - ranked).clamp_min(0).sum())
        if not self.has_tail:
            return z_ranked, 0.0, 0.0
        return z_ranked, max(0.0, w * self.P_tail - tail_scale * self.Q_tail), w * self.P_tail

    def tail_residual_mass(self, weights: dict[int, float], w: float) -> float:
        """The exact tail part of Z (one pass over the vocabulary)."""
        _, tail_scale = self.mixture(weights)
        tail = (w * self.p_full() - tail_scale * self.q_full()).clamp_min(0)
        return float((tail * ~self.ranked_mask).sum())


def selection_law(
    P: torch.Tensor, Q: torch.Tensor, rho: float, c: int, tail_threshold: float = DEFAULT_TAIL_THRESHOLD
) -> torch.Tensor:
    """Closed-form law f(.; rho, c), float64 [V], of the token selected among c i.i.d. Q-draws."""
    if c == 1:
        return Q.double().clone()
    return DepthRule(P, Q, tail_threshold, {c: rho}).law(c)


class SelectionBlockVerification(Verifier):
    """SBV: select one path through the K drafts with a known law, then BV on it (lossless).

    Options: ``count_posterior`` (default True: q_sel mixes f over the posterior of the survivor count;
    False: f at the observed count), ``selection`` ("randomized" = METHODS.md; "greedy" = always the
    highest-ratio survivor token, i.e. greedy multi-path BV), ``grid_size`` (points of the rho grid),
    ``head_size`` (ranked tokens of largest P + Q on which rho is chosen), ``tail_threshold`` (tokens
    with P + Q below it are accepted whenever drafted and never ranked; see the module docstring).
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
        head_size: int = 256,
        tail_threshold: float = DEFAULT_TAIL_THRESHOLD,
        **options,
    ) -> None:
        super().__init__(check_inputs=check_inputs, **options)
        if selection not in SELECTIONS:
            raise ValueError(f"sbv: selection must be one of {SELECTIONS}, got {selection!r}")
        if grid_size < 2 or head_size < 1 or not tail_threshold >= 0:
            raise ValueError(
                "sbv: need grid_size >= 2, head_size >= 1 and tail_threshold >= 0; "
                f"got {grid_size}, {head_size}, {tail_threshold}"
            )
        self.count_posterior = bool(count_posterior)
        self.selection = selection
        self.grid_size = int(grid_size)
        self.head_size = int(head_size)
        self.tail_threshold = float(tail_threshold)
        self._rules: dict[tuple, DepthRule] = {}

    # ---------------------------------------------------------------- selection, shared by both paths
    def _depth_rule(self, P: torch.Tensor, Q: torch.Tensor, counts: list[int]) -> DepthRule:
        counts = sorted(set(counts))
        # Toy vocabularies revisit the same (P, Q) many times in an exact law: memoise them there.
        key = None
        if P.shape[-1] <= _CACHE_MAX_VOCAB:
            key = (P.cpu().numpy().tobytes(), Q.cpu().numpy().tobytes(), tuple(counts))
            if key in self._rules:
                return self._rules[key]
        rule = DepthRule(P, Q, self.tail_threshold)
        if self.selection == "greedy":
            rule.rho = {c: math.inf for c in counts if c >= 2}
        else:
            rule.rho = choose_rho(rule.P_ranked, rule.Q_ranked, counts, self.grid_size, self.head_size)
        if key is not None:
            if len(self._rules) >= _CACHE_MAX_ENTRIES:
                self._rules.clear()
            self._rules[key] = rule
        return rule

    def _counts_needed(self, posterior: dict[int, float], k: int) -> list[int]:
        if self.count_posterior:
            return sorted({c for c, w in posterior.items() if w > 0} | {k})
        return [k]

    def _weights(self, posterior: dict[int, float], k: int) -> dict[int, float]:
        return dict(posterior) if self.count_posterior else {k: 1.0}

    @staticmethod
    def _update_posterior(rule: DepthRule, posterior: dict[int, float], v: int) -> dict[int, float]:
        """Posterior of the number of survivors carrying v, given the selected prefix and v."""
        new: dict[int, float] = {}
        for c, w in posterior.items():
            if w <= 0:
                continue
            q_v, a_v, alpha, g_minus = rule.token_terms(c, v)
            lik = [0.0, q_v] if c == 1 else count_likelihood(q_v, a_v, alpha, g_minus, c)
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
        w = [1.0]  # BV's running ratio along the selected path
        for i in range(L):
            k = len(survivors)
            row = survivors[0]
            rule = self._depth_rule(
                target_probs[row, i], draft_probs[row, i], self._counts_needed(posterior, k)
            )
            candidates = [tokens[j][i] for j in survivors]
            v = candidates[0]
            if k > 1:
                u = uniform(k, generator, device=None if generator is not None else device).tolist()
                chosen = None
                for j, token in enumerate(candidates):
                    if u[j] < rule.accept_probability(k, token):
                        chosen = token
                        break
                v = chosen if chosen is not None else rule.top_rank(candidates)
            mix = self._weights(posterior, k)
            q_v = rule.token_mixture(mix, v)
            w.append(min(1.0, w[-1] * rule.p_at(v) / q_v) if q_v > 0 else 0.0)
            rules.append(rule)
            weights.append(mix)
            if self.count_posterior:
                posterior = self._update_posterior(rule, posterior, v)
            path.append(v)
            survivors = [j for j in survivors if tokens[j][i] == v]
        row = survivors[0]

        # BV on the selected path, scanned from the back: the first success from the back is the
        # largest i with eta_i <= h_i, so the depths below the stop are never evaluated.
        eta = uniform(L, generator, device=None if generator is not None else device).tolist()
        tau = 0
        if eta[L - 1] <= w[L]:
            tau = L
        else:
            for i in range(L - 1, 0, -1):
                if self._stops_at(rules[i], weights[i], w[i], eta[i - 1]):
                    tau = i
                    break
        if tau == L:
            extra = int(sample(target_probs[row, L], generator))
        else:
            residual = rules[tau].residual(weights[tau], w[tau])
            extra = int(sample(residual if float(residual.sum()) > 0 else rules[tau].p_full(), generator))
        out = torch.tensor(path[:tau] + [extra], dtype=torch.long, device=draft_tokens.device)
        return VerifyResult(tokens=out, num_accepted=tau, draft_index=row, state=None)

    @staticmethod
    def _stop_probability(z: float, w: float) -> float:
        denominator = z + 1.0 - w
        return z / denominator if denominator > 0 else 1.0

    def _stops_at(self, rule: DepthRule, weights: dict[int, float], w: float, eta: float) -> bool:
        """Whether eta <= h = Z/(Z + 1 - w), Z = sum (w P - q_sel)+.

        h increases with Z; the tail's share of Z is bracketed without a pass over the vocabulary and
        computed exactly only when eta falls inside the bracket, so the decision is exact.
        """
        if w >= 1.0:
            return True  # h = 1
        z_ranked, tail_low, tail_high = rule.residual_mass(weights, w)
        if eta <= self._stop_probability(z_ranked + tail_low, w):
            return True
        if eta > self._stop_probability(z_ranked + tail_high, w):
            return False
        return eta <= self._stop_probability(z_ranked + rule.tail_residual_mass(weights, w), w)

    # ---------------------------------------------------------------- exact law
    def _law(self, draft_tokens, draft_probs, target_probs, state) -> list[Outcome]:
        K, L = draft_tokens.shape
        tokens = draft_tokens.tolist()
        law: dict[tuple[int, ...], float] = {}

        def descend(i, survivors, posterior, path, prob, rows):
            if i == L:
                bonus = target_probs[survivors[0], L].double()
                self._bv_law(path, rows, bonus / bonus.sum(), prob, law)
                return
            k = len(survivors)
            row = survivors[0]
            rule = self._depth_rule(
                target_probs[row, i], draft_probs[row, i], self._counts_needed(posterior, k)
            )
            q_sel = rule.full(self._weights(posterior, k))
            candidates = [tokens[j][i] for j in survivors]
            for v, p_v in self._selection_events(rule, k, candidates).items():
                if p_v <= 0:
                    continue
                descend(
                    i + 1,
                    [j for j in survivors if tokens[j][i] == v],
                    self._update_posterior(rule, posterior, v) if self.count_posterior else posterior,
                    path + [v],
                    prob * p_v,
                    rows + [(rule.p_full(), q_sel)],
                )

        descend(0, list(range(K)), {K: 1.0}, [], 1.0, [])
        return [Outcome(probability=p, tokens=t) for t, p in law.items() if p > 0]

    @staticmethod
    def _selection_events(rule: DepthRule, k: int, candidates: list[int]) -> dict[int, float]:
        """Law of the selected token given the survivors' tokens (scan in draft order, then top rank)."""
        if k == 1:
            return {candidates[0]: 1.0}
        events: dict[int, float] = {}
        none_accepted = 1.0
        for token in candidates:
            a = rule.accept_probability(k, token)
            events[token] = events.get(token, 0.0) + none_accepted * a
            none_accepted *= 1.0 - a
        if none_accepted > 0:
            top = rule.top_rank(candidates)
            events[top] = events.get(top, 0.0) + none_accepted
        return events

    @staticmethod
    def _bv_law(path, rows, bonus, prob, law) -> None:
        """Add prob x BV's law on ``path`` (rows[i] = (P_i, q_sel_i), float64 [V]) into ``law``."""
        L = len(path)
        w = [1.0]
        for i in range(L):
            P, q_sel = rows[i]
            q_x = float(q_sel[path[i]])
            w.append(min(1.0, w[-1] * float(P[path[i]]) / q_x) if q_x > 0 else 0.0)
        h = [1.0] * (L + 1)  # h_0 = 1: the scan always has depth 0 to fall back on
        laws = [None] * (L + 1)
        for i in range(L):
            P, q_sel = rows[i]
            residual = (w[i] * P - q_sel).clamp_min(0)
            z = float(residual.sum())
            if i > 0:
                denominator = z + 1.0 - w[i]
                h[i] = z / denominator if denominator > 0 else 1.0
            laws[i] = residual / z if z > 0 else P
        h[L] = w[L]
        laws[L] = bonus
        survive = 1.0  # P(no success at the depths above i)
        for i in range(L, -1, -1):
            stop = survive * h[i]
            survive *= 1.0 - h[i]
            if stop <= 0:
                continue
            prefix = tuple(path[:i])
            for y, p_y in enumerate(laws[i].tolist()):
                if p_y > 0:
                    key = prefix + (y,)
                    law[key] = law.get(key, 0.0) + prob * stop * p_y
