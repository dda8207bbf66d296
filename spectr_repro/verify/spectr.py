"""SpecTr: K-SEQ optimal-transport draft selection, one depth at a time (Sun et al., NeurIPS 2023).

Shapes: draft_tokens [K, L], draft_probs [K, L, V] (q), target_probs [K, L+1, V] (p); drafts are i.i.d.
from q given the context, so rows of drafts sharing a prefix carry the same conditionals.

Depth t (t = 1..L): the survivors S_t are the drafts whose first t-1 tokens equal the emitted prefix; with
k = |S_t|, p = p(. | prefix), q = q(. | prefix):

    beta(rho) = sum_x min(q(x), p(x) / rho),
    rho* = the smallest rho in [1, k] with 1 - (1 - beta(rho))^k <= rho * beta(rho)   (bisection),

try the survivors in order, accepting survivor s's token X with probability min(1, p(X) / (rho* q(X))).
If one is accepted, emit X, keep the survivors carrying X and go to depth t+1; if none is, emit a token from

    norm(p - min(q, p / rho*) * (1 - (1 - beta)^k) / beta)   (mass (1 - beta)^k, >= 0 by rho*'s choice)

and stop. Past depth L emit a bonus from p(. | X^L). K = 1 gives rho* = 1 and the residual (p - q)+: SD.

rho* is found exactly: beta is piecewise of the form A + B / rho between the sorted ratios p/q in (1, k), so
one sort of those ratios locates the piece holding rho* and a scalar bisection on that piece finishes (no
per-step vocabulary sums).

GPU cost (see spectr_repro.bench.counters): the sampler reads every draft token, its ratio p/q and one
uniform per test slot (draft, depth) in one host read; the acceptance tests are then host arithmetic on
those numbers (no kernel per depth or per survivor). rho* is needed only for survivor groups of two or
more drafts; the groups the scan can still reach are solved on the device in waves of 1, 2, 4, ... depths
(one batched sort and one host read per wave), so a call costs O(log L) launches and reads, whatever K.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

from spectr_repro.verify.base import Outcome, Verifier, VerifyResult
from spectr_repro.verify.common import (
    LawBuilder,
    ValueMemo,
    block_cache,
    block_on_host,
    normalize,
    sample,
    tensor_key,
    token_ratios,
)

# Slack on the K-SEQ condition: near rho = 1 with p ~ q the excess below is flat (order (rho - 1)^k) and
# its sign is decided by float64 round-off of beta; a residual at most this far below 0 is clipped to 0.
EXCESS_SLACK = 1e-15


def _kseq_excess(rho: float, beta: float, k: int) -> float:
    """rho * beta - (1 - (1 - beta)^k): >= 0 exactly when rho is admissible."""
    return rho * beta - (1.0 - (1.0 - beta) ** k)


def _admissible(rho: float, beta: float, k: int) -> bool:
    return _kseq_excess(rho, beta, k) >= -EXCESS_SLACK


_MAX_SURVIVORS = 1 << 15
_ONE_BITS = 0x3FF0000000000000  # the bit pattern of 1.0 as float64
_ROW_SHIFT = 56  # codes of keys in [1, 2^15] are < 15 * 2^52 < 2^56: 7 bits are left for the row


def rho_pieces(p: torch.Tensor, q: torch.Tensor, k: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """The piece of beta(rho) = A + B / rho that holds rho*, for R rows at once (no host read).

    p, q: [R, V]; k: R survivor counts (at most 2^15). Returns float64 [R, 6] on p's device, per row
    (first, key_before, key_at, p_before, q_before, q_total): with the ratios p/q sorted, ``first`` = the
    number of breakpoints below rho* (the first admissible one is at index ``first``), ``key_before`` /
    ``key_at`` the sorted keys at first - 1 / first (clamped into the row), ``p_before`` / ``q_before`` the
    sums of p / q over the tokens up to first - 1, ``q_total`` = sum q. ``solve_piece`` finishes on the host.

    For rho in [1, k] a token with ratio <= 1 always adds p/rho to beta and one with ratio >= k always adds q:
    only ratios strictly inside (1, k) are breakpoints. The others are pinned to the keys 0 and k.
    The excess rho*beta(rho) - (1 - (1 - beta(rho))^k) is non-decreasing in rho (rho*beta = sum min(rho q, p)
    grows, beta shrinks): along the sorted breakpoints the non-admissible ones form a prefix.
    """
    V = p.shape[-1]
    sizes = [int(size) for size in k]
    if max(sizes) > _MAX_SURVIVORS:
        raise ValueError(f"rho_pieces: at most {_MAX_SURVIVORS} survivors per row, got {max(sizes)}")
    # One exponent for every row is the common case (and a faster pow): a Python number, else a column.
    k = float(sizes[0]) if len(set(sizes)) == 1 else torch.tensor(sizes, dtype=torch.float64,
                                                                  device=p.device).unsqueeze(-1)
    ratio = (p.double() / q).nan_to_num_(0.0)  # q = 0: +inf becomes the largest float (pinned to k); 0/0: 0
    key = ratio.mul_(ratio > 1).clamp_(max=k)  # (a multiply is ~5x faster than where on CPU)
    key, order = sort_rows(key)
    p_upto = p.take(order).cumsum(-1, dtype=torch.float64)  # sum of p over the sorted tokens 0..j
    q_upto = q.take(order).cumsum(-1, dtype=torch.float64)
    q_total = q_upto[:, -1:]
    # beta at rho = key_j: the tokens up to j add p / rho (token j's p / key_j is its q), the later ones q.
    beta = (q_total - q_upto).add_(p_upto / key)
    excess = torch.addcmul((1 - beta).pow_(k).sub_(1), key, beta)
    below = ((excess < -EXCESS_SLACK) & (key < k)) | (key <= 1)
    first = below.sum(-1, keepdim=True)  # [R, 1]: the first admissible breakpoint (V if none)
    before, at = (first - 1).clamp_(min=0), first.clamp(max=V - 1)
    return torch.cat([first.double(), key.gather(-1, before), key.gather(-1, at), p_upto.gather(-1, before),
                      q_upto.gather(-1, before), q_total], -1)


def sort_rows(key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``key.sort(-1)`` for keys in {0} and [1, 2^15] (float64 [R, V]), ~2x faster on CPU. Returns the sorted
    keys [R, V] and the order as indices into the flattened rows ([R, V], for ``take``).

    Non-negative float64 numbers order like their bit patterns read as int64, and torch sorts a 1-D int64
    tensor by radix on CPU: each key becomes its bit pattern minus that of 1.0 (0 for the key 0), tagged
    with its row in the top bits, and all rows are sorted as one vector (each row stays one block).
    """
    R, V = key.shape
    if R >= 1 << (63 - _ROW_SHIFT):
        key, order = key.sort(-1)
        return key, order + torch.arange(0, R * V, V, device=key.device).unsqueeze(-1)
    code = (key.view(torch.int64) - _ONE_BITS).clamp_(min=0)
    code += torch.arange(R, device=key.device).unsqueeze(-1) << _ROW_SHIFT
    flat = code.view(-1).sort().indices  # rows in order, each row's keys ascending
    return key.take(flat).view(R, V), flat.view(R, V)


