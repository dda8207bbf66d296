"""SBV-F — selection block verification with fallback (ours; lossless for any K). Derivation: docs/sbvf.md.

Shapes: draft_tokens [K, L], draft_probs [K, L, V] (q), target_probs [K, L+1, V] (p); see verify.base.

Three stages per iteration:

1. *Select* one path x through the K drafts, top-down, exactly as SBV does (docs/sbv.md). At depth i, with
   P = p(.|x^i), Q = q(.|x^i), c survivors and tokens ranked by r = P/Q ascending (ties: lower id first),
   scan the survivors in draft order accepting survivor j's token with probability a_c = min(1, P/(rho_c Q));
   if none is accepted take the survivor token of highest rank. Given c survivors the selected token has law

       f_c = Q a_c (1 - (1 - alpha_c)^c) / alpha_c + G_c^c - (G_c^-)^c,   alpha_c = sum Q a_c,
       G_c = cumulative sum of Q (1 - a_c) in rank order,   G_c^- = G_c - Q (1 - a_c),

   rho_c is the log-grid point maximising sum min(f_c, P) (sbv.choose_rho), and the draft law handed to BV
   is q_sel[i] = sum_c pi_i(c) f_c with pi_i the exact posterior of the survivor count (sbv.count_likelihood_host).
2. *Block verification* (BV) on x with q_sel: w_0 = 1, w_i = min(1, w_{i-1} P(x_i)/q_sel[i-1](x_i)),
   h_i = Z_i/(Z_i + 1 - w_i) with Z_i = sum (w_i P_i - q_sel[i])+, h_L = w_L; tau = the largest i with
   eta_i <= h_i. Up to here this is SBV; SBV would now emit x^tau and one token from
   r = norm((w_tau P_tau - q_sel[tau])+).
3. *Fallback* (new). If tau < L, the drafts that pass through x^tau but carry another token than x_{tau+1} at
   depth tau+1 (the *candidates*) were seen by stages 1-2 only through the scan at depth tau+1. Given
   everything stages 1-2 depend on, candidate j's token at depth tau+1 has a known law g_j and its later
   tokens are fresh draws from q:
       - drawn after the accepted draw in the scan ("free"):   g ~ Q,            restricted to tokens != v;
       - drawn before it ("rejected"):                          g ~ Q (1 - a_k),  restricted to tokens != v;
       - no draw accepted, v of top rank ("below"):             g ~ Q (1 - a_k),  restricted to rank < rank(v);
   (v = x_{tau+1}, k = the survivor count at depth tau). Instead of one token from r, run recursive block
   verification (rbv.py) over the candidates in draft order, with r as the target at depth tau+1 and g_j as
   candidate j's draft law there (q deeper), and emit what it emits.

Why it is valid (docs/sbvf.md): stages 1-2 are SBV, valid as is. Stage 3 replaces "one token from r" by a rule
that is valid for the target (r at depth tau+1, then p) conditionally on the whole history, because every
candidate step is BV against a valid target with the candidate's exact conditional law. The replacement keeps
every accepted token of SBV and can only add more, so E[accepted] of SBV-F >= SBV's on every input. K = 1 has
no candidates: the rule is BV.

Cost per call: one sort of the vocabulary per depth on the selected path (rank order), a [counts x grid x 256]
evaluation for rho and [counts x V] vector operations for f, all in float64; BV's stop probabilities for all
depths in one [L, V] pass; the fallback runs BV on at most K - 1 candidate paths. The selection is
vectorised over survivors and counts; the host reads one small vector per depth (the selected token and the
scalars of the count posterior), which keeps the exact posterior in Python floats (sbv.count_likelihood_host).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from spectr_repro.sampling import sample, uniform
from spectr_repro.verify.base import Outcome, Verifier, VerifyResult
from spectr_repro.verify.bv import BlockSegment
from spectr_repro.verify.common import LawBuilder
from spectr_repro.verify.sbv import count_likelihood_host

__all__ = [
    "SelectionBlockVerificationFallback", "SelectionLaws", "candidate_law", "candidate_laws", "choose_rhos",
    "choose_rhos_batch", "selection_laws", "selection_tables",
]

FREE, REJECTED, BELOW = "free", "rejected", "below"  # what the scan at depth tau+1 revealed about a candidate


def _normalised(row: torch.Tensor) -> torch.Tensor:
    """float64 copy of a probability row, renormalised (float32 rows over 150k tokens sum to 1 only to ~1e-5)."""
    row = row.double()
    return row / row.sum()


def _rank_key(P: torch.Tensor, Q: torch.Tensor) -> torch.Tensor:
    """r = P/Q, +inf where Q = 0 (never drafted: f = 0 wherever it is ranked); 0/0 -> +inf as well."""
    return torch.nan_to_num(P / Q, nan=math.inf, posinf=math.inf)


def _accept_scale(alpha: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """A_c = (1 - (1 - alpha)^c)/alpha, with its limit c at alpha = 0 (then Q a = 0 everywhere anyway)."""
    safe = torch.where(alpha > 0, alpha, torch.ones_like(alpha))
    return torch.where(alpha > 0, (1 - (1 - alpha).pow(counts)) / safe, counts.to(alpha.dtype))


def _power_difference(g: torch.Tensor, g_minus: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """g^c - g_minus^c without cancellation, (g - g_minus) * sum_{j<c} g^(c-1-j) g_minus^j, summed term by
    term as sbv does. Leading row n of g, g_minus ([len(counts), ...]) gets the exponent c = counts[n]."""
    shape = (-1, *([1] * (g.dim() - 1)))
    exponents = torch.tensor([[max(c - 1 - j, 0) for c in counts] for j in range(max(counts))], dtype=g.dtype,
                             device=g.device)
    active = torch.tensor([[float(c - 1 - j >= 0) for c in counts] for j in range(max(counts))], dtype=g.dtype,
                          device=g.device)
    total = g.pow(exponents[0].view(shape))  # j = 0 is active for every c >= 1
    for j in range(1, max(counts)):
        total = total + (g.pow(exponents[j].view(shape)) * active[j].view(shape)) * g_minus.pow(j)
    return (g - g_minus) * total


def _rank_order(P: torch.Tensor, Q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(order, rank) per row of [N, V]: tokens by r = P/Q ascending, ties lower id first (a stable sort), so the
    larger id ranks higher; rank[n, x] = the position of token x in row n's order (0 = lowest)."""
    order = torch.sort(_rank_key(P, Q), dim=-1, stable=True).indices
    positions = torch.arange(P.shape[-1], device=P.device).expand_as(order)
    return order, torch.empty_like(order).scatter_(-1, order, positions)


