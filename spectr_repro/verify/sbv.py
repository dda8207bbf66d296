"""SBV — selection block verification (ours; lossless for any K). Derivation: docs/sbv.md.

Two stages per iteration:

1. *Select* one path x = (x_1..x_L) through the K drafts, top-down. At depth i (prefix z = x^i,
   survivors S = the drafts whose first i tokens equal z, k = |S|), with P = p(.|z), Q = q(.|z) and
   tokens ranked by r = P/Q ascending (ties: lower id first; r = +inf where Q = 0): scan the survivors in
   draft order, accepting survivor j's token with probability a = min(1, P/(rho_k Q)) at that token; if
   none is accepted take the survivor token of highest rank. Given c survivors the selected token has law

       f(v; rho, c) = Q(v) a(v) A_c + G(v)^c - G^-(v)^c,
       A_c = sum_{j<c} beta^j = (1 - (1 - alpha)^c) / alpha,   beta = 1 - alpha = sum Q (1 - a),
       G = cumsum of Q (1 - a) in rank order,  G^- = G - Q (1 - a),

   and rho_c is the point of a log grid over [1, 50 max r] maximising sum_v min(f(v; rho, c), P(v)).
   The survivor count is random, so the law of x_{i+1} given the selected prefix alone is
   q_sel[i] = sum_c pi(c) f(.; rho_c, c), pi = the exact posterior of the count given z, updated after
   each depth. ``count_posterior=False`` uses f(.; rho_k, k) at the observed count instead (also valid).
2. Run plain block verification (BV) on the selected path with q_sel as the draft law.

Shapes: draft_tokens [K, L], draft_probs [K, L, V], target_probs [K, L+1, V] (see verify.base).
Powers and cumulative sums are float64.

Large vocabularies. The closed form holds for ANY acceptance function a(.) in [0, 1] and any total order,
so only a fixed-size head is ranked: the ``head_size`` tokens of largest P + Q (torch.topk), less those
with P + Q < ``tail_threshold``. Every other token (the tail) is accepted whenever drafted (a = 1): it
adds nothing to G, needs no rank, and its f is Q A_c exactly. rho_c is chosen on the head, with f the
rule's own law there. Any deterministic choice of the ranked set and of rho keeps the rule valid, because
f is computed exactly for the choice made (docs/sbv.md, section 4). On toy vocabularies (V <= head_size,
every probability >= 1e-4) every token is ranked and the rule is exactly METHODS.md's.

Cost on a GPU. Everything is vectorised over the candidates, the counts c = 2..K, the rho grid and the
head: f for all counts and grid points is one [n, K-1, grid, head] expression (powers by cumulative
products, no cancellation), the count likelihoods one [L, K, K, K, K] expression, and BV's stop
probabilities one [L, V] pass. Python loops run over the L depths only. Three host reads per call: the
draft tokens (which drafts share which prefix is bookkeeping on K x L integers), the selections (every
prefix shared by >= 2 drafts, at every depth, is decided in one batch: each one's selection depends on its
own uniforms only, so deciding those off the path changes nothing), and tau.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import Counter
from dataclasses import dataclass, fields, replace

import torch

from spectr_repro.sampling import uniform
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
DEFAULT_GRID_SIZE = 64
DEFAULT_HEAD_SIZE = 256
RHO_SPAN = 50.0  # the rho grid covers [1, RHO_SPAN * max r]
_CACHE_MAX_VOCAB = 64  # memoise per-depth rules in the exact law only for toy vocabularies
_CACHE_MAX_ENTRIES = 100_000
_F64 = torch.float64


# ------------------------------------------------------------------------------------------------ the head
@dataclass
class _Head:
    """The ranked head of n rows (P, Q), in rank order: r = P/Q ascending, ties lower id first.

    Head tokens below the threshold carry p = q = 0 (rank key +inf, so they sort last): they belong to the
    tail, like every token outside the head.
    """

    ids: torch.Tensor  # [n, N] long, token ids
    ranked: torch.Tensor  # [n, N] bool, P + Q >= tail_threshold
    p: torch.Tensor  # [n, N] float64, P / sum P (0 where not ranked)
    q: torch.Tensor  # [n, N] float64, Q / sum Q (0 where not ranked)
    r: torch.Tensor  # [n, N] float64, p / q ascending (+inf where q = 0)
    psum: torch.Tensor  # [n] float64 row sums: rows are renormalised in float64, as they were sampled
    qsum: torch.Tensor  # [n]
    P_full: torch.Tensor  # [n, V] the rows as given (unnormalised, their own dtype)
    Q_full: torch.Tensor  # [n, V]

    def first(self, size: int) -> _Head:
        """The first ``size`` tokens in rank order, as the whole head."""
        return replace(self, ids=self.ids[:, :size], ranked=self.ranked[:, :size], p=self.p[:, :size],
                       q=self.q[:, :size], r=self.r[:, :size])


def _rank_key(P: torch.Tensor, Q: torch.Tensor) -> torch.Tensor:
    """r = P/Q, +inf where Q = 0 (such tokens are never drafted; their f is 0 whatever their rank)."""
    return torch.nan_to_num(P / Q, nan=math.inf, posinf=math.inf)  # P/0 = inf; 0/0 = nan -> inf


def _ranked_head(
    P_rows: torch.Tensor, Q_rows: torch.Tensor, head_size: int | None, tail_threshold: float, normalise: bool = True
) -> _Head:
    """The head of each row ([n, V] rows, any float dtype): all tokens if V <= head_size (or head_size None)."""
    n, V = P_rows.shape
    psum, qsum = P_rows.sum(-1, dtype=_F64), Q_rows.sum(-1, dtype=_F64)  # no float64 copy of the rows
    if head_size is None or V <= head_size:
        ids = torch.arange(V, device=P_rows.device).expand(n, V)
    else:  # ascending ids, so that the stable sort below breaks rank ties by the lower id
        ids = torch.topk(P_rows + Q_rows, head_size, dim=-1, sorted=False).indices.sort(-1).values
    P_head, Q_head = P_rows.gather(-1, ids), Q_rows.gather(-1, ids)
    ranked = (P_head + Q_head) >= tail_threshold  # in the rows' own dtype
    if normalise:
        p, q = P_head / psum[:, None] * ranked, Q_head / qsum[:, None] * ranked  # float64
    else:
        p, q = P_head.to(_F64) * ranked, Q_head.to(_F64) * ranked
    r, order = torch.sort(_rank_key(p, q), dim=-1, stable=True)
    return _Head(ids.gather(-1, order), ranked.gather(-1, order), p.gather(-1, order), q.gather(-1, order), r,
                 psum, qsum, P_rows, Q_rows)


@functools.cache
def _grid_steps(grid_size: int, device: torch.device) -> torch.Tensor:
    return torch.arange(grid_size, dtype=_F64, device=device) / (grid_size - 1)


def _log_grid(r: torch.Tensor, grid_size: int) -> torch.Tensor:
    """[n, grid]: the log grid over [1, RHO_SPAN * max finite r] of each row (r: [n, N])."""
    r_max = torch.nan_to_num(r, posinf=0.0).amax(-1).clamp_min(1.0)  # r >= 0, never NaN
    return torch.exp(torch.log(RHO_SPAN * r_max)[:, None] * _grid_steps(grid_size, r.device))


# ------------------------------------------------------------------------------------------------ closed form
@dataclass
class _GridTerms:
    """f and its parts for every row, grid point and count c = 2..K (count axis: index c - 2)."""

    accepted: torch.Tensor  # [n, G, N] Q a = min(Q, P/rho)
    g_minus: torch.Tensor  # [n, G, N] G^-
    reject: torch.Tensor  # [n, G] beta = sum Q (1 - a) = 1 - alpha
    excess: torch.Tensor  # [n, C, G] A_c - 1 = beta + ... + beta^(c-1)
    law: torch.Tensor  # [n, C, G, N] f(.; rho, c)


def _grid_terms(
    p: torch.Tensor, q: torch.Tensor, rho: torch.Tensor, K: int, missing: torch.Tensor | None = None
) -> _GridTerms:
    """f(.; rho, c) for p, q [n, N] in rank order, rho [n, G] (may be +inf), counts c = 2..K.

    The tail (a = 1) enters only through beta: with rows normalised over the whole vocabulary,
    beta = sum over the head of Q (1 - a) = 1 - alpha exactly. ``missing`` [n] adds a mass that is neither
    in the head nor accepted (choose_rho's head-only objective). G^c - G^-^c = d G^(c-1) sum_{j<c} x^j with
    d = Q (1 - a), x = G^-/G in [0, 1]: every term is positive, so there is no cancellation.
    """
    C = K - 1
    accepted = torch.minimum(q[:, None, :], p[:, None, :] / rho[:, :, None])  # [n, G, N]; P/inf = 0
    rejected = q[:, None, :] - accepted
    g = rejected.cumsum(-1)
    g_minus = g - rejected
    reject = g[..., -1] if missing is None else g[..., -1] + missing[:, None]

    def powers(t: torch.Tensor) -> torch.Tensor:  # [n, *rest] -> [n, C, *rest]: t^1 .. t^C
        return t.unsqueeze(1).expand(t.shape[0], C, *t.shape[1:]).cumprod(1)

    excess = powers(reject).cumsum(1)  # [n, C, G]
    ratio = torch.nan_to_num(g_minus / g, nan=0.0)  # 0/0 where g = 0 (there d = 0 too)
    power_sums = powers(ratio).cumsum(1).add_(1.0)  # [n, C, G, N]: 1 + x + ... + x^(c-1)
    law = accepted[:, None] * (1.0 + excess)[..., None] + rejected[:, None] * powers(g) * power_sums
    return _GridTerms(accepted, g_minus, reject, excess, law)


def _best_grid_points(terms: _GridTerms, p: torch.Tensor) -> torch.Tensor:
    """[n, C]: the grid index maximising sum_v min(f, P) per count (argmax: the first maximum, smallest rho)."""
    return torch.minimum(terms.law, p[:, None, None, :]).sum(-1).argmax(-1)


@dataclass
class _Rules:
    """The selection rule at n prefixes (rows), for the counts c = 2..K (count axis: index c - 2).

    A single survivor (c = 1) always selects its own token: f = Q, nothing to store.
    """

    ids: torch.Tensor  # [n, N] head token ids in rank order
    ranked: torch.Tensor  # [n, N] bool
    p: torch.Tensor  # [n, N] float64 P (normalised, 0 where not ranked)
    q: torch.Tensor  # [n, N] float64 Q (normalised, 0 where not ranked)
    psum: torch.Tensor  # [n]
    qsum: torch.Tensor  # [n]
    tail_p: torch.Tensor  # [n] the tail's mass under P (normalised; exactly 0 when every token is ranked)
    tail_q: torch.Tensor  # [n] ... under Q
    rho: torch.Tensor  # [n, C]
    reject: torch.Tensor  # [n, C] beta_c = 1 - alpha_c
    excess: torch.Tensor  # [n, C] A_c - 1
    accepted: torch.Tensor  # [n, C, N] Q a
    g_minus: torch.Tensor  # [n, C, N] G^-
    law: torch.Tensor  # [n, C, N] f_c on the head
    P_full: torch.Tensor  # [n, V] target rows as given (unnormalised)
    Q_full: torch.Tensor  # [n, V] draft rows

    def take(self, index: torch.Tensor) -> _Rules:
        return _Rules(*(getattr(self, f.name).index_select(0, index) for f in fields(self)))

    @staticmethod
    def concat(parts: list[_Rules]) -> _Rules:
        """Rows of several rules; heads of different sizes are padded with unranked slots (id 0, no effect)."""
        size = max(part.ids.shape[-1] for part in parts)

        def padded(part: _Rules, name: str) -> torch.Tensor:
            t = getattr(part, name)
            if name in _HEAD_FIELDS and t.shape[-1] < size:
                t = torch.nn.functional.pad(t, (0, size - t.shape[-1]))  # zeros: id 0, unranked, no mass
            return t

        return _Rules(*(torch.cat([padded(part, f.name) for part in parts]) for f in fields(_Rules)))


_HEAD_FIELDS = frozenset({"ids", "ranked", "p", "q", "accepted", "g_minus", "law"})  # [..., N]


def _head_fields(head: _Head) -> dict:
    """The count-free fields of the rule: the head, the row sums and the tail's masses."""
    has_tail = head.ranked.sum(-1) < head.P_full.shape[-1]
    tail_p = torch.where(has_tail, (1.0 - head.p.sum(-1)).clamp_min(0.0), 0.0)
    tail_q = torch.where(has_tail, (1.0 - head.q.sum(-1)).clamp_min(0.0), 0.0)
    return dict(ids=head.ids, ranked=head.ranked, p=head.p, q=head.q, psum=head.psum, qsum=head.qsum,
                tail_p=tail_p, tail_q=tail_q, P_full=head.P_full, Q_full=head.Q_full)


def _pick(head: _Head, terms: _GridTerms, rho: torch.Tensor, index: torch.Tensor) -> _Rules:
    """The rule at grid point index[:, c - 2] ([n, C]) for each count c."""
    n, C = index.shape
    N = head.q.shape[-1]
    along_grid = index[:, :, None].expand(n, C, N)
    return _Rules(
        **_head_fields(head),
        rho=rho.gather(1, index),
        reject=terms.reject.gather(1, index),
        excess=terms.excess.gather(2, index[:, :, None]).squeeze(2),
        accepted=terms.accepted.gather(1, along_grid),
        g_minus=terms.g_minus.gather(1, along_grid),
        law=terms.law.gather(2, index[:, :, None, None].expand(n, C, 1, N)).squeeze(2),
    )


def _single_draft_rules(head: _Head) -> _Rules:
    """K = 1: no count >= 2, f = Q."""
    n, N = head.q.shape
    empty = head.q.new_zeros((n, 0))
    empty_head = head.q.new_zeros((n, 0, N))
    return _Rules(**_head_fields(head), rho=empty, reject=empty, excess=empty, accepted=empty_head,
                  g_minus=empty_head, law=empty_head)


def _first_true(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(any, index of the first True) along the last dim (argmax: the first maximum; torch.max(dim) has slow
    CPU paths on some small shapes, ~30 ms)."""
    return mask.any(-1), mask.to(torch.uint8).argmax(-1)


def _locate(rules: _Rules, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(position in rank order [n, T], ranked [n, T]) of tokens [n, T] in each row's head."""
    hit = (rules.ids[:, None, :] == tokens[:, :, None]) & rules.ranked[:, None, :]
    ranked, position = _first_true(hit)
    return position, ranked


def _acceptance(rules: _Rules, tokens: torch.Tensor, count_index: torch.Tensor):
    """(a [n, T], rank position [n, T]) of candidate tokens [n, T] at count count_index + 2 ([n]).

    a = min(1, P/(rho Q)) = (Q a)/Q on ranked tokens, 1 on the tail.
    """
    position, ranked = _locate(rules, tokens)
    n, _, N = rules.accepted.shape
    accepted = rules.accepted.gather(1, count_index[:, None, None].expand(n, 1, N)).squeeze(1)  # [n, N]
    m, q = accepted.gather(1, position), rules.q.gather(1, position)
    return torch.where(ranked & (q > 0), m / q, 1.0), position


def _select(rules: _Rules, tokens, member, count_index, u) -> torch.Tensor:
    """The scan, for n prefixes at once: [n] the first member (draft row) carrying the selected token.

    tokens [n, K]: each draft's token at the prefix's depth; member [n, K]: the drafts sharing the prefix;
    u [n, K] uniforms. Survivor j is accepted when u_j < a(token_j); none accepted: the token of top rank.
    """
    a, position = _acceptance(rules, tokens, count_index)
    accepted = member & (u < a)
    any_accepted, first = _first_true(accepted)
    chosen = torch.where(any_accepted, first, torch.where(member, position, -1).argmax(-1))
    token = tokens.gather(1, chosen[:, None])
    return _first_true(member & (tokens == token))[1]


def _selection_events(rules: _Rules, tokens, member, count_index) -> torch.Tensor:
    """[n, K]: the probability that the scan selects draft j's token at draft j (the law of ``_select``)."""
    a, position = _acceptance(rules, tokens, count_index)
    a = torch.where(member, a, 0.0)
    survive = torch.cumprod(1.0 - a, -1)  # no acceptance among drafts 0..j
    probs = a * torch.cat([torch.ones_like(a[:, :1]), survive[:, :-1]], -1)
    top = torch.where(member, position, -1).argmax(-1, keepdim=True)
    return probs.scatter_add(1, top, survive[:, -1:])


# ------------------------------------------------------------------------------------------------ count posterior
@functools.cache
def _likelihood_tables(C: int, device: torch.device):
    """Constant tables of count_likelihood's two sums over (count c, draw j, earlier carriers t, carriers m)."""
    c, j, t, m = torch.meshgrid(*[torch.arange(C, dtype=_F64)] * 4, indexing="ij")
    c, j, m = c + 1, j + 1, m + 1  # c, j, m in 1..C; t in 0..C-1
    later = m - 1 - t  # carriers among the free draws after the accepted one
    binom = torch.tensor([[math.comb(a, b) for b in range(C + 1)] for a in range(C + 1)], dtype=_F64)
    valid = (j <= c) & (t <= j - 1) & (later >= 0) & (later <= c - j)
    coef = torch.where(valid, binom[(j - 1).long(), t.long()] * binom[(c - j).long().clamp_min(0),
                                                                    later.long().clamp(0, C)], 0.0)
    exponents = torch.stack([t, (j - 1 - t).clamp_min(0), later.clamp_min(0), (c - j - later).clamp_min(0)])
    cc, mm = torch.meshgrid(torch.arange(1, C + 1, dtype=_F64), torch.arange(1, C + 1, dtype=_F64), indexing="ij")
    none_coef = torch.where(mm <= cc, binom[cc.long(), mm.long()], 0.0)
    none_exponents = torch.stack([mm, (cc - mm).clamp_min(0)])
    return tuple(x.to(device) for x in (coef, exponents, none_coef, none_exponents))


def _count_likelihoods(q: torch.Tensor, a: torch.Tensor, reject: torch.Tensor, g_minus: torch.Tensor) -> torch.Tensor:
    """[n, C, C]: P(v selected and m of the c survivors carry v), counts c = 1..C, m = 1..C (count_likelihood).

    q [n] = Q(v); a, reject (beta = 1 - alpha), g_minus [n, C] = a(v), beta, G^-(v) at each count.
    Accepted at draw j: the j - 1 earlier draws are rejected (t of them carry v: (Q(v)(1-a))^t, the others
    (beta - Q(v)(1-a))^(j-1-t)), the c - j later draws are free (Bin(c - j, Q(v))). None accepted, v of top
    rank: C(c, m) (Q(v)(1 - a))^m G^-^(c - m).
    """
    coef, exponents, none_coef, none_exponents = _likelihood_tables(a.shape[1], a.device)
    carry = q[:, None] * (1.0 - a)  # a draw is v and is rejected
    other = (reject - carry).clamp_min(0.0)  # a draw is rejected and is not v
    bases = [carry, other, q[:, None].expand_as(a), (1.0 - q)[:, None].expand_as(a)]
    terms = coef
    for base, exponent in zip(bases, exponents):
        terms = terms * base[:, :, None, None, None].pow(exponent)
    accepted = (q[:, None] * a)[:, :, None] * terms.sum((2, 3))
    none = none_coef * carry[:, :, None].pow(none_exponents[0]) * g_minus[:, :, None].pow(none_exponents[1])
    return accepted + none


def _posterior_chain(lik: torch.Tensor) -> torch.Tensor:
    """[L, K]: the law of the survivor count (1..K) at each depth, from lik [L, K, K] at the selected tokens.

    pi_0 = point mass at K; pi_{i+1} = pi_i lik_i, normalised (sum = q_sel_i(x_{i+1})). A 1e-308 floor on
    count 1 only settles 0/0, which a selected token cannot produce (the old rule's {1: 1} fallback).
    """
    L, K, _ = lik.shape
    floor = torch.zeros(K, dtype=_F64, device=lik.device)
    floor[0] = torch.finfo(_F64).tiny
    lik = lik + floor
    pi = torch.zeros(1, K, dtype=_F64, device=lik.device)
    pi[0, K - 1] = 1.0
    laws = [pi]
    for i in range(L - 1):
        unnormalised = torch.mm(laws[-1], lik[i])
        laws.append(unnormalised / unnormalised.sum())
    return torch.cat(laws)


def _count_posterior(rules: _Rules, path: torch.Tensor) -> torch.Tensor:
    """[L, K] posterior of the survivor count along the selected path (rules [L], path [L])."""
    L, C, _ = rules.accepted.shape
    q_at = rules.Q_full.gather(1, path[:, None]).squeeze(1) / rules.qsum  # Q(x_{i+1})
    position, ranked = _locate(rules, path[:, None])
    at = position[:, None, :].expand(L, C, 1)
    m = rules.accepted.gather(2, at).squeeze(2)
    g_minus = rules.g_minus.gather(2, at).squeeze(2) * ranked
    a = torch.where(ranked, m / q_at[:, None], 1.0)
    one, zero = torch.ones_like(q_at[:, None]), torch.zeros_like(q_at[:, None])  # count 1: a = 1, nothing rejected
    lik = _count_likelihoods(q_at, torch.cat([one, a], 1), torch.cat([zero, rules.reject], 1),
                             torch.cat([zero, g_minus], 1))
    return _posterior_chain(lik)


# ------------------------------------------------------------------------------------------------ laws, BV
def _mixture(rules: _Rules, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q_sel = sum_c w_c f_c (weights [n, K]: a law over counts 1..K) as (values on the head [n, N], tail scale
    A [n]): q_sel = A Q / sum Q off the head and on its unranked tokens.

    Written q + sum_{c>=2} w_c (f_c - q) (equal, as the weights sum to 1), so that q_sel is exactly Q
    where every f_c is (q = p, or a single survivor). The tail: A = 1 + sum_c w_c (A_c - 1).
    """
    w = weights[:, 1:]
    tail_scale = 1.0 + (w * rules.excess).sum(-1)
    mixed = rules.q + torch.einsum("nc,ncv->nv", w, rules.law - rules.q[:, None])
    tail = rules.Q_full.gather(1, rules.ids) * (tail_scale / rules.qsum)[:, None]
    return torch.where(rules.ranked, mixed, tail), tail_scale


def _selected_rows(rules: _Rules, head: torch.Tensor, tail_scale: torch.Tensor, index: slice) -> torch.Tensor:
    """q_sel on the whole vocabulary at rows ``index``, float64 [m, V]: the tail law, plus the head's own values
    added as differences (a padded slot adds 0, whatever token it names)."""
    rows = rules.Q_full[index] * (tail_scale / rules.qsum)[index][:, None]
    ids = rules.ids[index]
    return rows.scatter_add_(1, ids, head[index] - rows.gather(1, ids))


def _residual_rows(rules, head, tail_scale, w, index: slice) -> torch.Tensor:
    """(w P - q_sel)+ at rows ``index`` (P normalised), float64 [m, V]: the correction's law, unnormalised."""
    scale = (w[:-1] / rules.psum)[index]
    return (rules.P_full[index] * scale[:, None] - _selected_rows(rules, head, tail_scale, index)).clamp_min(0.0)


def _running_ratio(ratio: torch.Tensor) -> torch.Tensor:
    """w [L+1]: w_0 = 1, w_i = min(1, w_{i-1} ratio_i), as exp(S_i - max(0, S_1..S_i)), S = cumsum log ratio."""
    s = torch.cumsum(torch.log(ratio), 0)
    return torch.cat([torch.ones_like(s[:1]), torch.exp(s - torch.cummax(s.clamp_min(0.0), 0).values)])


def _bv_terms(rules: _Rules, head: torch.Tensor, tail_scale: torch.Tensor, path: torch.Tensor):
    """BV on the selected path (rules and q_sel = (head, tail_scale) at its L depths).

    Returns (w [L+1], Z on the ranked head [L], the tail's share of Z bracketed: low [L], high [L]).
    Z_i = sum (w_i P - q_sel)+ (P normalised); on the tail q_sel = A Q, so its share lies between
    (w_i P_tail - A_i Q_tail)+ and w_i P_tail (masses from the head's sums: no pass over the vocabulary).
    """
    L = path.shape[0]
    tokens = path[:, None]
    position, ranked = _locate(rules, tokens)
    scale = (tail_scale / rules.qsum)[:, None]  # q_sel = scale Q off the ranked tokens
    q_at = torch.where(ranked, head.gather(1, position), rules.Q_full.gather(1, tokens) * scale).squeeze(1)
    p_at = rules.P_full.gather(1, tokens).squeeze(1) / rules.psum
    w = _running_ratio(torch.nan_to_num(p_at / q_at, nan=0.0, posinf=0.0))  # q_sel(x) = 0: w = 0
    z_head = ((w[:L, None] * rules.p - head).clamp_min(0.0) * rules.ranked).sum(-1)
    high = w[:L] * rules.tail_p
    return w, z_head, (high - tail_scale * rules.tail_q).clamp_min(0.0), high


def _tail_share(rules: _Rules, tail_scale: torch.Tensor, w: torch.Tensor, index) -> torch.Tensor:
    """The tail's exact share of Z at rows ``index`` (a slice or a list), [m]: one pass over the vocabulary.

    c sum (P - rho Q)+ over every token (c = w / sum P, rho = A sum P / (w sum Q): no denormal products
    however small w gets), less the same sum over the ranked head (round-off ~1e-16 absolute).
    """
    p_scale = (w[:-1] / rules.psum)[index][:, None]  # w P / sum P
    rho = ((tail_scale / rules.qsum)[index][:, None] / p_scale).clamp_max(1e300)  # w = 0: Z = 0 whatever rho
    excess = rules.Q_full[index] * rho  # float64 [m, V], the one temporary (then P - rho Q, in place)
    everywhere = torch.sub(rules.P_full[index], excess, out=excess).relu_().sum(-1)
    ids = rules.ids[index]
    P_head, Q_head = rules.P_full[index].gather(1, ids), rules.Q_full[index].gather(1, ids)
    on_head = (torch.addcmul(P_head.to(_F64), Q_head.to(_F64), rho, value=-1.0).clamp_min(0.0)
               * rules.ranked[index]).sum(-1)
    return (p_scale.squeeze(1) * (everywhere - on_head)).clamp_min(0.0)


@dataclass
class _PathTerms:
    """Everything BV needs along a selected path of L depths."""

    rules: _Rules  # [L]
    head: torch.Tensor  # [L, N] q_sel on the head
    tail_scale: torch.Tensor  # [L] q_sel = A Q / sum Q on the tail
    w: torch.Tensor  # [L + 1]
    z_head: torch.Tensor  # [L] Z on the ranked head
    low: torch.Tensor  # [L] the tail's share of Z is in [low, high]
    high: torch.Tensor  # [L]


def _stop_probability(z: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """h = Z / (Z + 1 - w), 1 if 0/0 (Z = 0 and w = 1)."""
    return torch.nan_to_num(z / (z + (1.0 - w)), nan=1.0)


def _inverse_cdf(row: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token [1] from ``row`` ([V], unnormalised) with the uniform u [1], no host read.

    u * total can round up onto the total: the second search returns the last token with mass then.
    """
    cumulative = row.cumsum(0, dtype=_F64)
    total = cumulative[-1:]
    token = torch.searchsorted(cumulative, u * total, right=True)
    return torch.minimum(token, torch.searchsorted(cumulative, total))


def _rows(probs: torch.Tensor, rows: list[int], depths: list[int]) -> torch.Tensor:
    """probs[rows[j], depths[j]], [n, V]: a view (no copy of n x V) when one draft covers consecutive depths, the
    usual case (drafts that agree all read row 0's rows; a lone survivor reads its own)."""
    if len(set(rows)) == 1 and depths == list(range(depths[0], depths[0] + len(depths))):
        return probs[rows[0], depths[0] : depths[0] + len(depths)]
    return probs[rows, depths]


def _prefix_leaders(tokens: list[list[int]]) -> list[list[int]]:
    """leaders[i][j] = the first draft whose first i tokens equal draft j's (i = 0..L)."""
    K, L = len(tokens), len(tokens[0])
    leaders = [[0] * K]
    for i in range(L):
        first: dict[tuple[int, int], int] = {}
        leaders.append([first.setdefault((leaders[i][j], tokens[j][i]), j) for j in range(K)])
    return leaders


# ------------------------------------------------------------------------------------------------ public helpers
class DepthRule:
    """The rule at one depth for one pair P = p(.|z), Q = q(.|z) ([V]), with ``rho`` = {count: rho_c} given.

    A readable per-row view of the closed forms the verifier evaluates in batches (tests, other rules).
    ``head_size`` None ranks every token with P + Q >= tail_threshold; the verifier also caps the ranked set
    at its own head_size. Counts missing from ``rho`` use rho = +inf (the greedy selection).
    """

    def __init__(self, P, Q, tail_threshold: float = DEFAULT_TAIL_THRESHOLD, rho: dict | None = None,
                 head_size: int | None = None) -> None:
        self.P, self.Q, self.tail_threshold, self.head_size = P, Q, tail_threshold, head_size
        self.rho: dict[int, float] = dict(rho or {})
        self._head = _ranked_head(P[None], Q[None], head_size, tail_threshold)
        self.ranked = self._head.ids[0][self._head.ranked[0]].sort().values  # ranked token ids, ascending
        self.has_tail = self.ranked.shape[0] < P.shape[-1]
        self.P_ranked = P[self.ranked] / self._head.psum  # normalised, float64
        self.Q_ranked = Q[self.ranked] / self._head.qsum

    def _rules(self, K: int) -> _Rules:
        if K < 2:
            return _single_draft_rules(self._head)
        rho = torch.tensor([[self.rho.get(c, math.inf) for c in range(2, K + 1)]], dtype=_F64, device=self.P.device)
        terms = _grid_terms(self._head.p, self._head.q, rho, K)
        return _pick(self._head, terms, rho, torch.arange(K - 1, device=self.P.device)[None])

    def full(self, weights: dict[int, float]) -> torch.Tensor:
        """q_sel = sum_c w_c f_c on the whole vocabulary, float64 [V] (weights: a law over counts, normalised)."""
        K = max(weights)
        w = torch.zeros(1, K, dtype=_F64, device=self.P.device)
        for c, value in weights.items():
            w[0, c - 1] = value
        rules = self._rules(K)
        head, tail_scale = _mixture(rules, w / w.sum())
        return _selected_rows(rules, head, tail_scale, slice(0, 1))[0]

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
    ``head_size`` tokens of largest P + Q (all of them when n <= head_size, i.e. exactly the METHODS.md
    rule), and f is evaluated on the head alone (alpha = the head's accepted mass). Ties: the smallest rho.
    """
    counts = [c for c in counts if c >= 2]
    if not counts:
        return {}
    if P.shape[-1] == 0:
        return {c: 1.0 for c in counts}
    head = _ranked_head(P[None], Q[None], head_size, 0.0, normalise=False)
    rho = _log_grid(head.r, grid_size)
    terms = _grid_terms(head.p, head.q, rho, max(counts), missing=1.0 - head.q.sum(-1))
    values = rho.gather(1, _best_grid_points(terms, head.p))[0].tolist()
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


# ------------------------------------------------------------------------------------------------ the rule
class SelectionBlockVerification(Verifier):
    """SBV: select one path through the K drafts with a known law, then BV on it (lossless).

    Options: ``count_posterior`` (default True: q_sel mixes f over the posterior of the survivor count;
    False: f at the observed count), ``selection`` ("randomized" = METHODS.md; "greedy" = always the
    highest-ratio survivor token, i.e. greedy multi-path BV), ``grid_size`` (points of the rho grid),
    ``head_size`` (the ranked set: at most this many tokens, those of largest P + Q; rho is chosen on it),
    ``tail_threshold`` (head tokens with P + Q below it are not ranked either). Tokens that are not ranked
    are accepted whenever drafted; see the module docstring.
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
        grid_size: int = DEFAULT_GRID_SIZE,
        head_size: int = DEFAULT_HEAD_SIZE,
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
        self._cache: dict[str, dict] = {}  # the exact law's memo tables
        self._serials = itertools.count()  # names each memoised rule (never reused)

    # ---------------------------------------------------------------- the rule at n prefixes, shared by both paths
    def _rules(self, P_rows: torch.Tensor, Q_rows: torch.Tensor, K: int) -> _Rules:
        """The rule at n prefixes with target / draft rows P_rows, Q_rows [n, V].

        On toy vocabularies each row's rule is memoised (n = 1), so the sampler and the exact law use the
        very same numbers and the many tiny calls of the Monte-Carlo tests stay cheap.
        """
        if P_rows.shape[-1] <= _CACHE_MAX_VOCAB:
            parts = [self._rule_at(P, Q, K) for P, Q in zip(P_rows, Q_rows)]
            if len(parts) == 1:
                return parts[0][1]
            key = tuple(serial for serial, _ in parts)
            return self._memo("stacks", key, lambda: _Rules.concat([rule for _, rule in parts]))
        return self._compute_rules(P_rows, Q_rows, K)

    def _rule_at(self, P: torch.Tensor, Q: torch.Tensor, K: int) -> tuple[int, _Rules]:
        """(serial, the rule at one prefix), memoised by (P, Q, K) on toy vocabularies."""
        compute = lambda: (next(self._serials), self._compute_rules(P[None], Q[None], K))  # noqa: E731
        if P.shape[-1] > _CACHE_MAX_VOCAB:
            return compute()
        return self._memo("rules", (P.cpu().numpy().tobytes(), Q.cpu().numpy().tobytes(), K), compute)

    def _compute_rules(self, P_rows: torch.Tensor, Q_rows: torch.Tensor, K: int) -> _Rules:
        head = _ranked_head(P_rows, Q_rows, self.head_size, self.tail_threshold)
        if K == 1:
            return _single_draft_rules(head)
        if P_rows.device.type == "cpu":
            # On the CPU the grid costs its size: keep only the head's tokens of finite rank (q > 0), the only
            # ones that can be rejected or drafted. The rest have q = 0 (their f and tail law are both 0) or are
            # not ranked (tail either way), so the rule is unchanged; one host read, none on a GPU.
            head = head.first(max(1, int(torch.isfinite(head.r).sum(-1).amax())))
        if self.selection == "greedy":
            rho = torch.full((P_rows.shape[0], 1), math.inf, dtype=_F64, device=P_rows.device)
        else:
            rho = _log_grid(head.r, self.grid_size)
        terms = _grid_terms(head.p, head.q, rho, K)
        return _pick(head, terms, rho, _best_grid_points(terms, head.p))

    def _weights(self, posterior: torch.Tensor | None, counts: torch.Tensor, K: int) -> torch.Tensor:
        """[L, K]: the law over counts 1..K that q_sel mixes at each depth (the posterior, or the observed count)."""
        if posterior is not None:
            return posterior
        return (counts[:, None] == torch.arange(1, K + 1, device=counts.device)).to(_F64)

    def _path_terms(self, rules: _Rules, path: torch.Tensor, counts: torch.Tensor, K: int) -> _PathTerms:
        """q_sel and BV's terms along the selected path (rules [L], tokens path [L], observed counts [L])."""
        posterior = _count_posterior(rules, path) if self.count_posterior and K > 1 else None
        head, tail_scale = _mixture(rules, self._weights(posterior, counts, K))
        return _PathTerms(rules, head, tail_scale, *_bv_terms(rules, head, tail_scale, path))

    def _toy_path_terms(self, target_probs, draft_probs, rows, path, counts, K) -> _PathTerms:
        """_path_terms on a toy vocabulary, memoised by (rules, path, counts): shared by sampler and exact law."""
        trail = [self._rule_at(target_probs[rows[i], i], draft_probs[rows[i], i], K) for i in range(len(path))]
        key = (tuple(serial for serial, _ in trail), tuple(path), tuple(counts))
        device = draft_probs.device
        return self._memo("paths", key, lambda: self._path_terms(
            _Rules.concat([rule for _, rule in trail]), torch.tensor(path, device=device),
            torch.tensor(counts, device=device), K))

    # ---------------------------------------------------------------- sampler
    def _sample(self, draft_tokens, draft_probs, target_probs, generator, state) -> VerifyResult:
        K, L = draft_tokens.shape
        device = draft_probs.device
        tokens = draft_tokens.tolist()  # host read 1: which drafts share which prefix
        leaders = _prefix_leaders(tokens)
        sizes = [Counter(level) for level in leaders]
        groups = [(i, row) for i in range(L) for row, size in sorted(sizes[i].items()) if size >= 2]
        n = len(groups)
        u = uniform(n * K + L + 1, generator, device=None if generator is not None else device).to(device)

        # Stage 1: the selection at every prefix shared by >= 2 drafts, in one batch.
        next_row: dict[tuple[int, int], int] = {}
        shared = None
        if groups:
            depth = [i for i, _ in groups]
            rows = [row for _, row in groups]
            shared = self._rules(_rows(target_probs, rows, depth), _rows(draft_probs, rows, depth), K)
            levels = torch.tensor([leaders[i] for i in depth], device=device)  # [n, K]: each draft's leader
            member = levels == torch.tensor(rows, device=device)[:, None]
            count_index = torch.tensor([sizes[i][row] - 2 for i, row in groups], device=device)
            candidates = draft_tokens.T[depth].long()  # [n, K]
            chosen = _select(shared, candidates, member, count_index, u[: n * K].view(n, K))
            next_row = dict(zip(groups, chosen.tolist()))  # host read 2
        rows = [0]
        for i in range(L):
            rows.append(next_row.get((i, rows[i]), rows[i]))  # a lone survivor keeps its own token
        path = [tokens[rows[i + 1]][i] for i in range(L)]
        counts = [sizes[i][rows[i]] for i in range(L)]

        # Stage 2: the rule at the depths of the path that no other draft shares (counts only shrink along
        # the path, so these are the depths from ``split`` on), then q_sel and BV's terms.
        path_tensor = torch.tensor(path, device=device)
        if draft_probs.shape[-1] <= _CACHE_MAX_VOCAB:
            terms = self._toy_path_terms(target_probs, draft_probs, rows, path, counts, K)
        else:
            position = {group: index for index, group in enumerate(groups)}
            shared_depths = [position[(i, rows[i])] for i in range(L) if (i, rows[i]) in position]
            split = len(shared_depths)
            parts = []
            if split:
                parts.append(shared if shared_depths == list(range(n)) else
                             shared.take(torch.tensor(shared_depths, device=device)))
            if split < L:
                alone = list(range(split, L))
                parts.append(self._rules(_rows(target_probs, rows[split:L], alone),
                                         _rows(draft_probs, rows[split:L], alone), K))
            rules = parts[0] if len(parts) == 1 else _Rules.concat(parts)
            terms = self._path_terms(rules, path_tensor, torch.tensor(counts, device=device), K)
        rules, head, tail_scale, w, z_head = terms.rules, terms.head, terms.tail_scale, terms.w, terms.z_head

        # tau = the largest i with eta_{i-1} <= h_i (h_0 = 1; h_L = w_L). h increases with Z: the bracket on
        # the tail's share decides most depths; the tail is summed exactly only where it does not.
        eta = u[n * K : n * K + L]
        h_low = torch.cat([_stop_probability(z_head + terms.low, w[:L])[1:], w[L:]])
        h_high = torch.cat([_stop_probability(z_head + terms.high, w[:L])[1:], w[L:]])
        sure, possible = torch.stack([eta <= h_low, eta <= h_high]).tolist()  # host read 3
        tau = max([i + 1 for i in range(L) if sure[i]], default=0)
        open_depths = [i + 1 for i in range(tau, L) if possible[i] and not sure[i]]
        if open_depths:  # host read 4: the exact decision where eta fell inside the bracket
            exact = z_head[open_depths] + _tail_share(rules, tail_scale, w, open_depths)
            success = (eta[[i - 1 for i in open_depths]] <= _stop_probability(exact, w[open_depths])).tolist()
            tau = max([i for i, ok in zip(open_depths, success) if ok], default=tau)
        if tau == L:
            row = target_probs[rows[L], L]  # the bonus
        else:  # the correction; p itself if the residual has no mass
            residual = _residual_rows(rules, head, tail_scale, w, slice(tau, tau + 1))[0]
            row = torch.where(residual.sum() > 0, residual, rules.P_full[tau])
        extra = _inverse_cdf(row, u[-1:])
        out = torch.cat([path_tensor[:tau], extra])
        return VerifyResult(tokens=out, num_accepted=tau, draft_index=rows[L], state=None)

    # ---------------------------------------------------------------- exact law
    def _memo(self, table: str, key, compute):
        """Memoise ``compute()`` under ``key`` in one of the exact law's tables (toy vocabularies only)."""
        memo = self._cache.setdefault(table, {})
        if key not in memo:
            if len(memo) >= _CACHE_MAX_ENTRIES:
                memo.clear()
            memo[key] = compute()
        return memo[key]

    def _law(self, draft_tokens, draft_probs, target_probs, state) -> list[Outcome]:
        """Enumerate the selection's events depth by depth; at each selected path add BV's law on it.

        Every number comes from the functions the sampler calls (the per-depth rule with n = 1 instead of a
        batch). A toy vocabulary revisits the same prefixes across draft tuples: the rule at each (P, Q),
        the events at each (rule, candidates) and the block law at each (rules, path, counts) are memoised.
        """
        K, L = draft_tokens.shape
        tokens = draft_tokens.tolist()
        columns = draft_tokens.T.long()  # [L, K]
        toy = draft_probs.shape[-1] <= _CACHE_MAX_VOCAB
        law: dict[tuple[int, ...], float] = {}

        def events_at(serial, rule, i, survivors) -> dict[int, float]:
            def compute():
                member = torch.zeros(1, K, dtype=torch.bool, device=columns.device)
                member[0, survivors] = True
                count_index = torch.full((1,), len(survivors) - 2, device=columns.device)
                probs = _selection_events(rule, columns[i][None], member, count_index)[0, survivors].tolist()
                events: dict[int, float] = {}
                for j, p_j in zip(survivors, probs):
                    events[tokens[j][i]] = events.get(tokens[j][i], 0.0) + p_j
                return events

            if not toy:
                return compute()
            return self._memo("events", (serial, tuple(tokens[j][i] for j in survivors)), compute)

        def descend(i, survivors, path, prob, trail):
            if i == L:
                rows = [row for _, _, row, _ in trail] + [survivors[0]]
                compute = lambda: self._block_law(target_probs, draft_probs, path, trail, rows, K)  # noqa: E731
                key = (tuple(serial for serial, _, _, _ in trail), tuple(path),
                       tuple(count for _, _, _, count in trail),
                       target_probs[rows[L], L].cpu().numpy().tobytes())
                for outcome, p in (self._memo("blocks", key, compute) if toy else compute()):
                    law[outcome] = law.get(outcome, 0.0) + prob * p
                return
            row = survivors[0]
            serial, rule = self._rule_at(target_probs[row, i], draft_probs[row, i], K)
            events = {tokens[row][i]: 1.0} if len(survivors) == 1 else events_at(serial, rule, i, survivors)
            for v, p_v in events.items():
                if p_v > 0:
                    descend(i + 1, [j for j in survivors if tokens[j][i] == v], path + [v], prob * p_v,
                            trail + [(serial, rule, row, len(survivors))])

        descend(0, list(range(K)), [], 1.0, [])
        return [Outcome(probability=p, tokens=t) for t, p in law.items() if p > 0]

    def _block_law(self, target_probs, draft_probs, path, trail, rows, K) -> list[tuple[tuple[int, ...], float]]:
        """The law of BV on ``path`` with the sampler's own q_sel, stop probabilities and outcome laws.

        trail[i] = (serial, rule, row, observed count) at depth i; rows = the L + 1 rows along the path.
        Returns [(tokens, probability)].
        """
        L = len(path)
        counts = [count for _, _, _, count in trail]
        if draft_probs.shape[-1] <= _CACHE_MAX_VOCAB:
            terms = self._toy_path_terms(target_probs, draft_probs, rows, path, counts, K)
        else:
            device = draft_probs.device
            rules = _Rules.concat([rule for _, rule, _, _ in trail])
            terms = self._path_terms(rules, torch.tensor(path, device=device), torch.tensor(counts, device=device), K)
        rules, head, tail_scale, w, z = terms.rules, terms.head, terms.tail_scale, terms.w, terms.z_head
        if bool((rules.tail_p > 0).any()):
            z = z + _tail_share(rules, tail_scale, w, slice(0, L))
        stop = torch.cat([_stop_probability(z, w[:L])[1:], w[L:]])
        residual = _residual_rows(rules, head, tail_scale, w, slice(0, L))
        mass = residual.sum(-1, keepdim=True)
        outcome_laws = torch.where(mass > 0, residual / mass.clamp_min(1e-300), rules.P_full / rules.psum[:, None])
        bonus = target_probs[rows[L], L].to(_F64)
        outcome_laws = torch.cat([outcome_laws, (bonus / bonus.sum())[None]]).tolist()
        h = [1.0] + stop.tolist()  # h_0 = 1: the scan always has depth 0 to fall back on
        out = []
        survive = 1.0  # P(no success at the depths above i)
        for i in range(L, -1, -1):
            stopped = survive * h[i]
            survive *= 1.0 - h[i]
            if stopped > 0:
                out += [(tuple(path[:i]) + (y,), stopped * p_y) for y, p_y in enumerate(outcome_laws[i]) if p_y > 0]
        return out