def solve_piece(piece: Sequence[float], k: int, V: int, tol: float = 1e-14) -> float:
    """rho* from one row of ``rho_pieces`` (host floats): the upper end of a scalar bisection on the piece
    beta = a + b / rho, rho in [lo, hi], so the returned value satisfies the K-SEQ condition."""
    first, key_before, key_at, p_before, q_before, q_total = piece
    if first == 0:  # no breakpoint below rho*: the piece starts at 1
        lo, b, a = 1.0, 0.0, q_total
    else:
        lo, b, a = max(key_before, 1.0), p_before, q_total - q_before
    hi = key_at if first < V and key_at < k else float(k)
    if lo == 1.0 and _admissible(1.0, a + b, k):  # p = q, disjoint supports, ...
        return 1.0
    for _ in range(200):  # scalar bisection on the piece beta = a + b / rho, rho in [lo, hi]
        if hi - lo <= tol * hi:
            break
        mid = 0.5 * (lo + hi)
        if _admissible(mid, a + b / mid, k):
            hi = mid
        else:
            lo = mid
    return hi


def optimal_rho(p: torch.Tensor, q: torch.Tensor, k: int, tol: float = 1e-14) -> float:
    """rho* for k survivors (p, q: [V]); the returned value satisfies the K-SEQ condition (upper end).

    The admissible set is [rho*, k] (the excess is non-decreasing in rho, see ``rho_pieces``).
    """
    if k == 1:
        return 1.0
    return solve_piece(rho_pieces(p[None], q[None], [k])[0].tolist(), k, p.shape[-1], tol)