def choose_rhos_batch(P: torch.Tensor, Q: torch.Tensor, counts: list[int], grid_size: int = 64,
                      head_size: int = 256) -> torch.Tensor:
    """rho for each row b of P, Q ([B, V], normalised float64) at the count counts[b] >= 2: sbv.choose_rho's
    rule (the log-grid point over [1, 50 max r] maximising sum min(f, P) on the head = the ``head_size`` tokens
    of largest P + Q; first maximum wins), batched over rows and kept on the device. Returns float64 [B]."""
    if P.shape[-1] > head_size:
        ids = torch.topk(P + Q, head_size, dim=-1).indices.sort(dim=-1).values
        P, Q = P.gather(-1, ids), Q.gather(-1, ids)
    r = _rank_key(P, Q)
    order = torch.sort(r, dim=-1, stable=True).indices
    Ps, Qs, rs = P.gather(-1, order), Q.gather(-1, order), r.gather(-1, order)
    finite_max = torch.where(torch.isfinite(rs), rs, 0.0).amax(-1).clamp_min(1.0)  # [B]
    steps = torch.linspace(0.0, 1.0, grid_size, dtype=torch.float64, device=P.device)
    grid = torch.exp(steps * torch.log(50.0 * finite_max).unsqueeze(-1))  # [B, grid]
    m = torch.minimum(Qs.unsqueeze(1), Ps.unsqueeze(1) / grid.unsqueeze(-1))  # [B, grid, head]
    d = Qs.unsqueeze(1) - m
    alpha = m.sum(-1, keepdim=True)
    g = torch.cumsum(d, -1)
    c = torch.tensor(counts, dtype=torch.float64, device=P.device).view(-1, 1, 1)
    # G^c - (G^-)^c directly (the cancellation-free sum of selection_tables costs ~5 kernels per count here,
    # and rho only has to be a deterministic function of P and Q: the law is always evaluated for the rho chosen).
    f = m * _accept_scale(alpha, c) + (g.pow(c) - (g - d).pow(c)).clamp_min(0)
    objective = torch.minimum(f, Ps.unsqueeze(1)).sum(-1)  # [B, grid]
    return grid.gather(-1, objective.argmax(-1, keepdim=True)).squeeze(-1)  # argmax returns the first maximum


def choose_rhos(P: torch.Tensor, Q: torch.Tensor, K: int, grid_size: int = 64, head_size: int = 256) -> torch.Tensor:
    """rho_c for c = 0..K at one node (P, Q: normalised float64 [V]); entries c < 2 are +inf and unused."""
    rhos = torch.full((K + 1,), math.inf, dtype=torch.float64, device=P.device)
    if K >= 2:
        counts = list(range(2, K + 1))
        rows = (len(counts), -1)
        rhos[2:] = choose_rhos_batch(P.expand(rows), Q.expand(rows), counts, grid_size, head_size)
    return rhos


