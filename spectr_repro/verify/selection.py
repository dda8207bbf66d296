"""The selection core of SBV and SBV-F: one path through K drafts, and the exact law of what it selects.

Stage 1 of SBV (``verify/sbv.py``; derivation: docs/sbv.md), shared by SBV-F (``verify/sbvf.py``), which
only adds its fallback on top of it: the ranked head with its tail, the rho grid, the closed-form law
f(.; rho, c) of the token selected among c survivors, the count likelihood and posterior, q_sel along the
path and BV's terms on it. Pure functions on probability tensors ([..., V]); the verifier owns the drafts'
bookkeeping and the randomness.

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
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass, fields, replace

import torch

from spectr_repro.verify.common import (
    running_ratio,
    stop_probability,
)

__all__ = [
    "DEFAULT_GRID_SIZE", "DEFAULT_HEAD_SIZE", "DEFAULT_RANK_SIZE", "DEFAULT_TAIL_THRESHOLD", "RHO_SPAN", "Head",
    "PathTerms", "Rules", "best_rho", "count_posterior", "inverse_cdf", "log_grid", "ranked_head", "rows_at",
    "rules_at", "scan_events", "select_tokens", "selected_path_terms", "selection_laws", "shared_groups",
    "single_draft_rules", "stop_probabilities",
]

DEFAULT_TAIL_THRESHOLD = 1e-6
DEFAULT_GRID_SIZE = 64
DEFAULT_HEAD_SIZE = 256  # the tokens rho is chosen on
DEFAULT_RANK_SIZE = 4096  # the most tokens ranked
RHO_SPAN = 50.0  # the rho grid covers [1, RHO_SPAN * max r]
_F64 = torch.float64


# ------------------------------------------------------------------------------------------------ ranked tokens
@dataclass
class Head:
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

    def top(self, size: int) -> Head:
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


def ranked_head(
    P_rows: torch.Tensor, Q_rows: torch.Tensor, size: int | None, tail_threshold: float, normalise: bool = True,
    scratch=_fresh, shrink: bool | None = None,
) -> Head:
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
    return Head(ids.gather(-1, order), ranked.gather(-1, order), p.gather(-1, order), q.gather(-1, order), r,
                 psum, qsum)


# ------------------------------------------------------------------------------------------------ choosing rho
@functools.cache
def _grid_steps(grid_size: int, device: torch.device) -> torch.Tensor:
    return torch.arange(grid_size, dtype=_F64, device=device) / (grid_size - 1)


def log_grid(r: torch.Tensor, grid_size: int) -> torch.Tensor:
    """[n, grid]: the log grid over [1, RHO_SPAN * max finite r] of each row (r: [n, N])."""
    r_max = torch.nan_to_num(r, posinf=0.0).amax(-1).clamp_min(1.0)  # r >= 0, never NaN
    return torch.exp(torch.log(RHO_SPAN * r_max)[:, None] * _grid_steps(grid_size, r.device))


def best_rho(head: Head, grid_size: int, K: int) -> torch.Tensor:
    """[n, K - 1]: rho_c for each count c = 2..K, the point of the log grid over [1, RHO_SPAN * max r] maximising
    sum_v min(f(v; rho, c), P(v)) on ``head`` taken as the whole vocabulary (its missing mass 1 - sum q is never
    accepted). f is ``selection_laws``, the closed form the rule then applies. Ties: the first maximum (smallest rho).
    """
    grid = log_grid(head.r, grid_size)
    law = selection_laws(head.p, head.q, grid[:, None, :], K, missing=1.0 - head.q.sum(-1))["law"]  # [n, C, G, N]
    best = torch.minimum(law, head.p[:, None, None, :]).sum(-1).argmax(-1)
    return grid.gather(1, best)


def selection_laws(p: torch.Tensor, q: torch.Tensor, rho: torch.Tensor, K: int,
                   missing: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The closed form f(.; rho, c) of the token the scan selects among c survivors, c = 2..K (C = K - 1 counts),
    and its terms: the one evaluation, for choosing rho (a grid of rho, the same at every count) and for the rule
    at the chosen rho (one rho per count).

    p, q [n, N] in rank order; rho [n, C or 1, G] (may be +inf: a = 0). ``missing`` [n]: mass outside p, q that is
    never accepted (None: none). Returns accepted = Q a [n, C|1, G, N], g_minus = G^- [n, C|1, G, N], reject
    = beta = 1 - alpha [n, C|1, G], excess = A_c - 1 [n, C, G] and law = f_c [n, C, G, N].

    G^c - G^-^c = -G^c expm1(c log1p(-d/G)) (d = Q (1 - a) = G - G^-): relative accuracy, no cancellation
    (0/0 where G = 0, where d = 0 too: 0). A_c - 1 = beta + ... + beta^(c-1).
    """
    counts, exponents, below = _count_powers(K, q.device)
    accepted = torch.minimum(q[:, None, None, :], p[:, None, None, :] / rho[..., None])  # P/inf = 0
    rejected = q[:, None, None, :] - accepted
    g = rejected.cumsum(-1)
    reject = g[..., -1] if missing is None else g[..., -1] + missing[:, None, None]
    excess = (reject[..., None].pow(exponents) * below).sum(-1)
    # G^-^c - G^c (<= 0), subtracted: one op fewer than negating it (the op budgets count launches)
    negative_gap = torch.nan_to_num(g.pow(counts) * torch.expm1(counts * torch.log1p(-rejected / g)), nan=0.0)
    return dict(accepted=accepted, g_minus=g - rejected, reject=reject, excess=excess,
                law=accepted * (1.0 + excess)[..., None] - negative_gap)