def kseq_residual(p: torch.Tensor, q: torch.Tensor, rho: float, k: int) -> torch.Tensor:
    """norm(p - min(q, p/rho) * (1 - (1 - beta)^k) / beta): the law of the correction after k rejections.

    Computed on the device (beta stays a tensor: no host read); rows with no residual mass fall back to p.
    """
    accepted = torch.minimum(q, p / rho)
    if k == 1:
        return normalize((p - accepted).clamp_min(0), fallback=p)  # scale 1 exactly: bit-for-bit SD
    beta = accepted.sum(-1, keepdim=True, dtype=torch.float64)
    scale = torch.where(beta > 0, (1 - (1 - beta) ** k) / beta, 0.0).to(accepted.dtype)
    return normalize((p - accepted * scale).clamp_min(0), fallback=p)


class _GroupRho:
    """rho* of the survivor groups a SpecTr scan reaches, solved on the device in waves of depths.

    A group = the drafts sharing their first t tokens (they share p and q at depth t); it is named by its
    first draft. When the scan reaches a group not solved yet, every group of two or more drafts it can
    reach in the next 1, 2, 4, ... depths (doubling per wave) is solved in one batch: one sort of [R, V]
    and one host read per wave. Doubling wastes at most one wave's work beyond the depth where the scan
    stops, and bounds the waves per call by log2(L) + 1.
    """

    def __init__(self, target_probs: torch.Tensor, draft_probs: torch.Tensor, rows: list[list[int]]) -> None:
        self.target_probs, self.draft_probs, self.rows = target_probs, draft_probs, rows
        self.pieces: dict[tuple[int, int], list[float]] = {}  # (depth, first draft of the group) -> piece
        self.wave = 1

    def __call__(self, t: int, survivors: list[int]) -> float:
        if (t, survivors[0]) not in self.pieces:
            self._solve_wave(t, survivors)
        return solve_piece(self.pieces[t, survivors[0]], len(survivors), self.target_probs.shape[-1])

    def _solve_wave(self, t: int, survivors: list[int]) -> None:
        groups = []  # (depth, first draft, size) of every group of >= 2 drafts reachable in this wave
        for depth in range(t, min(t + self.wave, len(self.rows[0]))):
            by_prefix: dict[tuple[int, ...], list[int]] = {}
            for s in survivors:
                by_prefix.setdefault(tuple(self.rows[s][t:depth]), []).append(s)
            groups += [(depth, members[0], len(members)) for members in by_prefix.values() if len(members) > 1]
        self.wave *= 2
        depths, firsts, sizes = zip(*groups)
        device = self.target_probs.device
        index = (torch.tensor(firsts, device=device), torch.tensor(depths, device=device))
        pieces = rho_pieces(self.target_probs[index], self.draft_probs[index], sizes).tolist()
        self.pieces.update({(depth, first): piece for depth, first, piece in zip(depths, firsts, pieces)})


# Rows of one batched rho_pieces call in expected_emitted: R * V elements per [R, V] buffer (rho_pieces holds
# several at once), ~32 MiB of float64 each, so K = 7, L = 12 at V = 151,936 (at most 36 groups) is <= 2 calls.
_PIECE_ELEMENTS = 1 << 22


def survivor_groups(rows: list[list[int]]) -> list[tuple[int, list[int]]]:
    """(depth t, members) of every tree node with two or more survivors: the drafts (in row order) whose first
    t tokens agree, for t = 0..L-1. Nodes of one survivor need no rho* (K-SEQ with k = 1 is SD, rho* = 1)."""
    groups = []
    for depth in range(len(rows[0])):
        by_prefix: dict[tuple[int, ...], list[int]] = {}
        for s, row in enumerate(rows):
            by_prefix.setdefault(tuple(row[:depth]), []).append(s)
        groups += [(depth, members) for members in by_prefix.values() if len(members) > 1]
    return groups


def _row_place(probs: torch.Tensor, row: int, depth: int) -> tuple[int, int, torch.dtype]:
    """Where row ``probs[row, depth]`` lies in memory: the same for every view of a block that reads it."""
    return (probs.untyped_storage().data_ptr(), probs.storage_offset() + row * probs.stride(0)
            + depth * probs.stride(1), probs.dtype)


def shared_prefix(tokens: torch.Tensor) -> torch.Tensor:
    """[K, K, L + 1] bool: entry (s, i, t) says drafts s and i agree on their first t tokens (same tree node)."""
    K = tokens.shape[0]
    same_token = (tokens.unsqueeze(1) == tokens.unsqueeze(0)).long()  # [K, K, L]
    start = torch.ones(K, K, 1, dtype=torch.long, device=tokens.device)
    return torch.cat([start, same_token.cumprod(-1)], dim=-1).bool()