def selection_tables(P: torch.Tensor, Q: torch.Tensor, order: torch.Tensor, counts: list[int],
                     rho: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The closed form of the selection among counts[b] survivors, for each row b of P, Q, order ([B, V]):
    (accepted = Q a [B, V], alpha [B], g_minus = G^- in token order [B, V], law = f [B, V]), with a = min(1,
    P/(rho Q)) and G = the cumulative sum of Q (1 - a) in rank order (``order`` from ``_rank_order``)."""
    accepted = torch.minimum(Q, P / rho.unsqueeze(-1))  # rho = inf -> 0
    rejected = Q - accepted
    alpha = accepted.sum(-1)
    rejected_sorted = rejected.gather(-1, order)
    g = torch.cumsum(rejected_sorted, -1)
    g_minus_sorted = g - rejected_sorted
    g_minus = torch.empty_like(g).scatter_(-1, order, g_minus_sorted)
    top = torch.empty_like(g).scatter_(-1, order, _power_difference(g, g_minus_sorted, counts))
    c = torch.tensor(counts, dtype=torch.float64, device=P.device)
    law = accepted * _accept_scale(alpha, c).unsqueeze(-1) + top
    return accepted, alpha, g_minus, law


@dataclass
class SelectionLaws:
    """The selection at one node for every survivor count c = 0..K (row c; rows 0-1 are a single survivor).

    accepted[c] = Q a_c (row 1: Q, a = 1), alpha[c] = sum Q a_c, g_minus[c] = G_c^- in token order,
    law[c] = f_c (row 1: Q), rank = each token's position in rank order (0 = lowest).
    """

    P: torch.Tensor  # [V] float64, normalised target row
    Q: torch.Tensor  # [V] float64, normalised draft row
    rho: torch.Tensor  # [K+1]
    accepted: torch.Tensor  # [K+1, V]
    alpha: torch.Tensor  # [K+1]
    g_minus: torch.Tensor  # [K+1, V]
    law: torch.Tensor  # [K+1, V]
    rank: torch.Tensor  # [V] long

    def accept_probability(self, c: int) -> torch.Tensor:
        """a_c as a [V] row (0 where Q = 0: such tokens are never drafted)."""
        Q = self.Q
        return torch.where(Q > 0, self.accepted[c] / torch.where(Q > 0, Q, torch.ones_like(Q)), torch.zeros_like(Q))

    def mixture(self, posterior: torch.Tensor) -> torch.Tensor:
        """q_sel = sum_c posterior[c] f_c, float64 [V] (posterior: [K+1])."""
        return posterior @ self.law


def selection_laws(P: torch.Tensor, Q: torch.Tensor, K: int, grid_size: int = 64, head_size: int = 256,
                   rho: torch.Tensor | None = None) -> SelectionLaws:
    """The closed-form selection laws f_c at one node for c = 0..K (P, Q: normalised float64 [V]).

    ``rho`` ([K+1]) overrides the grid choice (tests, ablations); any rho keeps the rule valid.
    """
    rho = choose_rhos(P, Q, K, grid_size, head_size) if rho is None else rho.to(P)
    order, rank = _rank_order(P.unsqueeze(0), Q.unsqueeze(0))
    V = P.shape[-1]
    accepted = Q.expand(K + 1, V).clone()  # rows 0-1: a single survivor always selects its own token
    alpha = torch.ones(K + 1, dtype=torch.float64, device=P.device)
    g_minus = torch.zeros_like(accepted)
    law = Q.expand(K + 1, V).clone()
    if K >= 2:
        counts = list(range(2, K + 1))
        rows = (K - 1, V)
        accepted[2:], alpha[2:], g_minus[2:], law[2:] = selection_tables(
            P.expand(rows), Q.expand(rows), order.expand(rows), counts, rho[2:])
    return SelectionLaws(P, Q, rho, accepted, alpha, g_minus, law, rank[0])


def candidate_laws(Q: torch.Tensor, accepted: torch.Tensor, rank: torch.Tensor | None, token: int,
                   statuses: list[str]) -> torch.Tensor:
    """``candidate_law`` for several candidates at once ([n, V]): Q, accepted = Q a_k and rank are the node's
    [V] rows for the survivor count k at which ``token`` was selected (``rank`` is only read for BELOW)."""
    device = Q.device
    free = torch.tensor([status == FREE for status in statuses], device=device).unsqueeze(1)
    weights = torch.where(free, Q, Q - accepted)  # [n, V]
    if BELOW in statuses:
        below = torch.tensor([status == BELOW for status in statuses], device=device).unsqueeze(1)
        keep = ~below | (rank < rank[token])
    else:
        keep = torch.ones_like(weights, dtype=torch.bool)
    keep[:, token] = False
    weights = torch.where(keep, weights, 0.0)
    return weights / weights.sum(-1, keepdim=True).clamp_min(1e-300)


def candidate_law(laws: SelectionLaws, k: int, token: int, status: str) -> torch.Tensor:
    """Law (normalised, float64 [V]) of a candidate's token at the depth where ``token`` was selected among
    ``k`` survivors, given what the scan revealed (``status``) and that the candidate does not carry ``token``."""
    if status == FREE:
        weights = laws.Q.clone()
    else:
        weights = laws.Q - laws.accepted[k]  # Q (1 - a_k)
        if status == BELOW:
            weights = torch.where(laws.rank < laws.rank[token], weights, torch.zeros_like(weights))
    weights[token] = 0.0
    return weights / weights.sum().clamp_min(1e-300)  # > 0 whenever the candidate can exist


def _posterior_update(posterior: list[float], q_v: float, scalars: list[list[float]]) -> list[float]:
    """Posterior of the number of survivors carrying the selected token v (sbv.count_likelihood_host).

    posterior[c] for c = 0..K; scalars[c] = (a_c(v), alpha_c, G_c^-(v)) read from the device.
    """
    new = [0.0] * len(posterior)
    for c, weight in enumerate(posterior):
        if weight <= 0 or c == 0:
            continue
        if c == 1:
            likelihood = [0.0, q_v]
        else:
            a_v, alpha, g_minus_v = scalars[c]
            likelihood = count_likelihood_host(q_v, a_v, alpha, g_minus_v, c)
        for m, value in enumerate(likelihood):
            if value > 0:
                new[m] += weight * value
    total = sum(new)
    if total <= 0:
        return [0.0, 1.0] + [0.0] * (len(posterior) - 2)
    return [value / total for value in new]


@dataclass
class _Depth:
    """What the selection did at one depth of the selected path (host-side record)."""

    survivors: list[int]  # draft rows whose first i tokens equal the selected prefix
    token: int  # the selected token x_{i+1}
    accepted_at: int  # position (in ``survivors``) of the accepted draw, -1 if none was accepted (top rank)


def _statuses(depth: _Depth, tokens: list[list[int]], i: int) -> list[tuple[int, str]]:
    """(row, status) of the candidates at depth i: survivors that do not carry the selected token."""
    out = []
    for position, row in enumerate(depth.survivors):
        if tokens[row][i] == depth.token:
            continue
        if depth.accepted_at < 0:
            status = BELOW
        else:
            status = REJECTED if position < depth.accepted_at else FREE
        out.append((row, status))
    return out


def _residual(target: torch.Tensor, draft: torch.Tensor, fallback: torch.Tensor | None = None) -> torch.Tensor:
    """norm((target - draft)+), or ``fallback`` (default ``target``) where that has no mass (BlockSegment's
    correction)."""
    excess = (target - draft).clamp_min(0)
    total = excess.sum(-1, keepdim=True)
    return torch.where(total > 0, excess / torch.where(total > 0, total, 1.0), target if fallback is None else fallback)


def _scalars(accepted_v: list[float], alpha: list[float], g_minus_v: list[float], q_v: float) -> list[list[float]]:
    """(a_c(v), alpha_c, G_c^-(v)) for c = 0..K from the values read at v (rows c < 2 are unused placeholders)."""
    table = [[0.0, 1.0, 0.0], [1.0, 1.0, 0.0]]
    for m, a_l, g in zip(accepted_v, alpha, g_minus_v):
        table.append([m / q_v if q_v > 0 else 0.0, a_l, g])
    return table


class _Nodes:
    """The distinct prefixes of the K drafts at depths 0..L-1 (host side): node_of[k][i] = the node of
    tokens[k][:i]; rows[n] = (a draft through node n, its depth); members[n] = the drafts through node n in draft
    order (the survivors whenever the selected prefix is node n)."""

    def __init__(self, tokens: list[list[int]], L: int) -> None:
        ids: dict[tuple[int, ...], int] = {}
        self.rows: list[tuple[int, int]] = []
        self.members: list[list[int]] = []
        self.node_of = [[0] * L for _ in tokens]
        for i in range(L):
            for k, row in enumerate(tokens):
                key = tuple(row[:i])
                if key not in ids:
                    ids[key] = len(self.rows)
                    self.rows.append((k, i))
                    self.members.append([])
                self.node_of[k][i] = ids[key]
                self.members[ids[key]].append(k)


_TABLE_ELEMENTS = 1 << 24  # rows x V per batched block of the selection tables (128 MB of float64)


@dataclass
class _NodeTables:
    """Every node's normalised rows and its selection laws f_c for c = 2..K, for all nodes at once (the count
    posterior can put mass on any c <= K at any node of the selected path, and one batched computation costs far
    fewer kernel launches than one per depth). Only f_c, P and Q are kept on the whole vocabulary; what the scan
    and the count posterior need is kept at the node's drafted tokens (``children``: the next token of each draft
    through the node, in draft order, padded to K)."""

    P: torch.Tensor  # [N, V] float64
    Q: torch.Tensor  # [N, V] float64
    rho: torch.Tensor  # [N, K-1]
    alpha: torch.Tensor  # [N, K-1]
    law: torch.Tensor  # [N, K-1, V]: row c-2 = f_c
    children: torch.Tensor  # [N, K] long
    accept: torch.Tensor  # [N, K-1, K]: a_c at the children
    rank_fraction: torch.Tensor  # [N, K]: the children's rank / V in [0, 1) (the scan's fallback key)
    at_children: torch.Tensor  # [N, 2 + 2(K-1), K]: P, Q, Q a_c, G_c^- at the children (what the host reads)

    @classmethod
    def build(cls, nodes: _Nodes, tokens: list[list[int]], draft_probs, target_probs, K: int, grid_size: int,
              head_size: int):
        device = draft_probs.device
        rows = torch.tensor([r for r, _ in nodes.rows], device=device)
        depth = torch.tensor([d for _, d in nodes.rows], device=device)
        P = target_probs[rows, depth].double()
        Q = draft_probs[rows, depth].double()
        P, Q = P / P.sum(-1, keepdim=True), Q / Q.sum(-1, keepdim=True)
        order, rank = _rank_order(P, Q)
        N, V = P.shape
        C = max(K - 1, 0)
        children = torch.tensor([[tokens[k][d] for k in members] + [tokens[members[0]][d]] * (K - len(members))
                                 for members, (_, d) in zip(nodes.members, nodes.rows)], device=device)  # [N, K]
        rank_fraction = rank.gather(1, children).double() / V
        P_children, Q_children = P.gather(1, children), Q.gather(1, children)
        if C == 0:
            return cls(P, Q, P.new_zeros(N, 0), P.new_zeros(N, 0), P.new_zeros(N, 0, V), children,
                       P.new_zeros(N, 0, K), rank_fraction, torch.stack([P_children, Q_children], dim=1))
        counts = list(range(2, K + 1)) * N  # row b = (node b // C, count 2 + b % C)
        node_of_row = torch.arange(N, device=device).repeat_interleave(C, output_size=N * C)
        step = max(1, _TABLE_ELEMENTS // max(V, grid_size * head_size))
        parts = []
        for lo in range(0, N * C, step):  # one block unless N (K-1) V is large
            index = node_of_row[lo:lo + step]
            Pb, Qb, Ob = P.index_select(0, index), Q.index_select(0, index), order.index_select(0, index)
            rho = choose_rhos_batch(Pb, Qb, counts[lo:lo + step], grid_size, head_size)
            accepted, alpha, g_minus, law = selection_tables(Pb, Qb, Ob, counts[lo:lo + step], rho)
            at = children.index_select(0, index)  # [b, K]
            parts.append((rho, alpha, law, accepted.gather(1, at), g_minus.gather(1, at)))
        rho, alpha, law, accepted_children, g_minus_children = (torch.cat(t) for t in zip(*parts))
        accepted_children = accepted_children.view(N, C, K)
        accept = torch.where(Q_children.unsqueeze(1) > 0, accepted_children / Q_children.unsqueeze(1), 0.0)
        at_children = torch.cat([P_children.unsqueeze(1), Q_children.unsqueeze(1), accepted_children,
                                 g_minus_children.view(N, C, K)], dim=1)
        return cls(P, Q, rho.view(N, C), alpha.view(N, C), law.view(N, C, V), children, accept, rank_fraction,
                   at_children)

    def mixture(self, node: int, posterior: list[float]) -> torch.Tensor:
        """q_sel = posterior[1] Q + sum_{c >= 2} posterior[c] f_c at ``node``, float64 [V]."""
        weights = torch.tensor(posterior[2:], dtype=torch.float64, device=self.P.device)
        return posterior[1] * self.Q[node] + weights @ self.law[node]

    def stop_node_rows(self, node: int, k: int, with_rank: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(Q a_k, rank if asked) on the whole vocabulary at ``node``, for the candidates' laws (recomputed: only
        the stop node ever needs them, and selection_tables computes Q a_k the same way)."""
        P, Q = self.P[node:node + 1], self.Q[node:node + 1]
        accepted = torch.minimum(Q, P / self.rho[node, k - 2])
        return accepted[0], _rank_order(P, Q)[1][0] if with_rank else None