# ------------------------------------------------------------------------------------------------ the rule
@dataclass
class Rules:
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

    def take(self, index: torch.Tensor) -> Rules:
        return Rules(*(getattr(self, f.name).index_select(0, index) for f in fields(self)))

    @staticmethod
    def concat(parts: list[Rules]) -> Rules:
        """The rows of several rules; ranked sets of different sizes are padded with unranked slots."""
        size = max(part.ids.shape[-1] for part in parts)

        def padded(part: Rules, name: str) -> torch.Tensor:
            t = getattr(part, name)
            if name in _TOKEN_FIELDS and t.shape[-1] < size:
                t = torch.nn.functional.pad(t, (0, size - t.shape[-1]))  # id 0, unranked, no mass: no effect
            return t

        return Rules(*(torch.cat([padded(part, f.name) for part in parts]) for f in fields(Rules)))


_TOKEN_FIELDS = frozenset({"ids", "ranked", "p", "q", "accepted", "g_minus", "law"})  # [..., N]


def _head_fields(head: Head) -> dict:
    """The count-free fields of the rule: the ranked tokens and the row sums."""
    return dict(ids=head.ids, ranked=head.ranked, p=head.p, q=head.q, psum=head.psum, qsum=head.qsum)


@functools.cache
def _count_powers(K: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(counts c = 2..K [C, 1, 1], exponents j = 1..K-1 [K-1], the mask j < c [C, 1, K-1]), float64 constants."""
    counts = torch.arange(2, K + 1, dtype=_F64, device=device)[:, None, None]
    exponents = torch.arange(1, K, dtype=_F64, device=device)
    return counts, exponents, (exponents < counts).to(_F64)


def rules_at(head: Head, rho: torch.Tensor, K: int) -> Rules:
    """The rule on ``head`` with rho_c = rho[:, c - 2] ([n, C], may be +inf) at each count c = 2..K: the tail is
    never rejected (no missing mass)."""
    terms = selection_laws(head.p, head.q, rho[:, :, None], K)
    return Rules(**_head_fields(head), **{name: value.squeeze(2) for name, value in terms.items()})


def single_draft_rules(head: Head) -> Rules:
    """K = 1: no count >= 2, f = Q."""
    n, N = head.q.shape
    empty, empty_tokens = head.q.new_zeros((n, 0)), head.q.new_zeros((n, 0, N))
    return Rules(**_head_fields(head), reject=empty, excess=empty, accepted=empty_tokens,
                  g_minus=empty_tokens, law=empty_tokens)


# ------------------------------------------------------------------------------------------------ the scan
def _first_true(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(any, index of the first True) along the last dim (argmax returns the first maximum; torch.max(dim)
    has slow CPU paths on some small shapes, ~30 ms)."""
    return mask.any(-1), mask.to(torch.uint8).argmax(-1)


def _locate(rules: Rules, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(position in rank order [n, T], ranked [n, T]) of tokens [n, T] among each row's ranked tokens."""
    hit = (rules.ids[:, None, :] == tokens[:, :, None]) & rules.ranked[:, None, :]
    ranked, position = _first_true(hit)
    return position, ranked


def _acceptance(rules: Rules, tokens: torch.Tensor, count_index: torch.Tensor):
    """(a [n, T], rank position [n, T]) of candidate tokens [n, T] at count count_index + 2 ([n]).

    a = min(1, P/(rho Q)) = (Q a)/Q on ranked tokens, 1 on the tail.
    """
    position, ranked = _locate(rules, tokens)
    n, _, N = rules.accepted.shape
    accepted = rules.accepted.gather(1, count_index[:, None, None].expand(n, 1, N)).squeeze(1)  # [n, N]
    m, q = accepted.gather(1, position), rules.q.gather(1, position)
    return torch.where(ranked & (q > 0), m / q, 1.0), position


def select_tokens(rules: Rules, tokens, member, count_index, u) -> tuple[torch.Tensor, torch.Tensor]:
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


def scan_events(rules: Rules, tokens, member, count_index) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The law of ``select_tokens``'s scan: ([n, K] P(draft j's draw is the first accepted), [n] P(none is accepted),
    [n, 1] the draft carrying the token of top rank, taken then)."""
    a, position = _acceptance(rules, tokens, count_index)
    a = torch.where(member, a, 0.0)
    survive = torch.cumprod(1.0 - a, -1)  # no acceptance among drafts 0..j
    probs = a * torch.cat([torch.ones_like(a[:, :1]), survive[:, :-1]], -1)
    return probs, survive[:, -1], torch.where(member, position, -1).argmax(-1, keepdim=True)


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


def count_likelihoods_at(rules: Rules, q_at: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """[n, K, K] P(x, m' survivors | c survivors) at each depth's token ``tokens`` [n, 1] (rules [n],
    q_at = Q(x) [n])."""
    n, C, _ = rules.accepted.shape
    position, ranked = _locate(rules, tokens)
    at = position[:, None, :].expand(n, C, 1)
    m = rules.accepted.gather(2, at).squeeze(2)
    g_minus = rules.g_minus.gather(2, at).squeeze(2) * ranked
    a = torch.where(ranked, m / q_at[:, None], 1.0)
    one, zero = torch.ones_like(q_at[:, None]), torch.zeros_like(q_at[:, None])  # count 1: a = 1, nothing rejected
    return _count_likelihoods(q_at, torch.cat([one, a], 1), torch.cat([zero, rules.reject], 1),
                              torch.cat([zero, g_minus], 1))


def count_posterior(rules: Rules, q_at: torch.Tensor, path: torch.Tensor) -> torch.Tensor:
    """[L, K] posterior of the survivor count along the selected path (rules [L], q_at = Q(x_{i+1}) [L])."""
    return _posterior_chain(count_likelihoods_at(rules, q_at, path[:, None]))


# ------------------------------------------------------------------------------------------------ q_sel and BV
def _mixture(rules: Rules, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
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
class PathTerms:
    """q_sel and BV's terms along a selected path of L depths."""

    rules: Rules  # [L]
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
        return stop_probabilities(z, self.w)

    def exact_stops_by_length(self, lengths) -> dict[int, torch.Tensor]:
        """``exact_stops`` of the path's first L depths for every L in ``lengths`` (each <= the path's length): q_sel,
        w and Z at depth i read depths <= i only, so the shorter paths' stops are the first L - 1 Z_i of this one
        and h_L = w_L. One pass over the tail for the longest, as ``exact_stops``."""
        longest = max(lengths)
        z = self.z_head[1:longest]
        if longest > 1:
            z = torch.where(self.tail_p[1:longest] > 0, self.exact_z(slice(1, longest)), z)
        return {L: stop_probabilities(z[:L - 1], self.w[:L + 1]) for L in lengths}

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


def stop_probabilities(z: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """BV's stop probabilities h_1..h_L [L] on the path from Z_1..Z_{L-1} [L - 1] and w_0..w_L [L + 1]:
    h_i = Z_i / (Z_i + 1 - w_i), h_L = w_L (h_0 = 1 is implicit: depth 0 is the floor). The sampler's bracket,
    the exact law and the expectation all take h from here (the sampler's exact decisions at single depths
    apply the same stop_probability)."""
    L = w.shape[0] - 1
    return torch.cat([stop_probability(z, w[1:L]), w[L:]])


def selected_path_terms(rules: Rules, P_rows, Q_rows, path: torch.Tensor, weights_of) -> PathTerms:
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
    return PathTerms(rules, P_rows, Q_rows, head, q_scale, w, w[:L] / rules.psum, z_head,
                      (high - tail_scale * tail_q).clamp_min(0.0), high, tail_p)


def inverse_cdf(row: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token [1] from ``row`` ([V], unnormalised) with the uniform u [1], no host read.

    u * total can round up onto the total: the second search returns the last token with mass then.
    """
    cumulative = row.cumsum(0, dtype=_F64)
    total = cumulative[-1:]
    token = torch.searchsorted(cumulative, u * total, right=True)
    return torch.minimum(token, torch.searchsorted(cumulative, total))


# ------------------------------------------------------------------------------------------------ bookkeeping
def rows_at(probs: torch.Tensor, rows: list[int], depths: list[int]) -> torch.Tensor:
    """probs[rows[j], depths[j]], [n, V]: a view (no copy of n x V) when one draft covers consecutive depths,
    the usual case (drafts that agree all read row 0's rows; a lone survivor reads its own)."""
    if len(set(rows)) == 1 and depths == list(range(depths[0], depths[0] + len(depths))):
        return probs[rows[0], depths[0] : depths[0] + len(depths)]
    return probs[rows, depths]


def shared_groups(tokens: list[list[int]]):
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
