"""MP-BV: greedy multi-path block verification (Thomas & Pal, arXiv 2602.16961, 2026), K drafts.

The paper calls this rule "GBV"; it is not the harness's ``gbv`` (SpecTr-GBV's single-draft greedy block
verification): here it is ``mpbv``, label "MP-BV".

Two stages per iteration (K i.i.d. drafts of L tokens, p = target, q = draft):

1. *Greedy path.* Top-down over depths i = 0..L-1, with z = the selected prefix x^i, S = the survivors (the
   drafts whose first i tokens equal z, c_i = |S|, c_0 = K), P = p(.|z), Q = q(.|z): the next selected token
   is the survivors' token of highest ratio r = P/Q (ties between tokens of equal r: the first survivor in
   draft order). Survivors' next tokens are i.i.d. Q given z, so given c survivors the selected token has
   the law of the maximum of c draws, the class of v (tokens with v's ratio) drawn in proportion to Q:

       f(v | c) = (G(v)^c - G^-(v)^c) Q(v) / Q(class of v),
       G = Q-mass of the classes up to v's (in r order),  G^- = G - Q(class of v)

   (without ties: G^c - (G - Q)^c, the maximum of c draws). With m = the number of survivors carrying v,
   P(v, m | c) = sum_j C(c, m+j) C(m+j-1, m-1) Q(v)^m T^j G^-^(c-m-j), T = Q(class of v) - Q(v). The count
   is not a function of the path, so the law of x_{i+1} given the selected prefix alone is
   q_sel[i] = sum_c pi_i(c) f(.|c), with pi_0 = delta_K and pi_{i+1}(m) proportional to
   sum_c pi_i(c) P(x_{i+1}, m | c) (the exact posterior of the count).
2. *Block verification* (Sun et al., ICLR 2025; ``verify.bv``) on the selected path with q_sel as its draft
   law: w_0 = 1, w_i = min(1, w_{i-1} p(x_i)/q_sel[i-1](x_i)), Z_i = sum_v (w_i p(v|x^i) - q_sel[i](v))+,
   h_i = Z_i / (Z_i + 1 - w_i) (1 where w_i = 1) for i < L, h_L = w_L, tau = the largest i with eta_i < h_i
   (0 if none); emit x^tau and a correction from norm((w_tau p(.|x^tau) - q_sel[tau])+) (p where that has
   no mass) if tau < L, else a bonus from p(.|x^L).

Lossless: BV is lossless for any path whose law it is given exactly, and q_sel is the selected path's
exact law (the tests check it against brute force). At K = 1 the path is the draft and q_sel = q: plain BV.

Choices where the published description is not specific enough for an implementation (docs/methods.md):
  * "greedy" = the highest-ratio survivor token at each depth (the reading of docs/sbv.md: SBV's selection with
    rho = inf, kept as the test oracle ``tests/verify/selection_oracle.py`` that the tests check this rule
    against; this module is the production rule because it ranks every token exactly (one sort of the L path rows,
    no tail accepted whenever drafted) and breaks ties as below); ties (equal r) go to the first survivor in
    draft order, not to a token order: with q = p every ratio is 1, and this tie rule keeps q_sel = q = p, so
    every block is accepted (a token-order tie rule would select the largest id and make BV reject p = q blocks);
  * the draft law BV is given is the exact law of the selected path given the selected prefix (count
    posterior), not q: BV run with q on a greedily selected path is NOT lossless (measured in
    tests/verify/test_mpbv.py, the negative control);
  * no carry-over state: each iteration restarts from the plain target.

Cost (docs/methods.md): the path is chosen on the host from one read of the draft tokens, their ratios and
the uniforms; then one sort of the L path rows ([L, V]), the order statistics f(.|c) mixed over the counts
by Horner's rule (2K in-place steps on [L, V] float64), one read of 2L scalars for the count posterior (a
[K, K] recursion per depth, on the host), and BV's stop probabilities and every correction law in one batch;
one last read for (tau, token). Three host reads and O(K) ops whatever L.

Shapes: draft_tokens [K, L], draft_probs [K, L, V], target_probs [K, L+1, V] (see verify.base).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from spectr_repro.sampling import sample, uniform
from spectr_repro.verify.base import Outcome, Verifier, VerifyResult
from spectr_repro.verify.common import (
    LawBuilder,
    block_cache,
    clipped_stop_probability,
    expected_emitted_from_stops,
    running_ratio,
    stop_law,
)

__all__ = ["GreedyMultiPathBlockVerification", "GreedyPath", "greedy_path", "path_block_test"]

_F64 = torch.float64


@dataclass(frozen=True)
class GreedyPath:
    """The greedily selected path of one block and what BV needs of it (float64, on the rows' device).

    tokens [L] (x_1..x_L), draft_index[i] = a draft carrying x^i (i = 0..L; survivors share rows i),
    counts[i] = c_i the survivors of x^i, targets [L+1, V] = p(.|x^i), draft_law [L, V] = q_sel[i]
    (the exact law of x_{i+1} given x^i), posteriors [L, K+1] = pi_i(c).
    """

    tokens: torch.Tensor
    draft_index: tuple[int, ...]
    counts: tuple[int, ...]
    targets: torch.Tensor
    draft_law: torch.Tensor
    posteriors: np.ndarray


def _rank_keys(target_rows: torch.Tensor, draft_rows: torch.Tensor) -> torch.Tensor:
    """r = P/Q in the rows' dtype, +inf where Q = 0 (never drafted; f = 0 there whatever its rank).

    The same elementwise division is used for the selection (gathered at the draft tokens) and for the sort
    of the path rows, so both see bit-identical keys and the selection is the maximum of the sorted order."""
    return (target_rows / draft_rows).nan_to_num(nan=math.inf, posinf=math.inf)


def _select(tokens: list[list[int]], keys: list[list[float]]) -> tuple[list[int], list[int], list[int]]:
    """Greedy selection on the host (bookkeeping on K x L integers): (path tokens, a draft carrying each prefix
    x^0..x^L, survivor counts c_0..c_L)."""
    K, L = len(tokens), len(tokens[0])
    survivors = list(range(K))
    path, carrier, counts = [], [0], [K]
    for i in range(L):
        best = max(survivors, key=lambda k: keys[k][i])  # the first survivor (draft order) among tied maxima
        token = tokens[best][i]
        survivors = [k for k in survivors if tokens[k][i] == token]
        path.append(token)
        carrier.append(survivors[0])
        counts.append(len(survivors))
    return path, carrier, counts


def _binomials(K: int) -> np.ndarray:
    """binom(n, k) for n, k = 0..K (0 where k > n)."""
    return np.array([[math.comb(n, k) for k in range(K + 1)] for n in range(K + 1)], dtype=np.float64)


def _selection_joint(selected: float, tied: float, below: float, K: int) -> np.ndarray:
    """[c, m] = P(the selected token is v and m survivors carry it | c survivors), c, m = 0..K.

    selected = Q(v), tied = Q of the other tokens of v's key class, below = Q ranked strictly below the class.
    v is selected when no survivor ranks above its class and the first survivor in the class carries v: with j
    survivors on the class's other tokens, C(c, m + j) places for the class and C(m + j - 1, m - 1) orders whose
    first is v, so P = sum_j C(c, m + j) C(m + j - 1, m - 1) Q(v)^m tied^j below^(c - m - j)."""
    binom = _binomials(K)
    c, m, j = np.ogrid[0:K + 1, 0:K + 1, 0:K + 1]
    rest = c - m - j
    valid = (m >= 1) & (rest >= 0)
    in_class = np.clip(m + j, 0, K)
    terms = (binom[c, in_class] * binom[np.clip(m + j - 1, 0, K), np.clip(m - 1, 0, K)]
             * selected ** m * tied ** j * below ** np.clip(rest, 0, None))  # numpy's 0.0 ** 0 is 1
    return np.where(valid, terms, 0.0).sum(-1)


def _count_posteriors(masses: list[list[float]], K: int) -> np.ndarray:
    """pi_i(c), i = 0..L-1, c = 0..K: the law of the survivor count at depth i given the selected prefix x^i.

    masses[i] = (Q_i(x_{i+1}), Q_i of the rest of its key class, Q_i ranked strictly below the class)."""
    L = len(masses)
    posteriors = np.zeros((L, K + 1))
    current = np.zeros(K + 1)
    current[K] = 1.0
    for i in range(L):
        posteriors[i] = current
        if i < L - 1:
            weights = current @ _selection_joint(*masses[i], K)
            current = weights / weights.sum()
    return posteriors


def _row_place(probs: torch.Tensor, row: int, depth: int) -> tuple[int, int, torch.dtype]:
    """Where row ``probs[row, depth]`` lies in memory: the same for every view of a block that reads it."""
    return (probs.untyped_storage().data_ptr(), probs.storage_offset() + row * probs.stride(0)
            + depth * probs.stride(1), probs.dtype)


def _sorted_keys(keys: torch.Tensor, places: list[tuple] | None, cache: dict | None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.sort(keys, stable=True) of the path rows [L, V]; with ``cache`` (``shared_block``) each row's sort is
    looked up by ``places`` (the memory of its target and draft rows) and only the rows not met before are sorted
    (a sort of the same keys: the same result, bit for bit)."""
    if cache is None:
        return torch.sort(keys, dim=-1, stable=True)
    new = [i for i, place in enumerate(places) if place not in cache]
    if new:
        index = torch.tensor(new, device=keys.device)
        values, order = torch.sort(keys.index_select(0, index), dim=-1, stable=True)
        cache.update({places[i]: (values[j], order[j]) for j, i in enumerate(new)})
    rows = [cache[place] for place in places]
    return torch.stack([values for values, _ in rows]), torch.stack([order for _, order in rows])


def greedy_path(draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                host: tuple[list[list[int]], list[list[float]]] | None = None,
                sort_cache: dict | None = None) -> GreedyPath:
    """The greedy path of one block and its exact law q_sel (see the module docstring).

    ``host`` = (tokens, rank keys at the draft tokens) when the caller already read them (the sampler's
    first host read); otherwise they are read here. ``sort_cache``: the sorted rows of the block met before
    (``GreedyMultiPathBlockVerification.shared_block``): the sort is most of this function's time."""
    device = draft_probs.device
    tokens = draft_tokens.long().to(device)
    K, L = tokens.shape
    if host is None:
        keys = _rank_keys(target_probs[:, :L].gather(-1, tokens[..., None]), draft_probs.gather(-1, tokens[..., None]))
        rows = torch.cat([tokens.double(), keys.squeeze(-1).double()]).tolist()  # one host read
        host = ([[int(t) for t in row] for row in rows[:K]], rows[K:])
    path, carrier, counts = _select(*host)
    path_t = torch.tensor(path, device=device)
    carrier_t = torch.tensor(carrier, device=device)
    depth = torch.arange(L + 1, device=device)
    targets = target_probs[carrier_t, depth]  # [L+1, V]: p(.|x^i)
    drafts = draft_probs[carrier_t[:L], depth[:L]]  # [L, V]: q(.|x^i)
    keys = _rank_keys(targets[:L], drafts)
    places = None if sort_cache is None else [(*_row_place(target_probs, row, i), *_row_place(draft_probs, row, i))
                                              for i, row in enumerate(carrier[:L])]
    ranked_keys, order = _sorted_keys(keys, places, sort_cache)
    ranked_q = drafts.gather(-1, order).to(_F64)
    ranked_q /= ranked_q.sum(-1, keepdim=True)  # the law the drafts were drawn from (sampling normalises)
    # Key classes (tokens with equal r; with q = p every token has r = 1): the selection takes the first survivor
    # in the highest class present, so within a class the selected token is drawn in proportion to Q.
    new_class = torch.ones_like(ranked_keys, dtype=torch.long)
    new_class[:, 1:] = (ranked_keys[:, 1:] != ranked_keys[:, :-1]).long()
    class_id = new_class.cumsum(-1) - 1
    class_mass = torch.zeros_like(ranked_q).scatter_add_(-1, class_id, ranked_q).gather(-1, class_id)
    cumulative = ranked_q.cumsum(-1)
    class_end = torch.zeros_like(ranked_q).scatter_reduce_(-1, class_id, cumulative, "amax").gather(-1, class_id)
    class_start = (class_end - class_mass).clamp_min(0)  # G^- of the class
    share = torch.where(class_mass > 0, ranked_q / class_mass, torch.zeros_like(ranked_q))
    rank_of = torch.empty_like(order).scatter_(-1, order, torch.arange(order.shape[-1], device=device).expand_as(order))
    at_selected = rank_of.gather(-1, path_t[:, None])  # [L, 1]: the selected token's rank
    selected = ranked_q.gather(-1, at_selected)
    masses = torch.cat([selected, (class_mass.gather(-1, at_selected) - selected).clamp_min(0),
                        class_start.gather(-1, at_selected)], dim=-1).tolist()  # one host read
    posteriors = _count_posteriors(masses, K)
    weights = torch.from_numpy(posteriors[:, 1:]).to(device=device, dtype=_F64)  # [L, K] over c = 1..K
    # f(v | c) = (G_end^c - G_start^c) Q(v) / Q(class of v) in rank order, mixed over the count posterior:
    # sum_c pi(c) (G_end^c - G_start^c) by Horner's rule in each of G_end, G_start ([L, V] buffers, K steps)
    end_sum, start_sum = (weights[:, K - 1:K].expand_as(class_end).clone() for _ in range(2))
    for c in range(K - 2, -1, -1):
        end_sum.mul_(class_end).add_(weights[:, c:c + 1])
        start_sum.mul_(class_start).add_(weights[:, c:c + 1])
    ranked_law = end_sum.mul_(class_end).sub_(start_sum.mul_(class_start)).mul_(share)
    draft_law = torch.empty_like(ranked_law).scatter_(-1, order, ranked_law)
    return GreedyPath(path_t, tuple(carrier), tuple(counts), targets.to(_F64), draft_law, posteriors)


def path_block_test(targets: torch.Tensor, draft_law: torch.Tensor, tokens: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Block verification of one path on the device: (h [L+1] with h_0 = 1, correction laws [L+1, V] with
    row L the bonus p(.|x^L), weights w [L+1]). targets [L+1, V], draft_law [L, V] (float64), tokens [L]."""
    L = tokens.shape[0]
    index = tokens[:, None]
    weights = running_ratio((targets[:L].gather(-1, index) / draft_law.gather(-1, index)).squeeze(-1))  # [L+1]
    scaled = targets[:L] * weights[:L, None]  # w_i p(.|x^i), i = 0..L-1
    excess = (scaled - draft_law).clamp_min(0)
    mass = excess.sum(-1)  # Z_i
    stop = torch.cat([clipped_stop_probability(mass, weights[:L]), weights[L:]])
    stop[0] = 1.0
    no_mass = mass <= 0  # (w p - q_sel)+ = 0 only when w = 1 and q_sel = p: then p itself
    corrections = torch.where(no_mass[:, None], targets[:L], excess / mass.clamp_min(1e-300)[:, None])
    return stop, torch.cat([corrections, targets[L:]]), weights


class GreedyMultiPathBlockVerification(Verifier):
    name = "mpbv"
    lossless = True
    claimed_lossless = True
    single_draft = False
    _sorted_rows: dict | None = None  # inside ``shared_block``: each path row's sort, by where the row lies

    @contextlib.contextmanager
    def shared_block(self, cache: dict | None = None) -> Iterator[dict]:
        """Within the block: the sort of each (draft row, depth) of the block's tensors is made once and reused by
        every later greedy path through that row of the same tensors or their views (the replay's row groups and
        K share their first rows; a sort of the same keys gives the same result). Rows are named by where they lie
        in memory: the cache keeps a reference to the tensors it names and is dropped on exit; they must not be
        written to meanwhile. ``cache``: a dict shared with other rules (keys are this rule's own)."""
        with block_cache(self, "_sorted_rows", cache, "mpbv") as shared:
            yield shared

    def _sample(self, draft_tokens, draft_probs, target_probs, generator, state) -> VerifyResult:
        device = draft_probs.device
        tokens = draft_tokens.long().to(device)
        K, L = tokens.shape
        keys = _rank_keys(target_probs[:, :L].gather(-1, tokens[..., None]), draft_probs.gather(-1, tokens[..., None]))
        eta = uniform(L, generator, device=None if generator is not None else device).to(device)
        rows = torch.cat([tokens.double(), keys.squeeze(-1).double(), eta[None]]).tolist()  # one host read
        path = greedy_path(tokens, draft_probs, target_probs, host=([[int(t) for t in r] for r in rows[:K]],
                                                                      rows[K:2 * K]))
        stop, laws, _ = path_block_test(path.targets, path.draft_law, path.tokens)
        passed = eta < stop[1:]
        depth = torch.arange(1, L + 1, device=device)
        tau = (depth * passed).max()  # the largest passing position, 0 if none
        token = sample(laws[tau], generator)
        tau_host, token_host = torch.stack([tau, token]).tolist()  # one host read
        out = torch.cat([path.tokens[:tau_host], torch.tensor([token_host], device=device)])
        return VerifyResult(out, tau_host, path.draft_index[tau_host], None)

    def expected_emitted(self, draft_tokens, draft_probs, target_probs, state=None) -> torch.Tensor:
        """E[τ + 1 | drafts], exact: the greedy path and its q_sel are fixed by the drafts (no randomness), so
        only BV's stops on the path are random: E = 1 + Σ_i P(τ ≥ i) from h_1..h_L. One host read (the path)."""
        L = draft_tokens.shape[1]
        return self.expected_emitted_by_length(draft_tokens, draft_probs, target_probs, [L])[L]

    def expected_emitted_by_length(self, draft_tokens, draft_probs, target_probs, lengths, state=None):
        """One greedy path for the longest length serves every shorter one: the selection and the count
        posterior at depth i read depths <= i only, so the path (and q_sel) of the first L tokens is a prefix."""
        longest = max(lengths)
        blocks = (draft_tokens[:, :longest], draft_probs[:, :longest], target_probs[:, :longest + 1])
        if self._sorted_rows is not None:
            self._sorted_rows.setdefault("tensors", []).extend([draft_probs, target_probs])  # keeps their memory
        path = greedy_path(*blocks, sort_cache=self._sorted_rows)
        values = {}
        for L in lengths:
            stop, _, _ = path_block_test(path.targets[:L + 1], path.draft_law[:L], path.tokens[:L])
            values[L] = expected_emitted_from_stops(stop[1:])
        return values

    def _law(self, draft_tokens, draft_probs, target_probs, state) -> list[Outcome]:
        path = greedy_path(draft_tokens, draft_probs.double(), target_probs.double())
        stop, laws, _ = path_block_test(path.targets, path.draft_law, path.tokens)
        prefix = tuple(path.tokens.tolist())
        law, builder = stop_law(stop.tolist()), LawBuilder()
        for tau in range(len(law) - 1, -1, -1):
            builder.add(prefix[:tau], law[tau], laws[tau])
        return builder.outcomes()
