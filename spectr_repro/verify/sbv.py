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

The selection core (ranked head, rho, f_c, count posterior, q_sel, BV's terms) is ``verify/selection.py``.

``expected_emitted`` (E[tau + 1 | drafts], exact) walks the exact law's selection events with the same rules,
q_sel and stop probabilities, without the correction laws: at most K selected paths, no host read per path.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch

from spectr_repro.sampling import uniform
from spectr_repro.verify.base import FirstTokenLaw, Outcome, Verifier, VerifyResult
from spectr_repro.verify.common import (
    ValueMemo,
    block_cache,
    expected_emitted_from_stops,
    stop_law,
    stop_probability,
    tensor_key,
)
from spectr_repro.verify.selection import (
    DEFAULT_GRID_SIZE,
    DEFAULT_HEAD_SIZE,
    DEFAULT_RANK_SIZE,
    DEFAULT_TAIL_THRESHOLD,
    Head,
    PathTerms,
    Rules,
    best_rho,
    count_posterior,
    inverse_cdf,
    ranked_head,
    rows_at,
    rules_at,
    scan_events,
    select_tokens,
    selected_path_terms,
    shared_groups,
    single_draft_rules,
    stop_probabilities,
)

__all__ = ["Decision", "LawWalk", "SelectionBlockVerification"]

_F64 = torch.float64
_CACHE_MAX_VOCAB = 64  # memoise per-prefix rules only for toy vocabularies
_CACHE_MAX_ENTRIES = 100_000


@dataclass
class Decision:
    """What SBV's sampler decided on one block before emitting its last token (what sbvf's fallback reads)."""

    tokens: list[list[int]]  # the drafts, on the host
    leaders: list[list[int]]  # leaders[i][j]: the first draft sharing draft j's first i tokens
    rows: list[int]  # [L + 1] the draft whose rows the selected path reads at each depth (the group's leader)
    path: list[int]  # [L] the selected path
    counts: list[int]  # [L] survivors at each depth of the path
    terms: PathTerms  # q_sel and BV's terms along the path
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
    False: f at the observed count), ``grid_size`` (points of the rho grid),
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
        grid_size: int = DEFAULT_GRID_SIZE,
        head_size: int = DEFAULT_HEAD_SIZE,
        tail_threshold: float = DEFAULT_TAIL_THRESHOLD,
        rank_size: int = DEFAULT_RANK_SIZE,
        **options,
    ) -> None:
        super().__init__(check_inputs=check_inputs, **options)
        if grid_size < 2 or head_size < 1 or rank_size < 1 or not tail_threshold >= 0:
            raise ValueError(
                "sbv: need grid_size >= 2, head_size >= 1, rank_size >= 1 and tail_threshold >= 0; "
                f"got {grid_size}, {head_size}, {rank_size}, {tail_threshold}"
            )
        self.count_posterior = bool(count_posterior)
        self.grid_size = int(grid_size)
        self.head_size = int(head_size)
        self.tail_threshold = float(tail_threshold)
        self.rank_size = int(rank_size)
        self._memos = ValueMemo(_CACHE_MAX_ENTRIES)  # memo tables (toy vocabularies)
        self._buffers: dict[str, torch.Tensor] = {}  # scratch space kept between calls
        self._serials = itertools.count()  # names each memoised rule (never reused)
        self._row_rules: dict | None = None  # the rule per (row, depth) of one block (``shared_block``)

    # ---------------------------------------------------------------- the rule, shared by sampler and law
    def _rules(self, P_rows: torch.Tensor, Q_rows: torch.Tensor, K: int) -> Rules:
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
                          lambda: Rules.concat([rule for _, rule in parts]))

    @contextlib.contextmanager
    def shared_block(self, cache: dict | None = None) -> Iterator[dict]:
        """Within the block: the rule at each (draft row, depth) of the block's tensors is computed once per K and
        reused by every later call on the same tensors or their views (the sampler's draws, the exact walk, the
        sub-blocks the replay slices from one block: rows [:K], positions [:L]). The rule reads its two rows only,
        so the numbers are the same as unshared ones but for the round-off of batching rows differently (the
        ranked sets are padded to each batch's width). Rows are named by where they lie in memory: the cache holds
        a reference to each tensor it names (no other tensor can take that memory while it is open) and is dropped
        on exit; the tensors must not be written to meanwhile. ``cache``: share one with another instance (sbv and
        sbvf: its keys name the options the rule depends on)."""
        with block_cache(self, "_row_rules", cache) as shared:
            yield shared

    def _rules_for(self, target_probs: torch.Tensor, draft_probs: torch.Tensor, rows: list[int], depths: list[int],
                   K: int) -> Rules:
        """The rule at the prefixes (rows[j], depths[j]) of the block: ``_rules`` on those rows, computed once per
        block and K inside ``shared_block`` (only the rows not met before, in one batch)."""
        if self._row_rules is None or draft_probs.shape[-1] <= _CACHE_MAX_VOCAB:
            return self._rules(rows_at(target_probs, rows, depths), rows_at(draft_probs, rows, depths), K)
        options = (K, self.grid_size, self.head_size, self.tail_threshold, self.rank_size)
        keys = [(*_row_place(target_probs, row, depth), *_row_place(draft_probs, row, depth), options)
                for row, depth in zip(rows, depths)]
        new = [key for key in dict.fromkeys(keys) if key not in self._row_rules]
        if new:
            first = [keys.index(key) for key in new]
            new_rows, new_depths = [rows[j] for j in first], [depths[j] for j in first]
            batch = self._rules(rows_at(target_probs, new_rows, new_depths), rows_at(draft_probs, new_rows,
                                                                                     new_depths), K)
            self._row_rules.setdefault("tensors", []).extend([target_probs, draft_probs])  # keeps their memory
            self._row_rules.update({key: (batch, index) for index, key in enumerate(new)})
        places = [self._row_rules[key] for key in keys]
        if all(batch is places[0][0] for batch, _ in places) and [i for _, i in places] == list(
                range(places[0][0].ids.shape[0])):
            return places[0][0]  # exactly one batch, in order: no copy
        runs: list[tuple[Rules, list[int]]] = []  # consecutive rows from one batch: one take each
        for batch, index in places:
            if runs and runs[-1][0] is batch:
                runs[-1][1].append(index)
            else:
                runs.append((batch, [index]))
        device = draft_probs.device
        parts = [batch.take(torch.tensor(indices, device=device)) for batch, indices in runs]
        return parts[0] if len(parts) == 1 else Rules.concat(parts)

    def _rule_at(self, P: torch.Tensor, Q: torch.Tensor, K: int) -> tuple[int, Rules]:
        """(serial, the rule at one prefix), memoised by (P, Q, K) on toy vocabularies."""
        compute = lambda: (next(self._serials), self._compute_rules(P[None], Q[None], K))  # noqa: E731
        if P.shape[-1] > _CACHE_MAX_VOCAB:
            return compute()
        return self._memo("rules", (*tensor_key(P, Q), K), compute)

    def _node_rule(self, target_probs, draft_probs, row: int, depth: int, prefix, K: int) -> tuple[int, Rules]:
        """(serial, the rule at ``prefix`` = draft ``row``'s first ``depth`` tokens), on a toy vocabulary (memoised).
        SBV's rule reads that prefix's rows only; a subclass may read the rows and tokens of the whole prefix
        (sbvf's ``selection="mixture"``)."""
        return self._rule_at(target_probs[row, depth], draft_probs[row, depth], K)

    def _rows_rules(self, target_probs, draft_probs, rows: list[int], depths: list[int], tokens, K: int) -> Rules:
        """The rules at the prefixes (draft rows[j], depth depths[j]) of the drafts ``tokens`` (host lists), one
        batch: SBV's reads each prefix's rows only (computed once per block inside ``shared_block``: ``_rules_for``);
        an option whose rule depends on more (sbvf's ``selection="mixture"``) overrides this."""
        return self._rules_for(target_probs, draft_probs, rows, depths, K)

    def _scratch(self, shape, dtype: torch.dtype, device: torch.device, name: str) -> torch.Tensor:
        """A buffer kept between calls for the [n, V] temporaries: on the CPU a fresh tensor of megabytes costs
        a page fault per 4 KiB on every call (more than the arithmetic on it)."""
        numel = math.prod(shape)
        buffer = self._buffers.get(name)
        if buffer is None or buffer.numel() < numel or buffer.dtype != dtype or buffer.device != device:
            buffer = self._buffers[name] = torch.empty(numel, dtype=dtype, device=device)
        return buffer[:numel].view(shape)

    def _compute_rules(self, P_rows: torch.Tensor, Q_rows: torch.Tensor, K: int) -> Rules:
        ranked = ranked_head(P_rows, Q_rows, self.rank_size, self.tail_threshold, scratch=self._scratch)
        if K == 1:
            return single_draft_rules(ranked)
        return rules_at(ranked, self._choose_rho(ranked, K), K)

    def _choose_rho(self, ranked: Head, K: int) -> torch.Tensor:
        """[n, K - 1] rho_c for the counts c = 2..K: ``best_rho`` on the head_size ranked tokens of largest P + Q,
        as if they were the vocabulary."""
        return best_rho(ranked.top(self.head_size), self.grid_size, K)

    def _memo(self, table: str, key, compute):
        """Memoise ``compute()`` under ``key`` in one of the memo tables (toy vocabularies only)."""
        return self._memos.get(table, key, compute)

    def _weights(self, posterior: torch.Tensor | None, counts: torch.Tensor, K: int) -> torch.Tensor:
        """[L, K]: the law over counts 1..K that q_sel mixes at each depth (the posterior, or the observed count)."""
        if posterior is not None:
            return posterior
        return (counts[:, None] == torch.arange(1, K + 1, device=counts.device)).to(_F64)

    def _path_terms(self, rules, P_rows, Q_rows, path: list[int], counts: list[int], K: int) -> PathTerms:
        """q_sel and BV's terms along the selected path (rules and rows [L], observed counts [L])."""
        device = Q_rows.device
        path_tensor, counts_tensor = torch.tensor(path, device=device), torch.tensor(counts, device=device)

        def weights_of(q_at: torch.Tensor) -> torch.Tensor:
            posterior = count_posterior(rules, q_at, path_tensor) if self.count_posterior and K > 1 else None
            return self._weights(posterior, counts_tensor, K)

        return selected_path_terms(rules, P_rows, Q_rows, path_tensor, weights_of)

    def _toy_path_terms(self, target_probs, draft_probs, rows, path, counts, K) -> PathTerms:
        """_path_terms on a toy vocabulary, memoised by (rules, path, counts): shared by sampler and exact law."""
        L = len(path)
        trail = [self._node_rule(target_probs, draft_probs, rows[i], i, path[:i], K) for i in range(L)]
        key = (tuple(serial for serial, _ in trail), tuple(path), tuple(counts))
        return self._memo("paths", key, lambda: self._path_terms(
            Rules.concat([rule for _, rule in trail]), target_probs[rows[:L], list(range(L))],
            draft_probs[rows[:L], list(range(L))], path, counts, K))

    # ---------------------------------------------------------------- sampler
    def _sample(self, draft_tokens, draft_probs, target_probs, generator, state) -> VerifyResult:
        return self._finish(self._decide(draft_tokens, draft_probs, target_probs, generator), target_probs)

    def _decide(self, draft_tokens, draft_probs, target_probs, generator) -> Decision:
        """Stages 1 and 2 of the sampler: the selected path and BV's stop depth on it (not the emitted token)."""
        K, L = draft_tokens.shape
        device = draft_probs.device
        tokens = draft_tokens.tolist()  # host read: which drafts share which prefix
        leaders, sizes, groups = shared_groups(tokens)
        n = len(groups)
        u = uniform(n * K + L + 1, generator, device=None if generator is not None else device).to(device)

        # Stage 1: the selection at every prefix shared by >= 2 drafts, in one batch.
        next_row: dict[tuple[int, int], int] = {}
        shared, accepted_draft = None, None
        if groups:
            depth = [i for i, _ in groups]
            rows = [row for _, row in groups]
            shared = self._rows_rules(target_probs, draft_probs, rows, depth, tokens, K)
            levels = torch.tensor([leaders[i] for i in depth], device=device)  # [n, K]: each draft's leader
            member = levels == torch.tensor(rows, device=device)[:, None]
            count_index = torch.tensor([sizes[i][row] - 2 for i, row in groups], device=device)
            candidates = draft_tokens.T[depth].long()  # [n, K]
            chosen, accepted_draft = select_tokens(shared, candidates, member, count_index, u[: n * K].view(n, K))
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
            depths = list(range(L))
            P_rows, Q_rows = rows_at(target_probs, rows[:L], depths), rows_at(draft_probs, rows[:L], depths)
            position = {group: index for index, group in enumerate(groups)}
            shared_depths = [position[(i, rows[i])] for i in range(L) if (i, rows[i]) in position]
            split = len(shared_depths)
            parts = []
            if split:
                parts.append(shared if shared_depths == list(range(n)) else
                             shared.take(torch.tensor(shared_depths, device=device)))
            if split < L:
                parts.append(self._rows_rules(target_probs, draft_probs, rows[split:L], depths[split:], tokens, K))
            rules = parts[0] if len(parts) == 1 else Rules.concat(parts)
            terms = self._path_terms(rules, P_rows, Q_rows, path, counts, K)

        # tau = the largest i with eta_{i-1} <= h_i (h_0 = 1; h_L = w_L). h increases with Z: the bracket on
        # the tail's share decides most depths; the tail is summed exactly only where it does not.
        w, z_head, eta = terms.w, terms.z_head, u[n * K : n * K + L]
        h_low = stop_probabilities((z_head + terms.low)[1:], w)
        h_high = stop_probabilities((z_head + terms.high)[1:], w)
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
        extra = inverse_cdf(row, decision.last_uniform)
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
        (``PathTerms.exact_stops``: the exact Z wherever the tail has mass) and no correction law.

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

    def expected_emitted_by_length(self, draft_tokens, draft_probs, target_probs, lengths, state=None):
        """``expected_emitted`` of the first L tokens for every L in ``lengths`` from ONE walk at the longest: the
        selection at depth i and q_sel, w, Z there read depths <= i only, so a path of the longest walk carries the
        stops of its first L depths, and the walk's paths that share their first L tokens add up to that prefix's
        probability. Cost: the longest length's ``expected_emitted`` (a shorter one adds no V-wide pass)."""
        longest = max(lengths)
        totals = {L: torch.zeros((), dtype=_F64, device=draft_probs.device) for L in lengths}

        def leaf(walk: LawWalk, prob: float) -> None:
            stops = self._leaf_terms(target_probs, draft_probs, walk).exact_stops_by_length(lengths)
            for L, h in stops.items():
                totals[L] = totals[L] + prob * expected_emitted_from_stops(h)

        self._walk(draft_tokens[:, :longest], draft_probs[:, :longest], target_probs[:, :longest + 1], leaf,
                   by_draw=False)
        return totals

    def first_token_law(self, draft_tokens, draft_probs, target_probs) -> FirstTokenLaw:
        """Exact: the law's walk over the selection's events; a selected path (probability pi) emits its first
        token with probability pi (1 - P(tau = 0)) and BV's depth-0 correction with pi P(tau = 0) (the
        correction is a mixture over paths, normalised at the end). Cost: ``expected_emitted``'s plus one [V]
        correction row per selected path (at most K)."""
        K = draft_tokens.shape[0]
        firsts = draft_tokens[:, 0].tolist()
        weights = [0.0] * K
        residual = torch.zeros(draft_probs.shape[-1], dtype=_F64, device=draft_probs.device)

        def leaf(walk: LawWalk, prob: float) -> None:
            nonlocal residual
            terms = self._leaf_terms(target_probs, draft_probs, walk)
            stop_at_0 = stop_law([1.0, *terms.exact_stops().tolist()])[0]
            weights[firsts.index(walk.path[0])] += prob * (1.0 - stop_at_0)  # the first draft with that token
            if stop_at_0 > 0:
                residual = residual + (prob * stop_at_0) * terms.correction_law(slice(0, 1))[0]

        self._walk(draft_tokens, draft_probs, target_probs, leaf, by_draw=False)
        mass = float(residual.sum())
        residual = residual / mass if mass > 0 else target_probs[0, 0].to(_F64) / float(target_probs[0, 0].sum())
        return FirstTokenLaw(torch.tensor(weights, dtype=_F64, device=draft_probs.device), residual)

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
            rule_at = lambda i, row: self._node_rule(target_probs, draft_probs, row, i, tokens[row][:i], K)  # noqa: E731
        else:
            rule_at = self._prefix_rules(tokens, draft_probs, target_probs, K)

        def events_at(serial, rule, i, survivors) -> list[tuple[int, float, int]]:
            def compute():
                member = torch.zeros(1, K, dtype=torch.bool, device=columns.device)
                member[0, survivors] = True
                count_index = torch.full((1,), len(survivors) - 2, device=columns.device)
                probs, none, top = scan_events(rule, columns[i][None], member, count_index)
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
        _, _, groups = shared_groups(tokens)
        device = draft_probs.device
        where: dict[tuple[int, int], tuple[Rules, int]] = {}
        if groups:
            depth, rows = [i for i, _ in groups], [row for _, row in groups]
            shared = self._rows_rules(target_probs, draft_probs, rows, depth, tokens, K)
            where.update({group: (shared, j) for j, group in enumerate(groups)})

        def rule_at(i: int, row: int) -> tuple[int, Rules]:
            if (i, row) not in where:  # draft ``row`` alone from depth i on
                alone = self._rows_rules(target_probs, draft_probs, [row] * (L - i), list(range(i, L)), tokens, K)
                where.update({(i + m, row): (alone, m) for m in range(L - i)})
            rules, j = where[(i, row)]
            return next(self._serials), rules.take(torch.tensor([j], device=device))

        return rule_at

    def _leaf_terms(self, target_probs, draft_probs, walk: LawWalk) -> PathTerms:
        """q_sel and BV's terms on ``walk``'s path, as the sampler computes them (memoised on toys)."""
        L, K, path, rows = len(walk.path), walk.K, list(walk.path), list(walk.rows)
        if walk.toy:
            return self._toy_path_terms(target_probs, draft_probs, rows, path, walk.counts, K)
        depths = list(range(L))
        return self._path_terms(Rules.concat(list(walk.rules)), target_probs[rows[:L], depths],
                                draft_probs[rows[:L], depths], path, walk.counts, K)

    def _block_terms(self, target_probs, draft_probs, walk: LawWalk) -> tuple[list[float], torch.Tensor]:
        """(P(tau = i) for i = 0..L, the law of the emitted token after stopping at each i < L [L, V] float64)
        for BV on ``walk``'s path with the sampler's own q_sel, stop probabilities and outcome laws."""
        L = len(walk.path)
        terms = self._leaf_terms(target_probs, draft_probs, walk)
        return stop_law([1.0, *terms.exact_stops().tolist()]), terms.correction_law(slice(0, L))

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


def _row_place(probs: torch.Tensor, row: int, depth: int) -> tuple[int, int, torch.dtype]:
    """Where row ``probs[row, depth]`` lies in memory (its storage, first element and dtype): the same for every
    view of a block that reads that row."""
    offset = probs.storage_offset() + row * probs.stride(0) + depth * probs.stride(1)
    return probs.untyped_storage().data_ptr(), offset, probs.dtype


@dataclass(frozen=True)
class LawWalk:
    """A selected path as the exact law enumerates it: at each depth the rule, the draft whose rows it read,
    the survivors and the draw the scan accepted (-1: none, or events merged by token)."""

    tokens: list[list[int]]
    K: int
    toy: bool
    path: tuple[int, ...] = ()
    serials: tuple[int, ...] = ()
    rules: tuple[Rules, ...] = ()
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
