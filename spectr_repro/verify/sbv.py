"""SBV — selection block verification (ours; lossless for any K). Derivation: docs/sbv.md.

Two stages per iteration:

1. *Select* one path x = (x_1..x_L) through the K drafts, top-down. At depth i (prefix z = x^i,
   survivors S = the drafts whose first i tokens equal z, k = |S|), with P = p(.|z), Q = q(.|z) and
   tokens ranked by r = P/Q ascending (ties: lower id first; r = +inf where Q = 0): scan the survivors in
   draft order, accepting survivor j's token with probability a = min(1, P/(rho_k Q)) at that token; if
   none is accepted take the survivor token of highest rank. Given c survivors the selected token has law

       f(v; rho, c) = Q(v) a(v) A_c + G(v)^c - G^-(v)^c,
       A_c = (1 - (1 - alpha)^c) / alpha = sum_{j<c} beta^j,   beta = 1 - alpha = sum Q (1 - a),
       G = cumsum of Q (1 - a) in rank order,  G^- = G - Q (1 - a),

   and rho_c is the point of a log grid over [1, 50 max r] maximising sum_v min(f(v; rho, c), P(v)).
   The survivor count is random, so the law of x_{i+1} given the selected prefix alone is
   q_sel[i] = sum_c pi(c) f(.; rho_c, c), pi = the exact posterior of the count given z, updated after
   each depth. ``count_posterior=False`` uses f(.; rho_k, k) at the observed count instead (also valid).
2. Run plain block verification (BV) on the selected path with q_sel as the draft law.

Shapes: draft_tokens [K, L], draft_probs [K, L, V], target_probs [K, L+1, V] (see verify.base).
Powers and cumulative sums are float64.

Large vocabularies. The closed form holds for ANY acceptance function a(.) in [0, 1] and any total order.
The rule ranks the tokens with P + Q >= ``tail_threshold``, at most ``rank_size`` of them (those of largest
P + Q); every other token (the tail) is accepted whenever drafted (a = 1): it adds nothing to G, needs no
rank, and its f is Q A_c exactly. rho_c is chosen on the ``head_size`` ranked tokens of largest P + Q, as
if they were the whole vocabulary. Any deterministic choice of the ranked set and of rho keeps the rule
valid, because f is computed exactly for the choice made (docs/sbv.md, section 4). On toy vocabularies
(V <= head_size, every probability >= 1e-4) every token is ranked and the rule is exactly docs/methods.md's.

Cost on a GPU (docs/sbv.md, section 5). Everything is vectorised over the candidates, the counts
c = 2..K, the rho grid and the ranked tokens; Python loops run over the L depths only (the count
posterior's chain of [K] x [K, K] products). The rule is evaluated in two batches: every prefix shared
by >= 2 drafts (whose selections are all decided at once: each depends on its own uniforms only, so
deciding those off the path changes nothing), then the path's other depths. BV's stop probabilities are
bracketed from the tail's masses; the tail is summed over the vocabulary only at the depths where the
bracket does not decide. Host reads: the draft tokens (which drafts share which prefix is bookkeeping on
K x L integers), the selections, the decisions, and the exact decisions when needed; on the CPU up to two
more per batch (the ranked set read off the threshold when it fits in rank_size: no top-k).

``expected_emitted`` (E[tau + 1 | drafts], exact) walks the exact law's selection events with the same rules,
q_sel and stop probabilities, without the correction laws: at most K selected paths, no host read per path.
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
from spectr_repro.verify.common import (
    ValueMemo,
    expected_emitted_from_stops,
    running_ratio,
    stop_probability,
    tensor_key,
)

__all__ = [
    "Decision",
    "DepthRule",
    "SelectionBlockVerification",
    "choose_rho",
    "count_likelihood",
    "selection_law",
]

SELECTIONS = ("randomized", "greedy")
DEFAULT_TAIL_THRESHOLD = 1e-6
DEFAULT_GRID_SIZE = 64
DEFAULT_HEAD_SIZE = 256  # the tokens rho is chosen on
DEFAULT_RANK_SIZE = 4096  # the most tokens ranked
RHO_SPAN = 50.0  # the rho grid covers [1, RHO_SPAN * max r]
_CACHE_MAX_VOCAB = 64  # memoise per-prefix rules only for toy vocabularies
_CACHE_MAX_ENTRIES = 100_000
_F64 = torch.float64


# ------------------------------------------------------------------------------------------------ ranked tokens
@dataclass
class _Head:
    """Ranked tokens of n rows (P, Q) in rank order: r = P/Q ascending, ties lower id first.

    Slots below the threshold carry p = q = 0 (rank key +inf, so they sort last): they belong to the tail,
    like every token that is not in the head.
    """

    ids: torch.Tensor  # [n, N] long, token ids
    ranked: torch.Tensor  # [n, N] bool, P + Q >= tail_threshold
    p: torch.Tensor  # [n, N] float64, P / sum P (0 where not ranked)
    q: torch.Tensor  # [n, N] float64, Q / sum Q (0 where not ranked)
    r: torch.Tensor  # [n, N] float64, p / q ascending (+inf where q = 0)
    psum: torch.Tensor  # [n] float64 row sums: rows are renormalised in float64, as they were sampled from
    qsum: torch.Tensor  # [n]

    def top(self, size: int) -> _Head:
        """The ``size`` tokens of largest p + q (all if there are no more), still in rank order."""
        if self.ids.shape[-1] <= size:
            return self
        keep = torch.topk(self.p + self.q, size, dim=-1, sorted=False).indices.sort(-1).values
        return replace(self, ids=self.ids.gather(-1, keep), ranked=self.ranked.gather(-1, keep),
                       p=self.p.gather(-1, keep), q=self.q.gather(-1, keep), r=self.r.gather(-1, keep))


def _rank_key(P: torch.Tensor, Q: torch.Tensor) -> torch.Tensor:
    """r = P/Q, +inf where Q = 0 (such tokens are never drafted; their f is 0 whatever their rank)."""
    return torch.nan_to_num(P / Q, nan=math.inf, posinf=math.inf)  # P/0 = inf; 0/0 = nan -> inf


def _fresh(shape, dtype: torch.dtype, device: torch.device, name: str = "") -> torch.Tensor:
    """A new uninitialised tensor (the default scratch space: see SelectionBlockVerification._scratch)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _reaching_ids(reach: torch.Tensor, count: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [n, width], valid [n, width]): the ids of the True entries of reach [n, V] (count [n] per row), in
    ascending order, padded with id 0 marked invalid."""
    n = reach.shape[0]
    rows, cols = reach.nonzero(as_tuple=True)  # row-major: ascending ids within each row
    slot = torch.arange(rows.shape[0], device=reach.device) - (count.cumsum(0) - count)[rows]
    ids = torch.zeros((n, width), dtype=torch.long, device=reach.device)
    ids[rows, slot] = cols
    return ids, torch.arange(width, device=reach.device) < count[:, None]


def _ranked_head(
    P_rows: torch.Tensor, Q_rows: torch.Tensor, size: int | None, tail_threshold: float, normalise: bool = True,
    scratch=_fresh, shrink: bool | None = None,
) -> _Head:
    """The ``size`` tokens of largest P + Q of each row ([n, V] rows, any float dtype), in rank order, those
    below ``tail_threshold`` marked unranked; every token if V <= size (or size None).

    ``scratch(shape, dtype, device, name)`` provides the [n, V] temporaries (the float64 copy of the rows
    their sums need, P + Q and its threshold mask). ``shrink`` (default: on the CPU) finds the same set with
    two host reads and no top-k when at most ``size`` tokens reach the threshold.
    """
    n, V = P_rows.shape
    device = P_rows.device
    wide = scratch((n, V), _F64, device, "rows64")
    psum, qsum = wide.copy_(P_rows).sum(-1), wide.copy_(Q_rows).sum(-1)  # float64 sums of the rows
    ids, valid = None, None
    if size is None or V <= size:
        ids = torch.arange(V, device=device).expand(n, V)
    else:
        mass = torch.add(P_rows, Q_rows, out=scratch((n, V), P_rows.dtype, device, "mass"))
        if shrink if shrink is not None else device.type == "cpu":
            # A top-k costs its k on the CPU (15 ms for 12 rows at k = 4096): when at most ``size`` tokens reach
            # the threshold, take exactly those (the same set: they are the largest), at the price of two host
            # reads. A GPU takes the top-k, with no read.
            reach = torch.ge(mass, tail_threshold, out=scratch((n, V), torch.bool, device, "reach"))
            count = reach.sum(-1)
            most = int(count.amax())
            if most <= size:
                ids, valid = _reaching_ids(reach, count, max(most, 1))
        if ids is None:  # ascending ids, so that the stable sort below breaks rank ties by the lower id
            ids = torch.topk(mass, size, dim=-1, sorted=False).indices.sort(-1).values
    P_head, Q_head = P_rows.gather(-1, ids), Q_rows.gather(-1, ids)
    ranked = (P_head + Q_head) >= tail_threshold  # in the rows' own dtype
    if valid is not None:
        ranked &= valid
    if normalise:
        p, q = P_head / psum[:, None] * ranked, Q_head / qsum[:, None] * ranked  # float64
    else:
        p, q = P_head.to(_F64) * ranked, Q_head.to(_F64) * ranked
    r, order = torch.sort(_rank_key(p, q), dim=-1, stable=True)
    return _Head(ids.gather(-1, order), ranked.gather(-1, order), p.gather(-1, order), q.gather(-1, order), r,
                 psum, qsum)


# ------------------------------------------------------------------------------------------------ choosing rho
@functools.cache
def _grid_steps(grid_size: int, device: torch.device) -> torch.Tensor:
    return torch.arange(grid_size, dtype=_F64, device=device) / (grid_size - 1)


def _log_grid(r: torch.Tensor, grid_size: int) -> torch.Tensor:
    """[n, grid]: the log grid over [1, RHO_SPAN * max finite r] of each row (r: [n, N])."""
    r_max = torch.nan_to_num(r, posinf=0.0).amax(-1).clamp_min(1.0)  # r >= 0, never NaN
    return torch.exp(torch.log(RHO_SPAN * r_max)[:, None] * _grid_steps(grid_size, r.device))


def _grid_laws(p: torch.Tensor, q: torch.Tensor, grid: torch.Tensor, K: int, missing: torch.Tensor) -> torch.Tensor:
    """f(.; rho, c) [n, C, G, N] for p, q [n, N] in rank order at every grid point rho [n, G] and count c = 2..K.

    ``missing`` [n]: mass outside p, q that is never accepted (1 - sum q: the head taken as the vocabulary).
    G^c - G^-^c = d G^(c-1) sum_{j<c} x^j with d = Q (1 - a), x = G^-/G in [0, 1]: the powers over the count
    axis are cumulative products, every term is positive (no cancellation).
    """
    C = K - 1
    accepted = torch.minimum(q[:, None, :], p[:, None, :] / grid[:, :, None])  # [n, G, N]
    rejected = q[:, None, :] - accepted
    g = rejected.cumsum(-1)
    keep = g[..., -1] + missing[:, None]  # 1 - alpha

    def powers(t: torch.Tensor) -> torch.Tensor:  # [n, *rest] -> [n, C, *rest]: t^1 .. t^C
        return t.unsqueeze(1).expand(t.shape[0], C, *t.shape[1:]).cumprod(1)

    excess = powers(keep).cumsum(1)  # A_c - 1 = (1 - alpha) + ... + (1 - alpha)^(c-1), [n, C, G]
    ratio = torch.nan_to_num((g - rejected) / g, nan=0.0)  # x; 0/0 where g = 0 (there d = 0 too)
    power_sums = powers(ratio).cumsum(1).add_(1.0)  # 1 + x + ... + x^(c-1)
    return accepted[:, None] * (1.0 + excess)[..., None] + rejected[:, None] * powers(g) * power_sums


def _best_grid_points(laws: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """[n, C]: the grid index maximising sum_v min(f, P) per count (argmax: the first maximum, smallest rho)."""
    return torch.minimum(laws, p[:, None, None, :]).sum(-1).argmax(-1)


# ------------------------------------------------------------------------------------------------ the rule
@dataclass
class _Rules:
    """The selection rule at n prefixes (rows), for the counts c = 2..K (count axis: index c - 2).

    A single survivor (c = 1) always selects its own token: f = Q, nothing to store.
    """

    ids: torch.Tensor  # [n, N] ranked token ids in rank order
    ranked: torch.Tensor  # [n, N] bool (False: a tail token, or padding)
    p: torch.Tensor  # [n, N] float64 P (normalised, 0 where not ranked)
    q: torch.Tensor  # [n, N] float64 Q (normalised, 0 where not ranked)
    psum: torch.Tensor  # [n]
    qsum: torch.Tensor  # [n]
    reject: torch.Tensor  # [n, C] beta_c = 1 - alpha_c
    excess: torch.Tensor  # [n, C] A_c - 1
    accepted: torch.Tensor  # [n, C, N] Q a
    g_minus: torch.Tensor  # [n, C, N] G^-
    law: torch.Tensor  # [n, C, N] f_c on the ranked tokens

    def take(self, index: torch.Tensor) -> _Rules:
        return _Rules(*(getattr(self, f.name).index_select(0, index) for f in fields(self)))

    @staticmethod
    def concat(parts: list[_Rules]) -> _Rules:
        """The rows of several rules; ranked sets of different sizes are padded with unranked slots."""
        size = max(part.ids.shape[-1] for part in parts)

        def padded(part: _Rules, name: str) -> torch.Tensor:
            t = getattr(part, name)
            if name in _TOKEN_FIELDS and t.shape[-1] < size:
                t = torch.nn.functional.pad(t, (0, size - t.shape[-1]))  # id 0, unranked, no mass: no effect
            return t

        return _Rules(*(torch.cat([padded(part, f.name) for part in parts]) for f in fields(_Rules)))


_TOKEN_FIELDS = frozenset({"ids", "ranked", "p", "q", "accepted", "g_minus", "law"})  # [..., N]


def _head_fields(head: _Head) -> dict:
    """The count-free fields of the rule: the ranked tokens and the row sums."""
    return dict(ids=head.ids, ranked=head.ranked, p=head.p, q=head.q, psum=head.psum, qsum=head.qsum)


@functools.cache
def _count_powers(K: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(counts c = 2..K [C, 1], exponents j = 1..K-1 [K-1], the mask j < c [C, K-1]), float64 constants."""
    counts = torch.arange(2, K + 1, dtype=_F64, device=device)[:, None]
    exponents = torch.arange(1, K, dtype=_F64, device=device)
    return counts, exponents, (exponents < counts).to(_F64)