class _CandidateScan:
    """Block verification of several candidates at once from depth tau (rbv.py's segment, batched): candidate j
    has targets[j] as its target at depth tau+1 and first_laws[j] as its draft law there, p and q deeper."""

    def __init__(self, token_tensor, draft_probs, target_probs, candidates: list[int], tau: int,
                 targets: torch.Tensor, first_laws: torch.Tensor) -> None:
        L = draft_probs.shape[1]
        device = draft_probs.device
        rows = torch.tensor(candidates, device=device)
        self.tokens = token_tensor.index_select(0, rows)[:, tau:]  # [n, L - tau]
        self.p = target_probs.index_select(0, rows)[:, tau:L].double()  # row m: the target of token tau+m+1
        self.q = draft_probs.index_select(0, rows)[:, tau:].double()
        self.targets, self.first_laws = targets, first_laws
        first = self.tokens[:, :1]
        ratio_first = targets.gather(1, first) / first_laws.gather(1, first)  # [n, 1]
        ratio_rest = (self.p[:, 1:].gather(2, self.tokens[:, 1:, None]) /
                      self.q[:, 1:].gather(2, self.tokens[:, 1:, None])).squeeze(2)
        ratios = torch.cat([ratio_first, ratio_rest], dim=1)
        # w_m = min(1, w_{m-1} ratio_m), w_0 = 1: in logs, S_m - max(0, S_1..S_m) with S the partial sums.
        logs = torch.cumsum(torch.log(ratios).clamp(-1e300, 700.0), dim=1)
        peak = torch.cummax(logs, dim=1).values.clamp_min(0.0)
        self.w = torch.cat([torch.ones_like(logs[:, :1]), torch.exp(logs - peak)], dim=1)  # [n, n_pos + 1]

    def scan(self, generator) -> list[int]:
        """Each candidate's stop step (the largest m with eta_m < h_m, 0 if none), from one read."""
        n, positions = self.tokens.shape
        w = self.w
        excess = (w[:, 1:positions, None] * self.p[:, 1:] - self.q[:, 1:]).clamp_min(0).sum(-1)  # Z_1..Z_{n-1}
        inner = w[:, 1:positions]
        h = torch.where(inner < 1.0, excess / (excess + 1.0 - inner).clamp_min(1e-300), 1.0)
        h = torch.cat([h, w[:, positions:]], dim=1)  # h_1..h_positions
        random_device = None if generator is not None else w.device
        eta = uniform(n * positions, generator, device=random_device).to(w.device).view(n, positions)
        steps = torch.arange(1, positions + 1, device=w.device)
        return torch.where(eta < h, steps, 0).amax(1).tolist()

    def correction(self, j: int, step: int) -> torch.Tensor:
        """Candidate j's correction after accepting ``step`` >= 1 tokens: norm((w p - q)+) at that depth."""
        return _residual(self.w[j, step] * self.p[j, step], self.q[j, step], fallback=self.p[j, step])