class SpecTr(Verifier):
    name = "spectr"
    lossless = True
    claimed_lossless = True
    single_draft = False

    def __init__(self, check_inputs: bool = True, **options) -> None:
        super().__init__(check_inputs, **options)
        # The exact law is called for every draft tuple of a toy, and the depth-t step (rho*, residual)
        # depends only on (p, q, k): memoise it across calls by value (law inputs are small by contract).
        self._memos = ValueMemo()

    _node_rho: dict | None = None  # inside ``shared_block``: rho* of each (row, depth, survivors) of the block

    @contextlib.contextmanager
    def shared_block(self, cache: dict | None = None) -> Iterator[dict]:
        """Within the block: rho* of a tree node, once solved, serves every later ``expected_emitted`` on the same
        tensors or their views (the node's rows named by where they lie in memory, with its number of survivors):
        the replay's shorter L (their nodes are the longer L's first depths) and the row groups of other K whose
        nodes coincide. The cache keeps a reference to the tensors and is dropped on exit; they must not be written
        to meanwhile."""
        with block_cache(self, "_node_rho", cache, "spectr") as shared:
            yield shared

    def _node_rhos(self, target_probs, draft_probs, groups: list[tuple[int, list[int]]]) -> list[float]:
        """rho* of each node (depth, members) of ``groups``: batched rho_pieces rows finished by ``solve_piece``,
        only for the nodes not solved earlier in this block (``shared_block``)."""
        V, device = draft_probs.shape[-1], draft_probs.device
        cache = self._node_rho
        keys = None if cache is None else [
            (*_row_place(target_probs, members[0], depth), *_row_place(draft_probs, members[0], depth), len(members))
            for depth, members in groups]
        missing = [j for j in range(len(groups)) if keys is None or keys[j] not in cache]
        values: dict[int, float] = {}
        per_call = max(1, _PIECE_ELEMENTS // V)
        for lo in range(0, len(missing), per_call):
            batch = [groups[j] for j in missing[lo : lo + per_call]]
            index = (torch.tensor([members[0] for _, members in batch], device=device),
                     torch.tensor([depth for depth, _ in batch], device=device))
            sizes = [len(members) for _, members in batch]
            pieces = rho_pieces(target_probs[index], draft_probs[index], sizes).tolist()
            for j, size, piece in zip(missing[lo : lo + per_call], sizes, pieces):
                values[j] = solve_piece(piece, size, V)
        if cache is not None:
            if missing:
                cache.setdefault("tensors", []).extend([target_probs, draft_probs])  # keeps their memory
            cache.update({keys[j]: values[j] for j in missing})
            return [values[j] if j in values else cache[keys[j]] for j in range(len(groups))]
        return [values[j] for j in range(len(groups))]

    def correction(self, p: torch.Tensor, q: torch.Tensor, rho: float, k: int) -> torch.Tensor:
        """Law of the token emitted when all k survivors are rejected (see ``kseq_residual``)."""
        return kseq_residual(p, q, rho, k)

    def _law_step(self, p: torch.Tensor, q: torch.Tensor, k: int) -> tuple[float, torch.Tensor]:
        if p.numel() > 256:  # not a toy: no memo (it would hold full-vocabulary rows)
            rho = optimal_rho(p, q, k)
            return rho, self.correction(p, q, rho, k)

        def step() -> tuple[float, torch.Tensor]:
            rho = optimal_rho(p, q, k)
            return rho, self.correction(p, q, rho, k)

        return self._memos.get("law steps", (*tensor_key(p, q), k), step)

    def _sample(self, draft_tokens, draft_probs, target_probs, generator, state) -> VerifyResult:
        # One host read: every draft token, its ratio p/q and one uniform per test slot (draft, depth).
        tokens, rows, ratio, eta = block_on_host(draft_tokens, draft_probs, target_probs, generator)
        K, L = tokens.shape
        group_rho = _GroupRho(target_probs, draft_probs, rows)
        survivors = list(range(K))  # the drafts carrying the emitted prefix, in draft order
        for t in range(L):
            k = len(survivors)
            rho = group_rho(t, survivors) if k > 1 else 1.0
            # The first survivor whose test passes (host arithmetic on the numbers read above).
            chosen = next((s for s in survivors if eta[s][t] < min(1.0, ratio[s][t] / rho)), None)
            if chosen is None:
                first = survivors[0]
                extra = sample(self.correction(target_probs[first, t], draft_probs[first, t], rho, k), generator)
                return VerifyResult(torch.cat([tokens[first, :t], extra.view(1)]), t, first, None)
            survivors = [s for s in survivors if rows[s][t] == rows[chosen][t]]
        first = survivors[0]
        extra = sample(target_probs[first, L], generator)
        return VerifyResult(torch.cat([tokens[first], extra.view(1)]), L, first, None)

    def expected_emitted(self, draft_tokens, draft_probs, target_probs, state=None) -> torch.Tensor:
        """E[tau + 1 | drafts] = 1 + sum over the draft tree's nodes at depths 1..L of P(the scan reaches them).

        A node at depth t is a distinct prefix of the draft rows; its survivors S are the rows carrying it, in
        row order. With a_s = min(1, ratio_s / rho*) (rho* = the node's K-SEQ solution, 1 when |S| = 1), the
        scan accepts survivor s first with probability a_s * prod_{i in S, i < s} (1 - a_i) and moves to the
        child of the token it carries, so P(reach child) = P(reach node) * sum over the child's rows of that.
        Every row s holds the reach probability of its own node at each depth, so the tree is a [K, L] tensor:
        g[s, t] = sum over the rows of s's depth-(t+1) node of their first-acceptance probability at t, and
        P(reach s's node at depth t) = prod_{t' < t} g[s, t'] (a cumprod); each node is counted once, at its
        first row. Same numbers as ``_law`` (its sum of probability * len(tokens)), without enumerating outcomes.

        Host reads: none for K = 1; else one for the draft tokens (the tree's shape) and one per batch of
        rho_pieces rows (every node of two or more survivors, all depths together; one batch unless the nodes
        exceed _PIECE_ELEMENTS / V rows), each rho* then finished on the host by ``solve_piece``. V-wide work:
        one rho_pieces row (one sort) per node of two or more survivors, the sampler's work for a full scan.
        """
        device = draft_probs.device
        tokens = draft_tokens.long().to(device)
        K, L = tokens.shape
        ratios = token_ratios(target_probs[:, :L], draft_probs, tokens)  # [K, L] float64
        rho = torch.ones(K, L, dtype=torch.float64, device=device)
        groups = survivor_groups(tokens.tolist()) if K > 1 else []
        if groups:
            solved = [[1.0] * L for _ in range(K)]  # rho* of each row's node at each depth (host floats)
            for (depth, members), value in zip(groups, self._node_rhos(target_probs, draft_probs, groups)):
                for s in members:
                    solved[s][depth] = value
            rho = torch.tensor(solved, dtype=torch.float64, device=device)  # a host-to-device copy, no read
        accept = (ratios / rho).clamp_(max=1.0)  # a_s at each depth, [K, L]
        shared = shared_prefix(tokens)  # [K, K, L + 1]
        earlier = torch.ones(K, K, dtype=torch.bool, device=device).tril_(-1)  # (s, i): i < s
        same_node = shared[:, :, :L]  # (s, i, t): i survives with s at depth t
        rejected = torch.where(same_node & earlier.unsqueeze(-1), (1.0 - accept).unsqueeze(0), 1.0)
        first_accept = accept * rejected.prod(1)  # [K, L]: survivor s is the first accepted at its node
        reach_step = torch.einsum("sit,it->st", shared[:, :, 1:].double(), first_accept)  # g[s, t]
        reach = reach_step.cumprod(-1)  # [K, L]: entry t-1 = P(reach s's node at depth t)
        node_head = ~(shared[:, :, 1:] & earlier.unsqueeze(-1)).any(1)  # s is its depth-t node's first row
        return 1.0 + (reach * node_head).sum()

    def _law(self, draft_tokens, draft_probs, target_probs, state) -> list[Outcome]:
        rows = draft_tokens.long().tolist()
        K, L = draft_tokens.shape
        p_all, q_all = target_probs.double().cpu(), draft_probs.double().cpu()
        # Survivors share their prefix, hence their conditionals: each draft's own rows give its ratio.
        ratios = token_ratios(p_all[:, :L], q_all, draft_tokens.long()).tolist()
        law = LawBuilder()

        def depth(t: int, survivors: list[int], prefix: tuple[int, ...], mass: float) -> None:
            first = survivors[0]
            if t == L:
                law.add(prefix, mass, p_all[first, L])
                return
            p, q, k = p_all[first, t], q_all[first, t], len(survivors)
            rho, correction = self._law_step(p, q, k)
            accepted: dict[int, float] = {}
            none_yet = mass  # P(reach depth t and every survivor so far rejected)
            for s in survivors:
                a = min(1.0, ratios[s][t] / rho)
                accepted[rows[s][t]] = accepted.get(rows[s][t], 0.0) + none_yet * a
                none_yet *= 1.0 - a
            for token, token_mass in accepted.items():
                if token_mass > 0:
                    depth(t + 1, [s for s in survivors if rows[s][t] == token], prefix + (token,), token_mass)
            law.add(prefix, none_yet, correction)

        depth(0, list(range(K)), (), 1.0)
        return law.outcomes()