def _rules_at(head: _Head, rho: torch.Tensor, K: int) -> _Rules:
    """The rule on ``head`` with rho_c = rho[:, c - 2] ([n, C], may be +inf) at each count c = 2..K.

    G^c - G^-^c = -G^c expm1(c log1p(-d/G)) (d = Q (1 - a) = G - G^-): relative accuracy, no cancellation.
    A_c - 1 = beta + ... + beta^(c-1), beta = sum Q (1 - a) = 1 - alpha (the tail is never rejected).
    """
    counts, exponents, below = _count_powers(K, head.q.device)
    accepted = torch.minimum(head.q[:, None, :], head.p[:, None, :] / rho[:, :, None])  # [n, C, N]; P/inf = 0
    rejected = head.q[:, None, :] - accepted
    g = rejected.cumsum(-1)
    power_gap = torch.nan_to_num(-g.pow(counts) * torch.expm1(counts * torch.log1p(-rejected / g)), nan=0.0)
    reject = g[..., -1]
    excess = (reject[..., None].pow(exponents) * below).sum(-1)
    return _Rules(**_head_fields(head), reject=reject, excess=excess, accepted=accepted,
                  g_minus=g - rejected, law=accepted * (1.0 + excess)[..., None] + power_gap)  # 0/0 where G = 0


