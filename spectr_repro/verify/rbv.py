"""RBV: recursive block verification over K drafts (this project's lossless multi-draft block rule).

Shapes: draft_tokens [K, L], draft_probs [K, L, V] (q), target_probs [K, L+1, V] (p).

Keep a committed prefix z (length j, initially empty) and a *current target* r for position j+1
(initially p(. | context)). For each draft in order: skip it unless its first j tokens equal z; otherwise
run block verification (bv.py) on its positions j+1..L starting from w_j = 1, with r as the target at
position j+1 and p afterwards:

    w_i = min(1, w_{i-1} T_i(X_i) / q(X_i | X^{i-1})),  Z_i = sum_x (w_i T_{i+1}(x) - q(x | X^i))+,
    h_i = Z_i / (Z_i + 1 - w_i)  (j < i < L),  h_j = 1,  h_L = w_L,  tau = the largest i with eta_i < h_i;

set z = X^tau. If tau = L stop; else r <- norm((w_tau T_{tau+1} - q(. | z))+). At the end emit z plus a
token from p(. | z) if |z| = L, else from r. Each step is BV against a valid target (the residual law of
the tokens not yet explained), so the whole is valid as is; K = 1 is exactly BV.

GPU cost: one host read before the scan (every draft token, its ratio under the raw target and one uniform
per (draft, position)), then at most one per draft that is scanned: the first ratio of a later segment
(under the current target r, a device row) and the Z_i of every position whose test can pass, read together.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import numpy as np
import torch

from spectr_repro.verify.base import Outcome, Verifier, VerifyResult
from spectr_repro.verify.bv import BlockSegment, clipped_weights, excess_mass, rows_at
from spectr_repro.verify.common import (
    LawBuilder,
    block_cache,
    block_on_host,
    clipped_stop_probability,
    sample,
    token_ratios,
)

PRODUCT_CAP = 1e300  # running products of ratios are capped here (see _scan_later_segment)


def _segment(draft_tokens, draft_probs, target_probs, k: int, start: int, current_target,
             ratios: list[float] | None = None) -> BlockSegment:
    """Draft k's positions start+1..L, with ``current_target`` as the target of position start+1 (None: the
    raw target); ``ratios`` when the caller holds them on the host."""
    L = draft_tokens.shape[1]
    return BlockSegment(target_probs[k, start:L], draft_probs[k, start:], draft_tokens[k, start:],
                        first_target=current_target, ratios=ratios)


def _scan_later_segment(tokens, draft_probs, target_probs, k: int, start: int, current: torch.Tensor,
                        later_ratios: list[float], eta: list[float]) -> tuple[BlockSegment, int]:
    """Scan draft k from position start + 1 against ``current`` (a device row) with one host read.

    The first ratio rho_1 = r(X) / q(X) lives on the device; every later weight is w_i = min(rho_1 * a_i, b_i)
    with a_i = prod_{m=2..i} rho_m and b_i the clipped weights started from w_1 = 1 (both host numbers; by
    induction on w_i = min(1, w_{i-1} rho_i)). So before rho_1 is known, b_i >= w_i bounds the positions whose
    test can pass (eta_i < w_i), and their Z_i are computed with device weights and read with rho_1.
    a_i is capped at PRODUCT_CAP: beyond it rho_1 * a_i > 1 >= b_i for every rho_1 > 1e-300.
    """
    segment_tokens = tokens[k, start:]
    n = segment_tokens.shape[0]
    bounds = clipped_weights([math.inf, *later_ratios])  # b_0..b_n (b_1 = 1)
    products = [1.0, 1.0]  # a_0 (unused), a_1
    for ratio in later_ratios:
        products.append(0.0 if products[-1] == 0 else min(products[-1] * ratio, PRODUCT_CAP))
    first_ratio = token_ratios(current[None], draft_probs[k, start : start + 1], segment_tokens[:1])  # [1]
    maybe = [i for i in range(1, n) if eta[i - 1] < bounds[i]]
    read = first_ratio
    if maybe:
        a, b = (torch.tensor([values[i] for i in maybe], dtype=torch.float64, device=current.device)
                for values in (products, bounds))
        scale = torch.minimum(first_ratio * a, b)
        start_rows = [start + i for i in maybe]
        z = excess_mass(rows_at(target_probs[k], start_rows), rows_at(draft_probs[k], start_rows), scale)
        read = torch.cat([first_ratio, z.double()])
    first, *z_values = read.tolist()
    excess = dict(zip(maybe, z_values))
    segment = _segment(tokens, draft_probs, target_probs, k, start, current, ratios=[first, *later_ratios])
    return segment, segment.stop_position(eta, lambda positions: [excess[i] for i in positions])


# A sort of a vocabulary row costs about as much as this many direct passes sum_x (w p - c q)+ over it (~5x
# measured on CPU at V = 151,936; a sorted row also needs its cumulative sums): a draft whose masses are asked
# at more than this many queries per row of its segment gets its rows sorted once, else each mass is one pass.
SORT_ABOVE_QUERIES_PER_ROW = 6
_DIRECT_ELEMENTS = 1 << 22  # rows of one direct pass at a time (memory: ~32 MiB of float64)


class DirectExcess:
    """H(w, c) = sum_x (w p(x) - c q(x))+ at rows p, q [n, V], one V-wide pass per query (few queries)."""

    def __init__(self, p: torch.Tensor, q: torch.Tensor) -> None:
        self.p, self.q = p, q

    def __call__(self, row: np.ndarray, w: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """H at rows ``row`` [Q] (host integers) for w, c [Q] float64 (w, c >= 0): [Q] float64."""
        per_chunk = max(1, _DIRECT_ELEMENTS // self.p.shape[-1])
        row = torch.as_tensor(row, device=self.p.device)
        parts = []
        for lo in range(0, row.shape[0], per_chunk):
            index = row[lo : lo + per_chunk]
            scale_p = w[lo : lo + per_chunk].to(self.p.dtype).unsqueeze(-1)
            scale_q = c[lo : lo + per_chunk].to(self.q.dtype).unsqueeze(-1)
            # In the rows' dtype, like bv's excess_mass, and in place on the gathered copies (memory-bound).
            excess = self.p[index].mul_(scale_p).sub_(self.q[index].mul_(scale_q)).clamp_min_(0)
            parts.append(excess.sum(-1).double())
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64, device=self.p.device)


class SortedExcess:
    """H(w, c) = sum_x (w p(x) - c q(x))+ at rows p, q [n, V] for many queries: one sort per row.

    The tokens with w p > c q are those whose ratio p/q exceeds c/w: with the ratios sorted in decreasing
    order they are a leading run, found by binary search, and H = w P - c Q with P, Q the sums of p, q over
    that run (cumulative sums). Rounding: the sums are differences of float64 cumulative sums (~1e-16 of the
    row's mass), and a token whose ratio is within rounding of c/w adds ~0 either way.
    """

    def __init__(self, p: torch.Tensor, q: torch.Tensor) -> None:
        ratio = (p.double() / q).nan_to_num_(0.0)  # q = 0 < p: +inf (always counted); 0/0: 0 (adds nothing)
        descending, order = ratio.neg_().sort(-1)  # -ratio ascending = ratio descending
        self.neg_ratio = descending
        zero = torch.zeros_like(descending[:, :1])
        self.p_upto = torch.cat([zero, p.double().gather(-1, order).cumsum(-1)], -1)  # [n, V + 1]
        self.q_upto = torch.cat([zero, q.double().gather(-1, order).cumsum(-1)], -1)

    @property
    def rows(self) -> int:
        return self.neg_ratio.shape[0]

    def first(self, n: int) -> SortedExcess:
        """The same for the first ``n`` rows (views: a sorted row does not depend on the others)."""
        if n == self.rows:
            return self
        view = object.__new__(SortedExcess)
        view.neg_ratio, view.p_upto, view.q_upto = self.neg_ratio[:n], self.p_upto[:n], self.q_upto[:n]
        return view

    def __call__(self, row: np.ndarray, w: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """H at rows ``row`` [Q] (host integers) for w, c [Q] float64 (w, c >= 0): [Q] float64."""
        device = w.device
        threshold = torch.where(w > 0, c / w, torch.inf)  # w = 0: nothing is positive
        # Each query is looked up in its own row only: one binary search each (the rows are known on the host).
        count = torch.empty(len(row), dtype=torch.long, device=device)
        for r in np.unique(row).tolist():
            asks = torch.as_tensor(np.flatnonzero(row == r), device=device)
            count[asks] = torch.searchsorted(self.neg_ratio[r], threshold[asks].neg())  # ratio > c / w
        flat = torch.as_tensor(row, device=device) * self.p_upto.shape[-1] + count
        mass = w * self.p_upto.view(-1)[flat] - c * self.q_upto.view(-1)[flat]
        return mass.clamp_min_(0.0)


def _row_place(probs: torch.Tensor, row: int, depth: int) -> tuple[int, int, torch.dtype]:
    """Where row ``probs[row, depth]`` lies in memory: the same for every view of a block that reads it."""
    return (probs.untyped_storage().data_ptr(), probs.storage_offset() + row * probs.stride(0)
            + depth * probs.stride(1), probs.dtype)


def _shared_prefix_lengths(rows: list[list[int]] | None, L: int) -> np.ndarray:
    """[K, K] host integers: how many first tokens drafts k and o share (L for a draft and itself); [[L]] for K = 1
    (rows None). A state of owner o and committed length j matches draft k iff j <= this[k, o]."""
    if rows is None:
        return np.full((1, 1), L)
    tokens = np.asarray(rows)  # [K, L]
    differ = tokens[:, None, :] != tokens[None, :, :]  # [K, K, L]
    return np.where(differ.any(-1), differ.argmax(-1), L)  # the first position where they differ


def _spans(starts: np.ndarray, end: int) -> tuple[np.ndarray, np.ndarray]:
    """(state, position), host integers, of every position m in starts[i] .. end - 1, state by state, positions
    ascending: what ``[(i, m) for i, start in enumerate(starts) for m in range(start, end)]`` lists."""
    counts = np.clip(end - starts, 0, None)
    state = np.repeat(np.arange(len(starts)), counts)
    first = np.cumsum(counts) - counts  # where each state's run begins
    position = starts[state] + np.arange(len(state)) - first[state]
    return state, position


class RecursiveBlockVerification(Verifier):
    name = "rbv"
    lossless = True
    _sorted_drafts: dict | None = None  # inside ``shared_block``: each draft's sorted rows, by where they lie
    claimed_lossless = True
    single_draft = False

    def _sample(self, draft_tokens, draft_probs, target_probs, generator, state) -> VerifyResult:
        # One host read: every draft token, its ratio under the raw target and one uniform per (draft, position).
        tokens, rows, raw_ratios, eta = block_on_host(draft_tokens, draft_probs, target_probs, generator)
        K, L = tokens.shape
        committed, owner, current = 0, 0, None  # current None: the raw target p(. | context)
        for k in range(K):
            if rows[k][:committed] != rows[owner][:committed]:
                continue
            if current is None:  # the first segment: every weight is known on the host already
                segment = _segment(tokens, draft_probs, target_probs, k, 0, None, ratios=raw_ratios[k])
                tau = segment.scan(generator, eta=eta[k])
            else:
                segment, tau = _scan_later_segment(tokens, draft_probs, target_probs, k, committed, current,
                                                   raw_ratios[k][committed + 1 :], eta[k][committed:])
            committed, owner = committed + tau, k
            if committed == L:
                extra = sample(target_probs[k, L], generator)
                return VerifyResult(torch.cat([tokens[k], extra.view(1)]), L, k, None)
            current = segment.correction(tau)
        extra = sample(current, generator)
        return VerifyResult(torch.cat([tokens[owner, :committed], extra.view(1)]), committed, owner, None)

    @contextlib.contextmanager
    def shared_block(self, cache: dict | None = None) -> Iterator[dict]:
        """Within the block: a draft row's sorted vocabulary rows (``SortedExcess``), once made, serve every later
        ``expected_emitted`` on the same tensors or their views that reads that draft (the replay's row groups of
        every K and every L: rows [:L] of the longest are the shorter ones'); ``expected_emitted_by_length`` then
        goes longest first. A draft that has them uses them even where few queries would make direct passes
        cheaper (the same H to ~1e-16 of the row's mass). The tensors are named by where they lie in memory: the
        cache keeps a reference to them and is dropped on exit; they must not be written to meanwhile."""
        with block_cache(self, "_sorted_drafts", cache, "rbv") as shared:
            yield shared

    def expected_emitted_by_length(self, draft_tokens, draft_probs, target_probs, lengths, state=None):
        """``expected_emitted`` at every L, the longest first (inside ``shared_block`` its sorted rows serve the
        shorter lengths)."""
        values = {L: self.expected_emitted(draft_tokens[:, :L], draft_probs[:, :L], target_probs[:, :L + 1], state)
                  for L in sorted(set(lengths), reverse=True)}
        return {L: values[L] for L in lengths}

    def _shared_sorted(self, target_probs, draft_probs, k: int, L: int) -> SortedExcess | None:
        """Draft k's sorted rows [:L] made earlier in this block (``shared_block``), or None."""
        if self._sorted_drafts is None:
            return None
        found = self._sorted_drafts.get((*_row_place(target_probs, k, 0), *_row_place(draft_probs, k, 0)))
        return found.first(L) if found is not None and found.rows >= L else None

    def _sorted(self, target_probs, draft_probs, k: int, L: int) -> SortedExcess:
        """Draft k's rows [:L] sorted (kept for the block inside ``shared_block``)."""
        found = self._shared_sorted(target_probs, draft_probs, k, L)
        if found is not None:
            return found
        made = SortedExcess(target_probs[k, :L], draft_probs[k, :L])
        if self._sorted_drafts is not None:
            self._sorted_drafts.setdefault("tensors", []).extend([target_probs, draft_probs])  # keeps their memory
            self._sorted_drafts[(*_row_place(target_probs, k, 0), *_row_place(draft_probs, k, 0))] = made
        return made

    def expected_emitted(self, draft_tokens, draft_probs, target_probs, state=None) -> torch.Tensor:
        """E[tau + 1 | drafts] by a recursion over the drafts, exact.

        The current target is always r = norm((w p(. | z) - c q(. | z))+) for two scalars (w, c) at the
        committed prefix z: (1, 0) at the start (r = p); after a segment stopping at tau > 0 the correction
        norm((w_tau p - q)+) is (w_tau, 1); after tau = 0 it is norm((r - q)+) = norm((w p - (c + H(w, c)) q)+),
        i.e. (w, c + H(w, c)) with H(w, c) = sum_x (w p - c q)+, as drafts at z share q(. | z); a residual
        without mass falls back to its target: (1, 0), resp. (w, c) unchanged. A segment's stop law depends on
        r only through r(X_{j+1}) = (w p - c q)+(X_{j+1}) / H(w, c), then on the raw Z_i = H(w_i, 1): every
        V-wide quantity is an H at one of the draft's own rows (``DirectExcess`` / ``SortedExcess``).

        A state is (committed length j, owner draft, w, c, mass). Its (j, owner) follow from the tokens alone
        (which drafts carry the owner's first j tokens), so the histories are enumerated on the host and
        (w, c, mass) are device tensors: each draft expands every state it matches into one per stop position
        j..L-1, and adds mass * P(its segment reaches L) * (L + 1); the states left after the last draft add
        mass * (j + 1). The number of states is at most C(L + K - 1, K) (K identical drafts; 31,824 at K = 7,
        L = 12), usually far fewer (distinct drafts match only the states that stopped on their prefix).

        V-wide work: per draft, its H queries (2 per matched state, plus one per position inside each matched
        segment), each one pass over a row, or one sort of the draft's L rows when the queries exceed
        SORT_ABOVE_QUERIES_PER_ROW per row (one sort shared by drafts with the same first L - 1 tokens). So
        distinct drafts cost ~K * (L + 1) row passes (bv's expectation: L - 1). Identical drafts cost one sort of
        L rows plus one binary search per query. Host reads: one (the draft tokens) for K > 1, none for K = 1 (the
        states' lengths and owners are host integers).
        """
        device = draft_probs.device
        tokens = draft_tokens.long().to(device)
        K, L = tokens.shape
        rows = tokens.tolist() if K > 1 else None  # the tree's shape: the only host read
        ratios = token_ratios(target_probs[:, :L], draft_probs, tokens)  # [K, L] float64, raw p/q
        drawn = tokens.unsqueeze(-1)
        p_drawn = target_probs[:, :L].gather(-1, drawn).squeeze(-1).double()  # [K, L]: p, q of each draft token
        q_drawn = draft_probs.gather(-1, drawn).squeeze(-1).double()
        positions = torch.arange(L + 1, device=device).unsqueeze(-1)  # [L + 1, 1]: absolute stop positions
        shared_prefix = _shared_prefix_lengths(rows, L)  # [K, K] on the host: drafts' common first tokens
        # Host: each state's committed length and the draft it came from (int64 arrays: millions of states at K = 7,
        # L = 24 when the drafts agree).
        committed = np.zeros(1, dtype=np.int64)
        owners = np.zeros(1, dtype=np.int64)
        w = torch.ones(1, dtype=torch.float64, device=device)
        c = torch.zeros_like(w)
        mass = torch.ones_like(w)
        total = torch.zeros((), dtype=torch.float64, device=device)
        sorted_rows: dict[tuple[int, ...], SortedExcess] = {}
        for k in range(K):
            # A state matches draft k when draft k carries its owner's first j tokens.
            matches = committed <= shared_prefix[k][owners]
            match, keep = np.flatnonzero(matches), np.flatnonzero(~matches)
            M = len(match)
            if not M:
                continue
            j_host = committed[match]
            # Z queries: (position m, state i) for j_i < m < L, state by state, in the order of a [L + 1, M]
            # flattening.
            z_state, z_position = _spans(j_host + 1, L)
            queries = 2 * M + len(z_state)
            excess = self._shared_sorted(target_probs, draft_probs, k, L)
            if excess is not None:
                pass  # sorted earlier in this block (shared_block)
            elif queries <= SORT_ABOVE_QUERIES_PER_ROW * L:
                excess = DirectExcess(target_probs[k, :L], draft_probs[k])  # H at row k's nodes of length 0..L-1
            else:  # drafts with the same first L - 1 tokens share their rows: one sort serves them all
                path = tuple(rows[k][: L - 1]) if rows is not None else ()
                if path not in sorted_rows:
                    sorted_rows[path] = self._sorted(target_probs, draft_probs, k, L)
                excess = sorted_rows[path]
            pick = torch.as_tensor(match, device=device)
            j = torch.as_tensor(j_host, device=device)  # [M]
            w_s, c_s, mass_s = w[pick], c[pick], mass[pick]
            current_mass = excess(j_host, w_s, c_s)  # H(w, c): the unnormalised mass of r
            p_x, q_x = p_drawn[k, j], q_drawn[k, j]  # p, q of draft k's token after z, per state
            first_ratio = torch.where(current_mass > 0, (w_s * p_x - c_s * q_x).clamp_min(0) / (current_mass * q_x),
                                      0.0).nan_to_num_(0.0)  # r(X) / q(X)
            # w at absolute positions 0..L ([L + 1, M]): 1 up to j, min(1, r(X)/q(X)) at j + 1, then the raw
            # clipped running product (bv.clipped_weights, one [M] row per position).
            weights = [torch.ones_like(w_s)]
            for m in range(1, L + 1):
                step = torch.where(weights[-1] > 0, (weights[-1] * ratios[k, m - 1]).clamp(max=1.0), 0.0)
                weights.append(torch.where(j + 1 == m, first_ratio.clamp(max=1.0),
                                           torch.where(j + 1 < m, step, weights[-1])))
            weights = torch.stack(weights)  # [L + 1, M]
            # One batch of H queries: Z_m = H(w_m, 1) inside each segment, and H(w, c + H(w, c)) at z (the mass
            # left after a stop at z itself).
            z_flat = torch.as_tensor(z_position * M + z_state, device=device)
            z_weights = weights.view(-1)[z_flat]
            c_again = c_s + current_mass
            asked = excess(np.concatenate([z_position, j_host]), torch.cat([z_weights, w_s]),
                           torch.cat([torch.ones_like(z_weights), c_again]))
            z = torch.zeros(L + 1, M, dtype=torch.float64, device=device)
            z.view(-1)[z_flat] = asked[: z_flat.shape[0]]
            again_mass = asked[z_flat.shape[0] :]
            inner = (positions > j) & (positions < L)  # [L + 1, M]: positions with a Z
            stop = torch.where(inner, clipped_stop_probability(z, weights), 0.0)
            stop[L] = weights[L]
            stop = torch.where(positions == j, 1.0, stop)  # h_j = 1; positions below j: 0 (never reached)
            above = (1.0 - stop).flip(0).cumprod(0).flip(0)  # prod_{m' >= m} (1 - h_m')
            stop_law = stop * torch.cat([above[1:], torch.ones_like(above[:1])])  # P(tau = m), [L + 1, M]
            total = total + (L + 1) * (mass_s * stop_law[L]).sum()
            # Next targets: a stop at m > j gives (w_m, 1) (no mass Z_m: the raw p, (1, 0)); at m = j it gives
            # (w, c + H) (no mass left: r itself, (w, c)).
            w_next = torch.where(positions == j, w_s, torch.where(z > 0, weights, 1.0))
            c_next = torch.where(positions == j, torch.where(again_mass > 0, c_again, c_s), (z > 0).double())
            # Children (host structure): state i of the batch stops at m in j_i..L-1.
            child_state, child_position = _spans(j_host, L)
            child = torch.as_tensor(child_position * M + child_state, device=device)
            kept = torch.as_tensor(keep, device=device)
            w = torch.cat([w[kept], w_next.view(-1)[child]])
            c = torch.cat([c[kept], c_next.view(-1)[child]])
            mass = torch.cat([mass[kept], (mass_s * stop_law).view(-1)[child]])
            committed = np.concatenate([committed[keep], child_position])
            owners = np.concatenate([owners[keep], np.full_like(child_position, k)])
        j_final = torch.as_tensor(committed, dtype=torch.float64, device=device)
        return total + (mass * (j_final + 1)).sum()

    def _law(self, draft_tokens, draft_probs, target_probs, state) -> list[Outcome]:
        tokens = draft_tokens.long()
        rows = tokens.tolist()
        K, L = tokens.shape
        q_all, p_all = draft_probs.double(), target_probs.double()
        law = LawBuilder()

        def visit(k: int, committed: int, owner: int, current: torch.Tensor, mass: float) -> None:
            prefix = tuple(rows[owner][:committed])
            if k == K:
                law.add(prefix, mass, current)
                return
            if tuple(rows[k][:committed]) != prefix:
                visit(k + 1, committed, owner, current, mass)
                return
            segment = _segment(tokens, q_all, p_all, k, committed, current)
            for tau, prob in enumerate(segment.stop_law()):
                if prob <= 0:
                    continue
                if committed + tau == L:
                    law.add(tuple(rows[k]), mass * prob, p_all[k, L])
                else:
                    visit(k + 1, committed + tau, k, segment.correction(tau), mass * prob)

        visit(0, 0, 0, p_all[0, 0], 1.0)
        return law.outcomes()