class SelectionBlockVerificationFallback(Verifier):
    """SBV-F: SBV's selection and block verification, then fallback on the drafts that left the selected path
    where it was rejected (lossless for any K; equal to BV at K = 1; never below SBV).

    Options: ``fallback`` (default True; False gives SBV's posterior variant exactly), ``grid_size`` and
    ``head_size`` (the rho grid, as in sbv).
    """

    name = "sbvf"
    lossless = True
    claimed_lossless = True
    single_draft = False

    def __init__(self, check_inputs: bool = True, fallback: bool = True, grid_size: int = 64, head_size: int = 256,
                 **options) -> None:
        super().__init__(check_inputs=check_inputs, **options)
        if grid_size < 2 or head_size < 1:
            raise ValueError(f"sbvf: need grid_size >= 2 and head_size >= 1, got {grid_size}, {head_size}")
        self.fallback = bool(fallback)
        self.grid_size = int(grid_size)
        self.head_size = int(head_size)
        self._memo: dict[tuple, SelectionLaws] = {}

    # ------------------------------------------------------------------------------------------- shared
    def _laws(self, P: torch.Tensor, Q: torch.Tensor, K: int) -> SelectionLaws:
        """Selection laws at a node (memoised by value on toy vocabularies, where exact laws revisit nodes)."""
        key = None
        if P.shape[-1] <= 64:
            key = (P.cpu().numpy().tobytes(), Q.cpu().numpy().tobytes(), K)
            if key in self._memo:
                return self._memo[key]
        laws = selection_laws(P, Q, K, self.grid_size, self.head_size)
        if key is not None:
            if len(self._memo) > 100_000:
                self._memo.clear()
            self._memo[key] = laws
        return laws

    @staticmethod
    def _candidate_laws(Q: torch.Tensor, accepted: torch.Tensor, rank: torch.Tensor | None, token: int,
                        statuses: list[str]) -> torch.Tensor:
        """The candidates' draft laws at depth tau+1, [n, V] (a hook for negative controls)."""
        return candidate_laws(Q, accepted, rank, token, statuses)

    @staticmethod
    def _fallback_target(residual: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
        """The target of the fallback at depth tau+1: SBV's residual r (a hook for negative controls)."""
        return residual

    @staticmethod
    def _stop_probabilities(P_rows: torch.Tensor, q_sel: torch.Tensor, w: list[float]) -> torch.Tensor:
        """BV's h_0..h_L on the selected path (h_0 = 1, h_L = w_L): one [L, V] pass, float64 [L+1]."""
        L = q_sel.shape[0]
        weights = torch.tensor(w, dtype=torch.float64, device=q_sel.device)
        excess = (weights[:L, None] * P_rows - q_sel).clamp_min(0).sum(-1)  # Z_0..Z_{L-1}
        denominator = excess + 1.0 - weights[:L]
        h = torch.where(denominator > 0, excess / torch.where(denominator > 0, denominator, 1.0), 1.0)
        h = torch.cat([h, weights[L:]])
        h[0] = 1.0
        return h

    @staticmethod
    def _correction(P: torch.Tensor, q_sel: torch.Tensor, w: float) -> torch.Tensor:
        """r = norm((w P - q_sel)+), or P where that has no mass."""
        excess = (w * P - q_sel).clamp_min(0)
        total = excess.sum()
        return torch.where(total > 0, excess / torch.where(total > 0, total, 1.0), P)

    @staticmethod
    def _segment(tokens: torch.Tensor, draft_probs, target_probs, row: int, start: int, first_target,
                 first_draft) -> BlockSegment:
        """Candidate ``row``'s positions start+1..L for BV, with ``first_target`` as the target of position
        start+1 (rbv's segment) and, if given, ``first_draft`` as its draft law there."""
        L = draft_probs.shape[1]
        drafts = draft_probs[row, start:].double()
        if first_draft is not None:
            drafts = torch.cat([first_draft.unsqueeze(0), drafts[1:]])
        return BlockSegment(target_probs[row, start:L].double(), drafts, tokens[row, start:], first_target=first_target)

    # ------------------------------------------------------------------------------------------- sampler
    def _sample(self, draft_tokens, draft_probs, target_probs, generator, state) -> VerifyResult:
        K, L = draft_tokens.shape
        device = draft_probs.device
        random_device = None if generator is not None else device
        scan_u = uniform(L * K, generator, device=random_device).to(device).view(L, K)
        eta = uniform(L, generator, device=random_device).to(device)
        # Read 1: the tokens (the selection branches on them) and BV's uniforms (tau is decided on the host).
        head = torch.cat([draft_tokens.reshape(-1).to(device=device, dtype=torch.float64), eta]).tolist()
        tokens = [[int(x) for x in head[k * L:(k + 1) * L]] for k in range(K)]
        eta_list = head[K * L:]
        token_tensor = draft_tokens.long().to(device)
        nodes = _Nodes(tokens, L)
        tables = _NodeTables.build(nodes, tokens, draft_probs, target_probs, K, self.grid_size, self.head_size)

        survivors = list(range(K))
        posterior = [0.0] * (K + 1)
        posterior[K] = 1.0
        path: list[int] = []
        w, h = [1.0], [1.0]  # BV's running weights w_0..w_L and stop probabilities h_0..h_L
        depths: list[_Depth] = []
        q_rows: list[torch.Tensor] = []
        C = K - 1
        first_keys = torch.arange(2 * K, K, -1, dtype=torch.float64, device=device)  # a hit at draw j: 2K - j
        for i in range(L):
            k, node = len(survivors), nodes.node_of[survivors[0]][i]
            q_sel = tables.mixture(node, posterior)
            q_rows.append(q_sel)
            if k > 1:
                # The scan in one argmax: a hit at draw j scores 2K - j (the first hit wins), a miss scores its
                # token's rank / V < 1 (with no hit, the survivor token of top rank wins).
                keys = torch.where(scan_u[i, :k] < tables.accept[node, k - 2, :k], first_keys[:k],
                                   tables.rank_fraction[node, :k])
                position = keys.argmax().view(1)
                picked = torch.cat([position.double(), keys.index_select(0, position)])
            else:
                position = torch.zeros(1, dtype=torch.long, device=device)
                picked = torch.zeros(2, dtype=torch.float64, device=device)
            v = tables.children[node].index_select(0, position)
            Z = (w[-1] * tables.P[node] - q_sel).clamp_min(0).sum()
            values = torch.cat([picked, Z.view(1), q_sel.index_select(0, v),
                                tables.at_children[node].index_select(1, position).view(-1),
                                tables.alpha[node]]).tolist()
            position_int, key, z, qsel_v = int(values[0]), values[1], values[2], values[3]
            p_v, q_v = values[4], values[5]
            accepted_v, g_minus_v, alpha = values[6:6 + C], values[6 + C:6 + 2 * C], values[6 + 2 * C:]
            v_int = tokens[survivors[position_int]][i]
            if i > 0:
                h.append(z / (z + 1.0 - w[-1]) if z + 1.0 - w[-1] > 0 else 1.0)
            depths.append(_Depth(survivors, v_int, position_int if key >= 1.0 else -1))
            w.append(min(1.0, w[-1] * p_v / qsel_v) if qsel_v > 0 else 0.0)
            posterior = _posterior_update(posterior, q_v, _scalars(accepted_v, alpha, g_minus_v, q_v))
            path.append(v_int)
            survivors = [j for j in survivors if tokens[j][i] == v_int]
        row = survivors[0]
        h.append(w[L])
        tau = max([i for i in range(1, L + 1) if eta_list[i - 1] <= h[i]], default=0)  # BV's backward scan
        if tau == L:
            return self._emit(path, target_probs[row, L], row, generator, draft_tokens.device)
        node = nodes.node_of[row][tau]
        residual = self._correction(tables.P[node], q_rows[tau], w[tau])
        candidates = _statuses(depths[tau], tokens, tau) if self.fallback else []
        if not candidates:
            return self._emit(path[:tau], residual, row, generator, draft_tokens.device)
        k = len(depths[tau].survivors)
        statuses = [status for _, status in candidates]
        accepted, rank = tables.stop_node_rows(node, k, with_rank=BELOW in statuses)
        first_laws = self._candidate_laws(tables.Q[node], accepted, rank, path[tau], statuses)
        return self._fallback(tokens, token_tensor, draft_probs, target_probs, [c for c, _ in candidates],
                              first_laws, tau, row, self._fallback_target(residual, tables.P[node]), generator,
                              draft_tokens.device)

    @staticmethod
    def _emit(prefix: list[int], law: torch.Tensor, row: int, generator, device) -> VerifyResult:
        """The accepted prefix and one token from ``law`` (built on the device: no read of the token)."""
        extra = sample(law, generator).view(1).to(device)
        out = torch.cat([torch.tensor(prefix, dtype=torch.long, device=device), extra])
        return VerifyResult(tokens=out, num_accepted=len(prefix), draft_index=row, state=None)

    def _fallback(self, tokens, token_tensor, draft_probs, target_probs, candidates: list[int],
                  first_laws: torch.Tensor, tau: int, row: int, target: torch.Tensor, generator, device):
        """Recursive BV over the candidates (rbv.py) from depth tau with ``target`` there and ``first_laws[j]``
        as candidate j's draft law at depth tau+1.

        All candidates are scanned in one batch as if every earlier one stopped at depth tau (their targets
        then follow r_{j+1} = norm((r_j - g_j)+)); the first that accepts a token decides, and the scans of the
        later ones, made against targets that no longer apply, are discarded (their draws are independent of
        everything used). If that candidate stopped short of L, the remaining candidates that share its
        accepted prefix continue one by one, as in rbv.py.
        """
        L = len(tokens[0])
        targets = [target]
        for j in range(len(candidates) - 1):
            targets.append(_residual(targets[-1], first_laws[j]))
        batch = _CandidateScan(token_tensor, draft_probs, target_probs, candidates, tau, torch.stack(targets),
                               first_laws)
        steps = batch.scan(generator)  # one read
        stopped = [j for j, step in enumerate(steps) if step > 0]
        if not stopped:
            return self._emit(tokens[row][:tau], _residual(targets[-1], first_laws[-1]), row, generator, device)
        j = stopped[0]
        owner, committed = candidates[j], tau + steps[j]
        if committed == L:
            return self._emit(tokens[owner], target_probs[owner, L].double(), owner, generator, device)
        current = batch.correction(j, steps[j])
        for candidate in candidates[j + 1:]:
            if tokens[candidate][:committed] != tokens[owner][:committed]:
                continue
            segment = self._segment(token_tensor, draft_probs, target_probs, candidate, committed, current, None)
            step = segment.scan(generator)
            committed, owner = committed + step, candidate
            if committed == L:
                return self._emit(tokens[owner], target_probs[owner, L].double(), owner, generator, device)
            current = segment.correction(step)
        return self._emit(tokens[owner][:committed], current, owner, generator, device)

    # ------------------------------------------------------------------------------------------- exact law
    def _law(self, draft_tokens, draft_probs, target_probs, state) -> list[Outcome]:
        K, L = draft_tokens.shape
        tokens = draft_tokens.tolist()
        q_all, p_all = draft_probs.double(), target_probs.double()
        builder = LawBuilder()

        def descend(i, survivors, posterior, path, prob, rows, depths, laws_list):
            if i == L:
                self._bv_law(tokens, q_all, p_all, path, survivors[0], rows, depths, laws_list, prob, builder)
                return
            k, row = len(survivors), survivors[0]
            laws = self._laws(_normalised(p_all[row, i]), _normalised(q_all[row, i]), K)
            q_sel = laws.mixture(torch.tensor(posterior, dtype=torch.float64))
            accept = laws.accept_probability(k).tolist()
            candidates = [tokens[j][i] for j in survivors]
            none = 1.0
            events: list[tuple[int, float, int]] = []  # (token, probability, accepted_at)
            for position, token in enumerate(candidates):
                events.append((token, none * accept[token], position))
                none *= 1.0 - accept[token]
            if none > 0:
                ranks = laws.rank.tolist()
                top = max(candidates, key=lambda t: ranks[t])
                events.append((top, none, -1))
            P, Q = laws.P.tolist(), laws.Q.tolist()
            q_sel_list = q_sel.tolist()
            w = rows[-1][2] if rows else 1.0
            for token, p_event, accepted_at in events:
                if p_event <= 0:
                    continue
                q_v = Q[token]
                table = [[float(laws.accepted[c, token]) / q_v if q_v > 0 else 0.0, float(laws.alpha[c]),
                          float(laws.g_minus[c, token])] for c in range(K + 1)]
                w_next = min(1.0, w * P[token] / q_sel_list[token]) if q_sel_list[token] > 0 else 0.0
                descend(i + 1, [j for j in survivors if tokens[j][i] == token],
                        _posterior_update(posterior, q_v, table), path + [token], prob * p_event,
                        rows + [(laws.P, q_sel, w_next)], depths + [_Depth(survivors, token, accepted_at)],
                        laws_list + [laws])

        posterior = [0.0] * (K + 1)
        posterior[K] = 1.0
        descend(0, list(range(K)), posterior, [], 1.0, [], [], [])
        return builder.outcomes()

    def _bv_law(self, tokens, q_all, p_all, path, row, rows, depths, laws_list, prob, builder) -> None:
        """prob x (BV's law on ``path`` with the fallback at its stop depth) into ``builder``."""
        L = len(path)
        w = [1.0] + [r[2] for r in rows]
        h = self._stop_probabilities(torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows]), w).tolist()
        survive = 1.0
        for tau in range(L, -1, -1):
            stop = survive * h[tau]
            survive *= 1.0 - h[tau]
            if stop <= 0:
                continue
            if tau == L:
                bonus = p_all[row, L]
                builder.add(tuple(path), prob * stop, bonus / bonus.sum())
                continue
            residual = self._correction(rows[tau][0], rows[tau][1], w[tau])
            candidates = _statuses(depths[tau], tokens, tau) if self.fallback else []
            if not candidates:
                builder.add(tuple(path[:tau]), prob * stop, residual)
                continue
            k = len(depths[tau].survivors)
            laws = laws_list[tau]
            stacked = self._candidate_laws(laws.Q, laws.accepted[k], laws.rank, path[tau],
                                           [status for _, status in candidates])
            first_laws = {candidate: stacked[j] for j, (candidate, _) in enumerate(candidates)}
            self._fallback_law(tokens, q_all, p_all, candidates, first_laws, tau, row,
                               self._fallback_target(residual, rows[tau][0]), prob * stop, builder)

    def _fallback_law(self, tokens, q_all, p_all, candidates, first_laws, tau, row, residual, mass, builder) -> None:
        """Recursive block verification over the candidates (rbv.py's law, first draft law g_j at depth tau+1)."""
        L = len(tokens[0])

        def visit(index, committed, owner, current, weight):
            prefix = tuple(tokens[owner][:committed])
            if index == len(candidates):
                builder.add(prefix, weight, current)
                return
            candidate = candidates[index][0]
            if committed > tau and tuple(tokens[candidate][:committed]) != prefix:
                visit(index + 1, committed, owner, current, weight)
                return
            first_draft = first_laws[candidate] if committed == tau else None
            segment = self._segment(torch.tensor(tokens), q_all, p_all, candidate, committed, current, first_draft)
            for step, p_step in enumerate(segment.stop_law()):
                if p_step <= 0:
                    continue
                if committed + step == L:
                    bonus = p_all[candidate, L]
                    builder.add(tuple(tokens[candidate]), weight * p_step, bonus / bonus.sum())
                else:
                    visit(index + 1, committed + step, candidate, segment.correction(step), weight * p_step)

        visit(0, tau, row, residual, mass)