def _single_draft_rules(head: _Head) -> _Rules:
    """K = 1: no count >= 2, f = Q."""
    n, N = head.q.shape
    empty, empty_tokens = head.q.new_zeros((n, 0)), head.q.new_zeros((n, 0, N))
    return _Rules(**_head_fields(head), reject=empty, excess=empty, accepted=empty_tokens,
                  g_minus=empty_tokens, law=empty_tokens)


# ------------------------------------------------------------------------------------------------ the scan
def _first_true(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(any, index of the first True) along the last dim (argmax returns the first maximum; torch.max(dim)
    has slow CPU paths on some small shapes, ~30 ms)."""
    return mask.any(-1), mask.to(torch.uint8).argmax(-1)


def _locate(rules: _Rules, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(position in rank order [n, T], ranked [n, T]) of tokens [n, T] among each row's ranked tokens."""
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


def _select(rules: _Rules, tokens, member, count_index, u) -> tuple[torch.Tensor, torch.Tensor]:
    """The scan, for n prefixes at once: ([n] the first member (draft row) carrying the selected token,
    [n] the draft whose draw was accepted, -1 where none was and the token of top rank was taken).

    tokens [n, K]: each draft's token at the prefix's depth; member [n, K]: the drafts sharing the prefix;
    u [n, K] uniforms. Survivor j is accepted when u_j < a(token_j); none accepted: the token of top rank.
    """
    a, position = _acceptance(rules, tokens, count_index)
    accepted = member & (u < a)
    any_accepted, first = _first_true(accepted)
    chosen = torch.where(any_accepted, first, torch.where(member, position, -1).argmax(-1))
    token = tokens.gather(1, chosen[:, None])
    return _first_true(member & (tokens == token))[1], torch.where(any_accepted, first, -1)


def _scan_events(rules: _Rules, tokens, member, count_index) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The law of ``_select``'s scan: ([n, K] P(draft j's draw is the first accepted), [n] P(none is accepted),
    [n, 1] the draft carrying the token of top rank, taken then)."""
    a, position = _acceptance(rules, tokens, count_index)
    a = torch.where(member, a, 0.0)
    survive = torch.cumprod(1.0 - a, -1)  # no acceptance among drafts 0..j
    probs = a * torch.cat([torch.ones_like(a[:, :1]), survive[:, :-1]], -1)
    return probs, survive[:, -1], torch.where(member, position, -1).argmax(-1, keepdim=True)


def _selection_events(rules: _Rules, tokens, member, count_index) -> torch.Tensor:
    """[n, K]: the probability that the scan selects draft j's token at draft j (the law of ``_select``)."""
    probs, none, top = _scan_events(rules, tokens, member, count_index)
    return probs.scatter_add(1, top, none[:, None])


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

    pi_0 = point mass at K; pi_{i+1} = pi_i lik_i, normalised (the sum is q_sel_i(x_{i+1})). A 1e-308 floor on
    count 1 only settles 0/0, which a selected token cannot produce (then pi = point mass at 1).
    """
    L, K, _ = lik.shape
    floor = torch.zeros(K, dtype=_F64, device=lik.device)
    floor[0] = torch.finfo(_F64).tiny
    lik = lik + floor
    lik = torch.cat([lik, lik.sum(-1, keepdim=True)], -1)  # [L, K, K + 1]: one product gives pi lik and its sum
    pi = torch.zeros(1, K, dtype=_F64, device=lik.device)
    pi[0, K - 1] = 1.0
    laws = [pi]
    for i in range(L - 1):
        unnormalised = torch.mm(laws[-1], lik[i])
        laws.append(unnormalised[:, :K] / unnormalised[:, K:])
    return torch.cat(laws)


def _count_posterior(rules: _Rules, q_at: torch.Tensor, path: torch.Tensor) -> torch.Tensor:
    """[L, K] posterior of the survivor count along the selected path (rules [L], q_at = Q(x_{i+1}) [L])."""
    L, C, _ = rules.accepted.shape
    position, ranked = _locate(rules, path[:, None])
    at = position[:, None, :].expand(L, C, 1)
    m = rules.accepted.gather(2, at).squeeze(2)
    g_minus = rules.g_minus.gather(2, at).squeeze(2) * ranked
    a = torch.where(ranked, m / q_at[:, None], 1.0)
    one, zero = torch.ones_like(q_at[:, None]), torch.zeros_like(q_at[:, None])  # count 1: a = 1, nothing rejected
    lik = _count_likelihoods(q_at, torch.cat([one, a], 1), torch.cat([zero, rules.reject], 1),
                             torch.cat([zero, g_minus], 1))
    return _posterior_chain(lik)


# ------------------------------------------------------------------------------------------------ q_sel and BV
def _mixture(rules: _Rules, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q_sel = sum_c w_c f_c (weights [n, K]: a law over counts 1..K) as (its values at the ranked tokens
    [n, N], the tail scale A [n]): q_sel = A Q / sum Q on the tail.

    Written q + sum_{c>=2} w_c (f_c - q) (equal, as the weights sum to 1), so that q_sel is exactly Q
    where every f_c is (q = p, or a single survivor). The tail: A = 1 + sum_c w_c (A_c - 1).
    """
    w = weights[:, 1:]
    head = rules.q + torch.einsum("nc,ncv->nv", w, rules.law - rules.q[:, None])
    return head, 1.0 + (w * rules.excess).sum(-1)


def _selected_law_rows(Q_rows, ids, ranked, head, q_scale) -> torch.Tensor:
    """q_sel on the whole vocabulary, float64 [m, V]: q_scale Q on the tail, plus each ranked token's own
    value added as a difference (padding and unranked slots add 0). Q_rows [m, V], q_scale [m] = A / sum Q."""
    rows = Q_rows * q_scale[:, None]
    return rows.scatter_add_(1, ids, (head - rows.gather(1, ids)) * ranked)


def _tail_share(P_rows, Q_rows, ids, ranked, p_scale, q_scale) -> torch.Tensor:
    """The tail's exact share of Z = sum (p_scale P - q_sel)+ ([m]; rows [m, V], scales [m]): one pass.

    c sum (P - rho Q)+ over every token (c = p_scale, rho = q_scale / c: no denormal products however small
    w gets), less the same sum over the ranked tokens (round-off ~1e-16 absolute).
    """
    c = p_scale[:, None]
    rho = (q_scale[:, None] / c).clamp_max(1e300)  # w = 0: c = 0 and the share is 0 whatever rho
    excess = Q_rows * rho  # float64 [m, V], the one temporary (then P - rho Q in place)
    everywhere = torch.sub(P_rows, excess, out=excess).relu_().sum(-1)
    P_head, Q_head = P_rows.gather(1, ids).to(_F64), Q_rows.gather(1, ids).to(_F64)
    on_ranked = (torch.addcmul(P_head, Q_head, rho, value=-1.0).clamp_min(0.0) * ranked).sum(-1)
    return (c.squeeze(1) * (everywhere - on_ranked)).clamp_min(0.0)


@dataclass
class _PathTerms:
    """q_sel and BV's terms along a selected path of L depths."""

    rules: _Rules  # [L]
    P_rows: torch.Tensor  # [L, V] target rows along the path (as given)
    Q_rows: torch.Tensor  # [L, V] draft rows
    head: torch.Tensor  # [L, N] q_sel at the ranked tokens
    q_scale: torch.Tensor  # [L] q_sel = q_scale Q on the tail (A / sum Q)
    w: torch.Tensor  # [L + 1] BV's running ratio
    p_scale: torch.Tensor  # [L] w / sum P
    z_head: torch.Tensor  # [L] Z_i over the ranked tokens
    low: torch.Tensor  # [L] the tail's share of Z_i lies in [low, high]
    high: torch.Tensor  # [L]
    tail_p: torch.Tensor  # [L] the tail's mass under P

    def exact_z(self, index) -> torch.Tensor:
        """Z at depths ``index`` (a list or a slice), with the tail summed over the vocabulary."""
        share = _tail_share(self.P_rows[index], self.Q_rows[index], self.rules.ids[index], self.rules.ranked[index],
                            self.p_scale[index], self.q_scale[index])
        return self.z_head[index] + share

    def exact_stops(self) -> torch.Tensor:
        """h_1..h_L [L] with the exact Z_i (the tail summed over the vocabulary at every depth whose tail has
        mass under P; Z_head is exact where it has none): what the sampler's bracket and exact decisions
        amount to. One [L - 1, V] pass where there is a tail, no host read."""
        L = self.w.shape[0] - 1
        z = self.z_head[1:L]
        if L > 1:
            z = torch.where(self.tail_p[1:L] > 0, self.exact_z(slice(1, L)), z)
        return _stops(z, self.w)

    def residual(self, index: slice) -> torch.Tensor:
        """(w P - q_sel)+ (P normalised) at depths ``index``, float64 [m, V]: the correction's law, unnormalised."""
        rules = self.rules
        q_sel = _selected_law_rows(self.Q_rows[index], rules.ids[index], rules.ranked[index], self.head[index],
                                   self.q_scale[index])
        return (self.P_rows[index] * self.p_scale[index][:, None] - q_sel).clamp_min(0.0)

    def correction_row(self, depth: int) -> torch.Tensor:
        """The law of the token emitted after stopping at ``depth``, unnormalised [V]: the residual, or P (as
        given) where the residual has no mass (what the sampler draws from)."""
        residual = self.residual(slice(depth, depth + 1))[0]
        return torch.where(residual.sum() > 0, residual, self.P_rows[depth])

    def correction_law(self, index: slice) -> torch.Tensor:
        """The law of the token emitted after stopping at depths ``index``, float64 [m, V]: the residual
        normalised, or P (normalised) where it has no mass."""
        residual = self.residual(index)
        mass = residual.sum(-1, keepdim=True)
        return torch.where(mass > 0, residual / mass.clamp_min(1e-300), self.P_rows[index].to(_F64) /
                           self.rules.psum[index][:, None])


def _stops(z: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """BV's stop probabilities h_1..h_L [L] on the path from Z_1..Z_{L-1} [L - 1] and w_0..w_L [L + 1]:
    h_i = Z_i / (Z_i + 1 - w_i), h_L = w_L (h_0 = 1 is implicit: depth 0 is the floor). The sampler's bracket,
    the exact law and the expectation all take h from here (the sampler's exact decisions at single depths
    apply the same stop_probability)."""
    L = w.shape[0] - 1
    return torch.cat([stop_probability(z, w[1:L]), w[L:]])


def _stop_law(h: torch.Tensor) -> list[float]:
    """[P(tau = i) for i = 0..L] of BV's backward scan from h_1..h_L [L] (one host read): tau = the largest i
    with a success (probability h_i, independent), 0 if none (h_0 = 1)."""
    h = [1.0] + h.tolist()
    L = len(h) - 1
    stop_law, survive = [0.0] * (L + 1), 1.0  # survive: P(no success at the depths above i)
    for i in range(L, -1, -1):
        stop_law[i] = survive * h[i]
        survive *= 1.0 - h[i]
    return stop_law


def _path_terms(rules: _Rules, P_rows, Q_rows, path: torch.Tensor, weights_of) -> _PathTerms:
    """q_sel and BV's terms on ``path`` [L] (rules and rows along it); ``weights_of(q_at)`` gives the law over
    counts [L, K] that q_sel mixes at each depth.

    Z_i = sum (w_i P - q_sel)+ (P normalised) is computed over the ranked tokens; on the tail q_sel = A Q, so
    the tail's share lies between (w_i P_tail - A_i Q_tail)+ and w_i P_tail (no pass over the vocabulary).
    """
    L = path.shape[0]
    tokens = path[:, None]
    Q_at = Q_rows.gather(1, tokens).squeeze(1)
    head, tail_scale = _mixture(rules, weights_of(Q_at / rules.qsum))
    q_scale = tail_scale / rules.qsum
    position, ranked = _locate(rules, tokens)
    q_sel_at = torch.where(ranked.squeeze(1), head.gather(1, position).squeeze(1), Q_at * q_scale)
    p_at = P_rows.gather(1, tokens).squeeze(1) / rules.psum
    w = running_ratio(torch.nan_to_num(p_at / q_sel_at, nan=0.0, posinf=0.0))  # q_sel(x) = 0: w = 0
    z_head = ((w[:L, None] * rules.p - head).clamp_min(0.0) * rules.ranked).sum(-1)
    # the tail's masses (exactly 0 when every token is ranked)
    has_tail = rules.ranked.sum(-1) < P_rows.shape[-1]
    tail_p = torch.where(has_tail, (1.0 - rules.p.sum(-1)).clamp_min(0.0), 0.0)
    tail_q = torch.where(has_tail, (1.0 - rules.q.sum(-1)).clamp_min(0.0), 0.0)
    high = w[:L] * tail_p
    return _PathTerms(rules, P_rows, Q_rows, head, q_scale, w, w[:L] / rules.psum, z_head,
                      (high - tail_scale * tail_q).clamp_min(0.0), high, tail_p)


def _inverse_cdf(row: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token [1] from ``row`` ([V], unnormalised) with the uniform u [1], no host read.

    u * total can round up onto the total: the second search returns the last token with mass then.
    """
    cumulative = row.cumsum(0, dtype=_F64)
    total = cumulative[-1:]
    token = torch.searchsorted(cumulative, u * total, right=True)
    return torch.minimum(token, torch.searchsorted(cumulative, total))


# ------------------------------------------------------------------------------------------------ bookkeeping
def _rows(probs: torch.Tensor, rows: list[int], depths: list[int]) -> torch.Tensor:
    """probs[rows[j], depths[j]], [n, V]: a view (no copy of n x V) when one draft covers consecutive depths,
    the usual case (drafts that agree all read row 0's rows; a lone survivor reads its own)."""
    if len(set(rows)) == 1 and depths == list(range(depths[0], depths[0] + len(depths))):
        return probs[rows[0], depths[0] : depths[0] + len(depths)]
    return probs[rows, depths]


def _shared_groups(tokens: list[list[int]]):
    """(leaders, sizes, groups): ``_prefix_leaders``, the number of drafts behind each leader at each depth
    (sizes[i][leader]) and the (depth, leader) of every prefix shared by >= 2 drafts, in batch order."""
    leaders = _prefix_leaders(tokens)
    sizes = [Counter(level) for level in leaders]
    groups = [(i, row) for i in range(len(tokens[0])) for row, size in sorted(sizes[i].items()) if size >= 2]
    return leaders, sizes, groups


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
    ``head_size`` None ranks every token with P + Q >= tail_threshold (the verifier caps the ranked set at
    its rank_size). Counts missing from ``rho`` use rho = +inf (the greedy selection).
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
        return _rules_at(self._head, rho, K)

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
    head = _ranked_head(P[None], Q[None], head_size, 0.0, normalise=False)
    grid = _log_grid(head.r, grid_size)
    laws = _grid_laws(head.p, head.q, grid, max(counts), missing=1.0 - head.q.sum(-1))
    values = grid.gather(1, _best_grid_points(laws, head.p))[0].tolist()
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


@dataclass
class Decision:
    """What SBV's sampler decided on one block before emitting its last token (what sbvf's fallback reads)."""

    tokens: list[list[int]]  # the drafts, on the host
    leaders: list[list[int]]  # leaders[i][j]: the first draft sharing draft j's first i tokens
    rows: list[int]  # [L + 1] the draft whose rows the selected path reads at each depth (the group's leader)
    path: list[int]  # [L] the selected path
    counts: list[int]  # [L] survivors at each depth of the path
    terms: _PathTerms  # q_sel and BV's terms along the path
    tau: int  # BV's stop depth
    last_uniform: torch.Tensor  # [1] the uniform of the emitted token
    groups: list[tuple[int, int]]  # the (depth, leader) of every prefix shared by >= 2 drafts, in batch order
    accepted_draft: torch.Tensor | None  # [len(groups)] the draft whose draw the scan accepted there, -1: none

    def survivors(self, depth: int) -> list[int]:
        """The drafts whose first ``depth`` tokens are the selected path's, in draft order."""
        return [j for j, leader in enumerate(self.leaders[depth]) if leader == self.rows[depth]]


# ------------------------------------------------------------------------------------------------ the verifier
class SelectionBlockVerification(Verifier):
    """SBV: select one path through the K drafts with a known law, then BV on it (lossless).

    Options: ``count_posterior`` (default True: q_sel mixes f over the posterior of the survivor count;
    False: f at the observed count), ``selection`` ("randomized" = docs/methods.md; "greedy" = always the
    highest-ratio survivor token, i.e. greedy multi-path BV), ``grid_size`` (points of the rho grid),
    ``head_size`` (rho is chosen on the ranked tokens of largest P + Q, at most this many),
    ``tail_threshold`` and ``rank_size`` (the ranked tokens: P + Q >= tail_threshold, at most rank_size of
    them, those of largest P + Q; the others are accepted whenever drafted). See the module docstring.
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
        rank_size: int = DEFAULT_RANK_SIZE,
        **options,
    ) -> None:
        super().__init__(check_inputs=check_inputs, **options)
        if selection not in SELECTIONS:
            raise ValueError(f"sbv: selection must be one of {SELECTIONS}, got {selection!r}")
        if grid_size < 2 or head_size < 1 or rank_size < 1 or not tail_threshold >= 0:
            raise ValueError(
                "sbv: need grid_size >= 2, head_size >= 1, rank_size >= 1 and tail_threshold >= 0; "
                f"got {grid_size}, {head_size}, {rank_size}, {tail_threshold}"
            )
        self.count_posterior = bool(count_posterior)
        self.selection = selection
        self.grid_size = int(grid_size)
        self.head_size = int(head_size)
        self.tail_threshold = float(tail_threshold)
        self.rank_size = int(rank_size)
        self._memos = ValueMemo(_CACHE_MAX_ENTRIES)  # memo tables (toy vocabularies)
        self._buffers: dict[str, torch.Tensor] = {}  # scratch space kept between calls
        self._serials = itertools.count()  # names each memoised rule (never reused)

    # ---------------------------------------------------------------- the rule, shared by sampler and law
    def _rules(self, P_rows: torch.Tensor, Q_rows: torch.Tensor, K: int) -> _Rules:
        """The rule at n prefixes with target / draft rows P_rows, Q_rows [n, V].

        On toy vocabularies each row's rule is memoised (n = 1), so the sampler and the exact law use the
        very same numbers and the many tiny calls of the Monte-Carlo tests stay cheap.
        """
        if P_rows.shape[-1] > _CACHE_MAX_VOCAB:
            return self._compute_rules(P_rows, Q_rows, K)
        parts = [self._rule_at(P, Q, K) for P, Q in zip(P_rows, Q_rows)]
        if len(parts) == 1:
            return parts[0][1]
        return self._memo("stacks", tuple(serial for serial, _ in parts),
                          lambda: _Rules.concat([rule for _, rule in parts]))

    def _rule_at(self, P: torch.Tensor, Q: torch.Tensor, K: int) -> tuple[int, _Rules]:
        """(serial, the rule at one prefix), memoised by (P, Q, K) on toy vocabularies."""
        compute = lambda: (next(self._serials), self._compute_rules(P[None], Q[None], K))  # noqa: E731
        if P.shape[-1] > _CACHE_MAX_VOCAB:
            return compute()
        return self._memo("rules", (*tensor_key(P, Q), K), compute)

    def _scratch(self, shape, dtype: torch.dtype, device: torch.device, name: str) -> torch.Tensor:
        """A buffer kept between calls for the [n, V] temporaries: on the CPU a fresh tensor of megabytes costs
        a page fault per 4 KiB on every call (more than the arithmetic on it)."""
        numel = math.prod(shape)
        buffer = self._buffers.get(name)
        if buffer is None or buffer.numel() < numel or buffer.dtype != dtype or buffer.device != device:
            buffer = self._buffers[name] = torch.empty(numel, dtype=dtype, device=device)
        return buffer[:numel].view(shape)

    def _compute_rules(self, P_rows: torch.Tensor, Q_rows: torch.Tensor, K: int) -> _Rules:
        ranked = _ranked_head(P_rows, Q_rows, self.rank_size, self.tail_threshold, scratch=self._scratch)
        if K == 1:
            return _single_draft_rules(ranked)
        if self.selection == "greedy":
            rho = torch.full((P_rows.shape[0], K - 1), math.inf, dtype=_F64, device=P_rows.device)
        else:  # choose_rho on the head_size ranked tokens of largest P + Q, as if they were the vocabulary
            head = ranked.top(self.head_size)
            grid = _log_grid(head.r, self.grid_size)
            laws = _grid_laws(head.p, head.q, grid, K, missing=1.0 - head.q.sum(-1))
            rho = grid.gather(1, _best_grid_points(laws, head.p))
        return _rules_at(ranked, rho, K)

    def _memo(self, table: str, key, compute):
        """Memoise ``compute()`` under ``key`` in one of the memo tables (toy vocabularies only)."""
        return self._memos.get(table, key, compute)

    def _weights(self, posterior: torch.Tensor | None, counts: torch.Tensor, K: int) -> torch.Tensor:
        """[L, K]: the law over counts 1..K that q_sel mixes at each depth (the posterior, or the observed count)."""
        if posterior is not None:
            return posterior
        return (counts[:, None] == torch.arange(1, K + 1, device=counts.device)).to(_F64)

    def _path_terms(self, rules, P_rows, Q_rows, path: list[int], counts: list[int], K: int) -> _PathTerms:
        """q_sel and BV's terms along the selected path (rules and rows [L], observed counts [L])."""
        device = Q_rows.device
        path_tensor, counts_tensor = torch.tensor(path, device=device), torch.tensor(counts, device=device)

        def weights_of(q_at: torch.Tensor) -> torch.Tensor:
            posterior = _count_posterior(rules, q_at, path_tensor) if self.count_posterior and K > 1 else None
            return self._weights(posterior, counts_tensor, K)

        return _path_terms(rules, P_rows, Q_rows, path_tensor, weights_of)

    def _toy_path_terms(self, target_probs, draft_probs, rows, path, counts, K) -> _PathTerms:
        """_path_terms on a toy vocabulary, memoised by (rules, path, counts): shared by sampler and exact law."""
        L = len(path)
        trail = [self._rule_at(target_probs[rows[i], i], draft_probs[rows[i], i], K) for i in range(L)]
        key = (tuple(serial for serial, _ in trail), tuple(path), tuple(counts))
        return self._memo("paths", key, lambda: self._path_terms(
            _Rules.concat([rule for _, rule in trail]), target_probs[rows[:L], list(range(L))],
            draft_probs[rows[:L], list(range(L))], path, counts, K))

    # ---------------------------------------------------------------- sampler
    def _sample(self, draft_tokens, draft_probs, target_probs, generator, state) -> VerifyResult:
        return self._finish(self._decide(draft_tokens, draft_probs, target_probs, generator), target_probs)

    def _decide(self, draft_tokens, draft_probs, target_probs, generator) -> Decision:
        """Stages 1 and 2 of the sampler: the selected path and BV's stop depth on it (not the emitted token)."""
        K, L = draft_tokens.shape
        device = draft_probs.device
        tokens = draft_tokens.tolist()  # host read: which drafts share which prefix
        leaders, sizes, groups = _shared_groups(tokens)
        n = len(groups)
        u = uniform(n * K + L + 1, generator, device=None if generator is not None else device).to(device)

        # Stage 1: the selection at every prefix shared by >= 2 drafts, in one batch.
        next_row: dict[tuple[int, int], int] = {}
        shared, accepted_draft = None, None
        if groups:
            depth = [i for i, _ in groups]
            rows = [row for _, row in groups]
            shared = self._rules(_rows(target_probs, rows, depth), _rows(draft_probs, rows, depth), K)
            levels = torch.tensor([leaders[i] for i in depth], device=device)  # [n, K]: each draft's leader
            member = levels == torch.tensor(rows, device=device)[:, None]
            count_index = torch.tensor([sizes[i][row] - 2 for i, row in groups], device=device)
            candidates = draft_tokens.T[depth].long()  # [n, K]
            chosen, accepted_draft = _select(shared, candidates, member, count_index, u[: n * K].view(n, K))
            next_row = dict(zip(groups, chosen.tolist()))  # host read: the selections
        rows = [0]
        for i in range(L):
            rows.append(next_row.get((i, rows[i]), rows[i]))  # a lone survivor keeps its own token
        path = [tokens[rows[i + 1]][i] for i in range(L)]
        counts = [sizes[i][rows[i]] for i in range(L)]

        # Stage 2: the rule at the path's depths that no other draft shares (counts only shrink along the
        # path: these are the depths from ``split`` on), then q_sel and BV's terms.
        if draft_probs.shape[-1] <= _CACHE_MAX_VOCAB:
            terms = self._toy_path_terms(target_probs, draft_probs, rows, path, counts, K)
        else:
            P_rows, Q_rows = _rows(target_probs, rows[:L], list(range(L))), _rows(draft_probs, rows[:L], list(range(L)))
            position = {group: index for index, group in enumerate(groups)}
            shared_depths = [position[(i, rows[i])] for i in range(L) if (i, rows[i]) in position]
            split = len(shared_depths)
            parts = []
            if split:
                parts.append(shared if shared_depths == list(range(n)) else
                             shared.take(torch.tensor(shared_depths, device=device)))
            if split < L:
                parts.append(self._rules(P_rows[split:], Q_rows[split:], K))
            rules = parts[0] if len(parts) == 1 else _Rules.concat(parts)
            terms = self._path_terms(rules, P_rows, Q_rows, path, counts, K)

        # tau = the largest i with eta_{i-1} <= h_i (h_0 = 1; h_L = w_L). h increases with Z: the bracket on
        # the tail's share decides most depths; the tail is summed exactly only where it does not.
        w, z_head, eta = terms.w, terms.z_head, u[n * K : n * K + L]
        h_low = _stops((z_head + terms.low)[1:], w)
        h_high = _stops((z_head + terms.high)[1:], w)
        sure, possible = torch.stack([eta <= h_low, eta <= h_high]).tolist()  # host read: the decisions
        tau = max([i + 1 for i in range(L) if sure[i]], default=0)
        open_depths = [i + 1 for i in range(tau, L) if possible[i] and not sure[i]]
        if open_depths:  # host read: the exact decisions where eta fell inside the bracket
            h = stop_probability(terms.exact_z(open_depths), w[open_depths])
            success = (eta[[i - 1 for i in open_depths]] <= h).tolist()
            tau = max([i for i, ok in zip(open_depths, success) if ok], default=tau)
        return Decision(tokens, leaders, rows, path, counts, terms, tau, u[-1:], groups, accepted_draft)

    def _finish(self, decision: Decision, target_probs) -> VerifyResult:
        """SBV's last step: the accepted prefix, then a bonus from p or a correction from the residual."""
        terms, tau, rows, L = decision.terms, decision.tau, decision.rows, len(decision.path)
        if tau == L:
            row = target_probs[rows[L], L]  # the bonus
        else:  # the correction; p itself if the residual has no mass
            row = terms.correction_row(tau)
        extra = _inverse_cdf(row, decision.last_uniform)
        out = torch.cat([torch.tensor(decision.path[:tau], dtype=torch.long, device=extra.device), extra])
        return VerifyResult(tokens=out, num_accepted=tau, draft_index=rows[L], state=None)

    # ---------------------------------------------------------------- exact law
    def _law(self, draft_tokens, draft_probs, target_probs, state) -> list[Outcome]:
        """Enumerate the selection's events depth by depth; at each selected path add BV's law on it.

        Every number comes from the functions the sampler calls (on a large vocabulary the rules in its
        batches, ``_prefix_rules``; on a toy one prefix at a time). A toy vocabulary revisits the same prefixes
        across draft tuples: the rule at each (P, Q), the events at each (rule, candidates) and BV's law at each
        (rules, path, counts) are memoised.
        """
        law: dict[tuple[int, ...], float] = {}

        def leaf(walk: LawWalk, prob: float) -> None:
            block = lambda: self._block_law(target_probs, draft_probs, walk)  # noqa: E731
            for outcome, p in (self._memo("blocks", walk.key(target_probs), block) if walk.toy else block()):
                law[outcome] = law.get(outcome, 0.0) + prob * p

        self._walk(draft_tokens, draft_probs, target_probs, leaf, by_draw=False)
        return [Outcome(probability=p, tokens=t) for t, p in law.items() if p > 0]

    def expected_emitted(self, draft_tokens, draft_probs, target_probs, state=None) -> torch.Tensor:
        """E[tau + 1 | drafts], exact: the law's walk over the selection's events, and at each selected path
        (probability pi) pi * E[tau + 1] of BV on it, from the same stop probabilities h_1..h_L as the law
        (``_PathTerms.exact_stops``: the exact Z wherever the tail has mass) and no correction law.

        Cost: the rules in the sampler's batches (every prefix shared by >= 2 drafts, then each draft's depths
        from where it is alone, if the walk reaches it: at most K L + 1 rows, L when the drafts agree to the end)
        and, per selected path (at most K), its terms and one [L - 1, V] pass for the tail. Host reads: the draft
        tokens and the scan's events at each shared prefix reached (one read each), plus, on the CPU, two per
        batch of rules (the ranked set read off the threshold); none per path (the sum stays on the device).
        """
        total = torch.zeros((), dtype=_F64, device=draft_probs.device)

        def leaf(walk: LawWalk, prob: float) -> None:
            nonlocal total
            h = self._leaf_terms(target_probs, draft_probs, walk).exact_stops()
            total = total + prob * expected_emitted_from_stops(h)

        self._walk(draft_tokens, draft_probs, target_probs, leaf, by_draw=False)
        return total

    def _walk(self, draft_tokens, draft_probs, target_probs, leaf, by_draw: bool) -> None:
        """Call ``leaf(walk, probability)`` for every selected path with positive probability.

        by_draw=False merges the scan's events by the selected token (all SBV needs); True keeps them apart
        by the draw the scan accepted (walk.accepted_draft[i], -1: none accepted, the token of top rank),
        which sbvf's fallback conditions on. The law, sbvf's law and ``expected_emitted`` all walk here.
        """
        K, L = draft_tokens.shape
        tokens = draft_tokens.tolist()
        columns = draft_tokens.T.long()  # [L, K]
        toy = draft_probs.shape[-1] <= _CACHE_MAX_VOCAB
        if toy:
            rule_at = lambda i, row: self._rule_at(target_probs[row, i], draft_probs[row, i], K)  # noqa: E731
        else:
            rule_at = self._prefix_rules(tokens, draft_probs, target_probs, K)

        def events_at(serial, rule, i, survivors) -> list[tuple[int, float, int]]:
            def compute():
                member = torch.zeros(1, K, dtype=torch.bool, device=columns.device)
                member[0, survivors] = True
                count_index = torch.full((1,), len(survivors) - 2, device=columns.device)
                probs, none, top = _scan_events(rule, columns[i][None], member, count_index)
                values = torch.cat([probs[0], none, top[0].to(probs.dtype)]).tolist()  # one host read
                probs, none, top = values[:K], values[K], int(values[K + 1])
                if by_draw:
                    return [(tokens[j][i], probs[j], j) for j in survivors] + [(tokens[top][i], none, -1)]
                probs[top] += none
                events: dict[int, float] = {}
                for j in survivors:
                    events[tokens[j][i]] = events.get(tokens[j][i], 0.0) + probs[j]
                return [(v, p_v, -1) for v, p_v in events.items()]

            if not toy:
                return compute()
            # by_draw events name the drafts (rows), merged ones only the tokens
            rows = tuple(survivors) if by_draw else None
            return self._memo("events", (serial, tuple(tokens[j][i] for j in survivors), rows), compute)

        def descend(i, survivors, prob, walk: LawWalk):
            if i == L:
                leaf(walk.done(survivors[0]), prob)
                return
            row = survivors[0]
            serial, rule = rule_at(i, row)
            events = [(tokens[row][i], 1.0, row)] if len(survivors) == 1 else events_at(serial, rule, i, survivors)
            for v, p_v, accepted_draft in events:
                if p_v > 0:
                    descend(i + 1, [j for j in survivors if tokens[j][i] == v], prob * p_v,
                            walk.step(v, serial, rule, row, survivors, accepted_draft))

        descend(0, list(range(K)), 1.0, LawWalk(tokens, K, toy))

    def _prefix_rules(self, tokens: list[list[int]], draft_probs, target_probs, K: int):
        """``rule_at(depth, leader) -> (serial, rule)`` for the walk on a large vocabulary, in the sampler's
        batches: every prefix shared by >= 2 drafts at once (its stage 1), and a draft's depths from the first
        where it is alone at once (its stage 2: the same rows, a view), when the walk first reaches them."""
        L = len(tokens[0])
        _, _, groups = _shared_groups(tokens)
        device = draft_probs.device
        where: dict[tuple[int, int], tuple[_Rules, int]] = {}
        if groups:
            depth, rows = [i for i, _ in groups], [row for _, row in groups]
            shared = self._rules(_rows(target_probs, rows, depth), _rows(draft_probs, rows, depth), K)
            where.update({group: (shared, j) for j, group in enumerate(groups)})

        def rule_at(i: int, row: int) -> tuple[int, _Rules]:
            if (i, row) not in where:  # draft ``row`` alone from depth i on
                alone = self._rules(target_probs[row, i:L], draft_probs[row, i:L], K)
                where.update({(i + m, row): (alone, m) for m in range(L - i)})
            rules, j = where[(i, row)]
            return next(self._serials), rules.take(torch.tensor([j], device=device))

        return rule_at

    def _leaf_terms(self, target_probs, draft_probs, walk: LawWalk) -> _PathTerms:
        """q_sel and BV's terms on ``walk``'s path, as the sampler computes them (memoised on toys)."""
        L, K, path, rows = len(walk.path), walk.K, list(walk.path), list(walk.rows)
        if walk.toy:
            return self._toy_path_terms(target_probs, draft_probs, rows, path, walk.counts, K)
        depths = list(range(L))
        return self._path_terms(_Rules.concat(list(walk.rules)), target_probs[rows[:L], depths],
                                draft_probs[rows[:L], depths], path, walk.counts, K)

    def _block_terms(self, target_probs, draft_probs, walk: LawWalk) -> tuple[list[float], torch.Tensor]:
        """(P(tau = i) for i = 0..L, the law of the emitted token after stopping at each i < L [L, V] float64)
        for BV on ``walk``'s path with the sampler's own q_sel, stop probabilities and outcome laws."""
        L = len(walk.path)
        terms = self._leaf_terms(target_probs, draft_probs, walk)
        return _stop_law(terms.exact_stops()), terms.correction_law(slice(0, L))

    def _block_law(self, target_probs, draft_probs, walk: LawWalk) -> list[tuple[tuple[int, ...], float]]:
        """The law of BV on ``walk``'s path: [(tokens, probability)]."""
        L, path = len(walk.path), walk.path
        stop_law, corrections = self._block_terms(target_probs, draft_probs, walk)
        bonus = target_probs[walk.rows[L], L].to(_F64)
        outcome_laws = torch.cat([corrections, (bonus / bonus.sum())[None]]).tolist()
        out = []
        for i in range(L, -1, -1):
            if stop_law[i] > 0:
                out += [(tuple(path[:i]) + (y,), stop_law[i] * p_y) for y, p_y in enumerate(outcome_laws[i]) if p_y > 0]
        return out


@dataclass(frozen=True)
class LawWalk:
    """A selected path as the exact law enumerates it: at each depth the rule, the draft whose rows it read,
    the survivors and the draw the scan accepted (-1: none, or events merged by token)."""

    tokens: list[list[int]]
    K: int
    toy: bool
    path: tuple[int, ...] = ()
    serials: tuple[int, ...] = ()
    rules: tuple[_Rules, ...] = ()
    rows: tuple[int, ...] = ()  # L + 1 once done
    survivors: tuple[tuple[int, ...], ...] = ()
    accepted_draft: tuple[int, ...] = ()

    def step(self, token, serial, rule, row, survivors, accepted_draft) -> LawWalk:
        return replace(self, path=self.path + (token,), serials=self.serials + (serial,), rules=self.rules + (rule,),
                       rows=self.rows + (row,), survivors=self.survivors + (tuple(survivors),),
                       accepted_draft=self.accepted_draft + (accepted_draft,))

    def done(self, row: int) -> LawWalk:
        return replace(self, rows=self.rows + (row,))

    @property
    def counts(self) -> list[int]:
        return [len(survivors) for survivors in self.survivors]

    def key(self, target_probs) -> tuple:
        """What BV's law on this path depends on (the memo key on toy vocabularies)."""
        L = len(self.path)
        return (self.serials, self.path, tuple(self.counts), *tensor_key(target_probs[self.rows[L], L]))
