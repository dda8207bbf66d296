"""SBV-F — selection block verification with fallback (ours; lossless for any K). Derivation: docs/sbvf.md.

Shapes: draft_tokens [K, L], draft_probs [K, L, V] (q), target_probs [K, L+1, V] (p); see verify.base.

SBV-F is SBV (sbv.py) with one more step where SBV stops early. Stages 1-2 are SBV's own code: the selected
path x (ranked head, rho grid, f_c, the count posterior, q_sel) and BV's stop depth tau on it. SBV would now
emit x^tau and one token from r = norm((w_tau P_tau - q_sel[tau])+). SBV-F instead:

3. *Fallback*. If tau < L, the drafts that pass through x^tau but carry another token than x_{tau+1} at depth
   tau+1 (the *candidates*) were seen by stages 1-2 only through the scan at depth tau+1. Given everything
   stages 1-2 depend on, candidate j's token there has a known law g_j (v = x_{tau+1}, k = the survivor count,
   a_k = SBV's acceptance probability: 1 on the tail) and its later tokens are fresh draws from q:
       - drawn after the accepted draw in the scan ("free"):   g ~ Q,            restricted to tokens != v;
       - drawn before it ("rejected"):                          g ~ Q (1 - a_k),  restricted to tokens != v;
       - no draw accepted, v of top rank ("below"):             g ~ Q (1 - a_k),  restricted to rank < rank(v);
   Instead of one token from r, run recursive block verification (rbv.py) over the candidates in draft order,
   with r as the target at depth tau+1 and g_j as candidate j's draft law there (q deeper); emit its output.

Why it is valid (docs/sbvf.md): stages 1-2 are SBV, valid as is. Stage 3 replaces "one token from r" by a rule
that is valid for the target (r at depth tau+1, then p) conditionally on the whole history, because every
candidate step is BV against a valid target with the candidate's exact conditional law. It keeps every token
SBV accepts and can only add more, so E[accepted] of SBV-F >= SBV's on every input. With ``fallback=False`` (or
where there are no candidates) the sampler is SBV's, uniform for uniform: same tokens for the same generator.
K = 1 has no candidates: the rule is BV.

Cost per call: SBV's, plus at an early stop with candidates one host read (the scan's outcome), the candidates'
laws ([n, V]) and one batched BV scan of the candidates' remaining positions (one read).
"""

from __future__ import annotations

import torch

from spectr_repro.verify.base import Outcome, VerifyResult
from spectr_repro.verify.bv import BlockSegment, excess_mass
from spectr_repro.verify.common import LawBuilder, running_ratio, stop_probability, tensor_key, uniform
from spectr_repro.verify.mixture_rho import mixture_rho, prefix_state
from spectr_repro.verify.sbv import _CACHE_MAX_VOCAB, LawWalk, SelectionBlockVerification
from spectr_repro.verify.selection import (
    DEFAULT_GRID_SIZE,
    DEFAULT_HEAD_SIZE,
    DEFAULT_RANK_SIZE,
    DEFAULT_TAIL_THRESHOLD,
    Rules,
    inverse_cdf,
    ranked_head,
    rules_at,
)

__all__ = ["BELOW", "FREE", "REJECTED", "SelectionBlockVerificationFallback", "candidate_laws", "scan_statuses"]

SELECTIONS = ("count", "mixture")  # how rho is chosen at a prefix: SBV's per count, or for the count mixture
FREE, REJECTED, BELOW = "free", "rejected", "below"  # what the scan at depth tau+1 revealed about a candidate
_F64 = torch.float64


def scan_statuses(survivors: list[int], tokens: list[list[int]], depth: int, token: int,
                  accepted_draft: int) -> list[tuple[int, str]]:
    """(row, status) of the candidates at ``depth``: the survivors (draft order) that do not carry the selected
    ``token``; ``accepted_draft`` is the draft whose draw the scan accepted there (-1: none, top rank taken)."""
    out = []
    for row in survivors:
        if tokens[row][depth] == token:
            continue
        if accepted_draft < 0:
            out.append((row, BELOW))
        else:
            out.append((row, REJECTED if row < accepted_draft else FREE))
    return out


def candidate_laws(rules: Rules, depth: int, Q_row: torch.Tensor, count: int, token: int,
                   statuses: list[str]) -> torch.Tensor:
    """The candidates' token laws at the stop depth, float64 [n, V], normalised: Q restricted to tokens != v
    (FREE), Q (1 - a) on the ranked tokens (the tail is never rejected) restricted to != v (REJECTED) or to
    ranks below v's (BELOW). ``rules`` row ``depth`` is SBV's rule there, ``count`` (>= 2) its survivors,
    ``Q_row`` [V] the draft row (as given) and ``token`` = v the selected token.

    A law depends on the status only: one row per status present, then one gather (ops do not grow with n).
    """
    kinds = sorted(set(statuses))
    ids = rules.ids[depth]
    rows = []
    for kind in kinds:
        if kind == FREE:
            rows.append(Q_row.to(_F64, copy=True))  # a copy: v's entry is zeroed below, never the caller's row
            continue
        rejected = rules.q[depth] - rules.accepted[depth, count - 2]  # Q (1 - a) in rank order, 0 where unranked
        if kind == BELOW:  # the ranked tokens before v's slot (rank order: lower ranks first)
            before_v = ((ids == token) & rules.ranked[depth]).to(torch.uint8).cumsum(-1) == 0
            rejected = rejected * before_v
        rows.append(Q_row.new_zeros(Q_row.shape[-1], dtype=_F64).scatter_add_(0, ids, rejected))
    if len(rows) == 1:
        laws = rows[0][None]
    elif kinds == [FREE, REJECTED]:  # the scan accepted a draw: the drafts before it are REJECTED, after it FREE
        is_free = torch.tensor([status == FREE for status in statuses], device=ids.device)[:, None]
        laws = torch.where(is_free, rows[0], rows[1])
    else:  # BELOW with others: no scan gives that (tests ask for every law at once)
        laws = torch.stack(rows)[torch.tensor([kinds.index(status) for status in statuses], device=ids.device)]
    laws[:, token] = 0.0
    laws = laws / laws.sum(-1, keepdim=True)  # > 0 for every status present: the candidate's token has mass
    return laws.expand(len(statuses), -1) if len(rows) == 1 else laws


class SelectionBlockVerificationFallback(SelectionBlockVerification):
    """SBV-F: SBV's selection and block verification, then fallback on the drafts that left the selected path
    where it was rejected (lossless for any K; equal to BV at K = 1; never below SBV).

    Options: ``fallback`` (default True; False is SBV exactly), ``selection`` ("count", the default: SBV's rho per
    survivor count; "mixture": rho chosen at each prefix for the count mixture BV sees, the greedy point rho = inf
    included, ``verify/mixture_rho.py``; at least MP-BV on every audit toy, docs/theory.md), and SBV's
    ``grid_size``, ``head_size``, ``tail_threshold`` and ``rank_size`` (the selection always uses SBV's defaults
    otherwise: the randomized selection with the count posterior, which the candidates' laws are derived for).
    """

    name = "sbvf"

    def __init__(self, check_inputs: bool = True, fallback: bool = True, grid_size: int = DEFAULT_GRID_SIZE,
                 head_size: int = DEFAULT_HEAD_SIZE, tail_threshold: float = DEFAULT_TAIL_THRESHOLD,
                 rank_size: int = DEFAULT_RANK_SIZE, selection: str = "count", **options) -> None:
        super().__init__(check_inputs=check_inputs, count_posterior=True, grid_size=grid_size, head_size=head_size,
                         tail_threshold=tail_threshold, rank_size=rank_size, **options)
        self.fallback = bool(fallback)
        if selection not in SELECTIONS:
            raise ValueError(f"sbvf: selection must be one of {', '.join(SELECTIONS)}, got {selection!r}")
        self.selection = selection

    # ------------------------------------------------------------------------------------------- selection="mixture"
    def _node_rule(self, target_probs, draft_probs, row: int, depth: int, prefix, K: int) -> tuple[int, Rules]:
        """SBV's rule, or with ``selection="mixture"`` the rule whose rho suits the count mixture at ``prefix``
        (it reads the rows and tokens of the whole prefix; memoised on toy vocabularies by those)."""
        if self.selection == "count" or K == 1:
            return super()._node_rule(target_probs, draft_probs, row, depth, prefix, K)
        compute = lambda: (next(self._serials), self._mixture_rule(target_probs, draft_probs, row, depth,  # noqa: E731
                                                                   tuple(prefix), K))
        if draft_probs.shape[-1] > _CACHE_MAX_VOCAB:  # a large vocabulary: recomputed (a reference, not GPU-lean)
            return compute()
        key = (*tensor_key(target_probs[row, :depth + 1], draft_probs[row, :depth + 1]), tuple(prefix), K)
        return self._memo("mixture_rules", key, compute)

    def _rows_rules(self, target_probs, draft_probs, rows: list[int], depths: list[int], tokens, K: int) -> Rules:
        if self.selection == "count" or K == 1:
            return super()._rows_rules(target_probs, draft_probs, rows, depths, tokens, K)
        return Rules.concat([self._node_rule(target_probs, draft_probs, row, depth, tokens[row][:depth], K)[1]
                             for row, depth in zip(rows, depths)])

    def _mixture_rule(self, target_probs, draft_probs, row: int, depth: int, prefix: tuple[int, ...], K: int) -> Rules:
        """The rule at ``prefix`` (draft ``row``'s first ``depth`` tokens) with rho from ``mixture_rho``: the count
        law and running ratio there come from the rules of the prefix's own depths (recursively, each memoised)."""
        P, Q = target_probs[row, depth][None], draft_probs[row, depth][None]
        head = ranked_head(P, Q, self.rank_size, self.tail_threshold, scratch=self._scratch)
        if depth == 0:
            pi = torch.zeros(K, dtype=_F64, device=P.device)
            pi[K - 1] = 1.0
            w = torch.ones((), dtype=_F64, device=P.device)
        else:
            ancestors = [self._node_rule(target_probs, draft_probs, row, m, prefix[:m], K)[1] for m in range(depth)]
            pi, w = prefix_state(Rules.concat(ancestors), target_probs[row, :depth], draft_probs[row, :depth],
                                 torch.tensor(prefix, device=P.device), K)
        return rules_at(head, mixture_rho(head.top(self.head_size), pi, w, self.grid_size, K), K)

    # ------------------------------------------------------------------------------------------- hooks
    @staticmethod
    def _candidate_laws(rules: Rules, depth: int, Q_row: torch.Tensor, count: int, token: int,
                        statuses: list[str]) -> torch.Tensor:
        """The candidates' draft laws at depth tau+1, [n, V] (a hook for negative controls)."""
        return candidate_laws(rules, depth, Q_row, count, token, statuses)

    @staticmethod
    def _fallback_target(correction: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
        """The target of the fallback at depth tau+1 (unnormalised): SBV's correction r (a hook for negative
        controls)."""
        return correction

    def _fallback_inputs(self, terms, tau: int, count: int, token: int, statuses: list[str]):
        """(the fallback's target at depth tau+1 [V], unnormalised: the row SBV would draw its last token from;
        the candidates' draft laws there [n, V], float64)."""
        target = self._fallback_target(terms.correction_row(tau), terms.P_rows[tau])
        return target, self._candidate_laws(terms.rules, tau, terms.Q_rows[tau], count, token, statuses)

    # ------------------------------------------------------------------------------------------- sampler
    def _sample(self, draft_tokens, draft_probs, target_probs, generator, state) -> VerifyResult:
        decision = self._decide(draft_tokens, draft_probs, target_probs, generator)
        return self._complete(decision, draft_tokens, draft_probs, target_probs, generator)

    def paired_draw(self, draft_tokens, draft_probs, target_probs, generator=None) -> tuple[int, int]:
        """(this rule's number of accepted tokens, SBV's) on one draw, from one run: SBV with its default options
        (this rule's selection) is stages 1-2 of this sampler uniform for uniform (its stop depth tau is SBV's
        num_accepted; stage 3 draws only after them), so the replay's control variate (registry:
        ``shares_draws_with``) gets both draws of a seed for the price of one. Inputs are not validated."""
        decision = self._decide(draft_tokens, draft_probs, target_probs, generator)
        result = self._complete(decision, draft_tokens, draft_probs, target_probs, generator)
        return int(result.num_accepted), decision.tau

    def _complete(self, decision, draft_tokens, draft_probs, target_probs, generator) -> VerifyResult:
        """Stage 3 after SBV's decision: SBV's own last token, or the fallback over the candidates."""
        tau, tokens, L = decision.tau, decision.tokens, len(decision.path)
        if not self.fallback or tau == L:
            return self._finish(decision, target_probs)
        survivors = decision.survivors(tau)
        if all(tokens[row][tau] == decision.path[tau] for row in survivors):  # no candidate
            return self._finish(decision, target_probs)
        group = decision.groups.index((tau, decision.rows[tau]))
        accepted_draft = int(decision.accepted_draft[group])  # host read: the scan's outcome at the stop depth
        candidates = scan_statuses(survivors, tokens, tau, decision.path[tau], accepted_draft)
        target, first_laws = self._fallback_inputs(decision.terms, tau, len(survivors), decision.path[tau],
                                                   [status for _, status in candidates])
        device = draft_tokens.device
        return self._fallback(tokens, draft_tokens.long().to(draft_probs.device), draft_probs, target_probs,
                              [row for row, _ in candidates], first_laws, tau, decision.rows[L], target, generator,
                              decision.last_uniform, device)

    @staticmethod
    def _emit(prefix: list[int], law: torch.Tensor, row: int, last_uniform: torch.Tensor, device) -> VerifyResult:
        """The accepted prefix and one token from ``law`` (unnormalised [V]) with SBV's last uniform, which SBV
        would have spent on its own last token and nothing else reads (built on the device: no read)."""
        extra = inverse_cdf(law, last_uniform).to(device)
        out = torch.cat([torch.tensor(prefix, dtype=torch.long, device=device), extra])
        return VerifyResult(tokens=out, num_accepted=len(prefix), draft_index=row, state=None)

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

    def _fallback(self, tokens, token_tensor, draft_probs, target_probs, candidates: list[int],
                  first_laws: torch.Tensor, tau: int, row: int, target: torch.Tensor, generator, last_uniform,
                  device):
        """Recursive BV over the candidates (rbv.py) from depth tau with ``target`` there and ``first_laws[j]``
        as candidate j's draft law at depth tau+1.

        All candidates are scanned in one batch as if every earlier one stopped at depth tau (their targets
        then follow r_{j+1} = norm((r_j - g_j)+)); the first that accepts a token decides, and the scans of the
        later ones, made against targets that no longer apply, are discarded (their draws are independent of
        everything used). If that candidate stopped short of L, the remaining candidates that share its
        accepted prefix continue one by one, as in rbv.py.
        """
        L = len(tokens[0])
        targets, masses = _target_chain(target, first_laws[:-1])
        batch = _CandidateScan(tokens, draft_probs, target_probs, candidates, tau, targets, masses, first_laws)
        steps = batch.scan(generator)  # one read
        stopped = [j for j, step in enumerate(steps) if step > 0]
        if not stopped:  # every candidate stopped at once: the last residual r_{n+1}
            targets, masses = _target_chain(targets[-1], first_laws[-1:], masses[-1])
            return self._emit(tokens[row][:tau], _last_with_mass(targets, masses), row, last_uniform, device)
        j = stopped[0]
        owner, committed = candidates[j], tau + steps[j]
        if committed == L:
            return self._emit(tokens[owner], target_probs[owner, L], owner, last_uniform, device)
        current = batch.correction(j, steps[j])
        for candidate in candidates[j + 1:]:
            if tokens[candidate][:committed] != tokens[owner][:committed]:
                continue
            current = current.to(_F64) / current.sum(dtype=_F64)  # a segment's first target is a law
            segment = self._segment(token_tensor, draft_probs, target_probs, candidate, committed, current, None)
            step = segment.scan(generator)
            committed, owner = committed + step, candidate
            if committed == L:
                return self._emit(tokens[owner], target_probs[owner, L], owner, last_uniform, device)
            current = segment.correction(step)
        return self._emit(tokens[owner][:committed], current, owner, last_uniform, device)

    # ------------------------------------------------------------------------------------------- exact law
    def expected_emitted(self, draft_tokens, draft_probs, target_probs, state=None) -> torch.Tensor | None:
        """SBV's with ``fallback=False`` (the same rule); None otherwise: the fallback changes the law after an
        early stop, so SBV's expectation would be wrong, and no cheap closed form of the fallback's is known."""
        if not self.fallback:
            return super().expected_emitted(draft_tokens, draft_probs, target_probs, state)
        return None

    def expected_emitted_by_length(self, draft_tokens, draft_probs, target_probs, lengths, state=None):
        """SBV's (one walk for every length) with ``fallback=False``; None otherwise, as ``expected_emitted``."""
        if not self.fallback:
            return super().expected_emitted_by_length(draft_tokens, draft_probs, target_probs, lengths, state)
        return None

    def first_token_law(self, draft_tokens, draft_probs, target_probs):
        """SBV's with ``fallback=False``; None otherwise (the fallback re-verifies other drafts after a stop at
        depth 0, so SBV's first-token law would be wrong; callers count the rule's own draws)."""
        if not self.fallback:
            return super().first_token_law(draft_tokens, draft_probs, target_probs)
        return None

    def _law(self, draft_tokens, draft_probs, target_probs, state) -> list[Outcome]:
        if not self.fallback:
            return super()._law(draft_tokens, draft_probs, target_probs, state)
        tokens = draft_tokens.tolist()
        q_all, p_all = draft_probs.double(), target_probs.double()
        builder = LawBuilder()

        def leaf(walk: LawWalk, prob: float) -> None:
            key = ("terms", *walk.key(target_probs))
            stop_law, corrections = (self._memo("block_terms", key, lambda: self._block_terms(
                target_probs, draft_probs, walk)) if walk.toy else self._block_terms(target_probs, draft_probs, walk))
            L, path, row = len(walk.path), walk.path, walk.rows[-1]
            for tau in range(L, -1, -1):
                if stop_law[tau] <= 0:
                    continue
                if tau == L:
                    bonus = p_all[row, L]
                    builder.add(path, prob * stop_law[tau], bonus / bonus.sum())
                    continue
                candidates = scan_statuses(list(walk.survivors[tau]), tokens, tau, path[tau], walk.accepted_draft[tau])
                if not candidates:
                    builder.add(path[:tau], prob * stop_law[tau], corrections[tau])
                    continue
                terms = self._leaf_terms(target_probs, draft_probs, walk)
                target, first_laws = self._fallback_inputs(terms, tau, len(walk.survivors[tau]), path[tau],
                                                           [status for _, status in candidates])
                self._fallback_law(tokens, q_all, p_all, candidates, dict(zip((c for c, _ in candidates), first_laws)),
                                   tau, row, target.to(_F64) / target.sum(dtype=_F64), prob * stop_law[tau], builder)

        self._walk(draft_tokens, draft_probs, target_probs, leaf, by_draw=True)
        return builder.outcomes()

    def _fallback_law(self, tokens, q_all, p_all, candidates, first_laws, tau, row, target, mass, builder) -> None:
        """Recursive block verification over the candidates (rbv.py's law, first draft law g_j at depth tau+1)."""
        L = len(tokens[0])
        token_tensor = torch.tensor(tokens, device=q_all.device)

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
            segment = self._segment(token_tensor, q_all, p_all, candidate, committed, current, first_draft)
            for step, p_step in enumerate(segment.stop_law()):
                if p_step <= 0:
                    continue
                if committed + step == L:
                    bonus = p_all[candidate, L]
                    builder.add(tuple(tokens[candidate]), weight * p_step, bonus / bonus.sum())
                else:
                    visit(index + 1, committed + step, candidate, segment.correction(step), weight * p_step)

        visit(0, tau, row, target, mass)


def _target_chain(target: torch.Tensor, first_laws: torch.Tensor,
                  mass: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """rbv's targets for the candidates when every earlier one stops at once: r_1 = ``target`` (of mass ``mass``,
    default its sum), r_{j+1} = norm((r_j - g_j)+) for each law g_j of ``first_laws`` (one row more than
    those), kept unnormalised as (T, masses S) with r_j = T_j / S_j: T_{j+1} = (T_j - S_j g_j)+ (three ops a
    candidate, no division).

    A row without mass (r_j = g_j, exactly or to round-off) only arises where candidate j accepts its first token
    with probability 1, so the later rows are never used then; ``_last_with_mass`` guards the one place where
    they could be (every candidate stopping at once).
    """
    rows, masses = [target], [target.sum() if mass is None else mass]
    for law in first_laws:
        rows.append(torch.addcmul(rows[-1], law, masses[-1], value=-1.0).clamp_min_(0.0))
        masses.append(rows[-1].sum())
    return torch.stack(rows), torch.stack(masses)


def _last_with_mass(targets: torch.Tensor, masses: torch.Tensor) -> torch.Tensor:
    """The last row of the chain with positive mass (unnormalised [V]: what is emitted when no candidate
    accepts a token; in exact arithmetic that is the last row whenever this event has positive probability)."""
    last = (masses > 0).cumsum(0).argmax()  # the first index of the maximum cumulative count: the last True
    return targets.index_select(0, last.view(1))[0]


class _CandidateScan:
    """Block verification of several candidates at once from depth tau (rbv.py's segment, batched): candidate j
    has targets[j] / masses[j] as its target at depth tau+1 and first_laws[j] as its draft law there, p and q
    deeper."""

    def __init__(self, tokens: list[list[int]], draft_probs, target_probs, candidates: list[int], tau: int,
                 targets: torch.Tensor, masses: torch.Tensor, first_laws: torch.Tensor) -> None:
        L = draft_probs.shape[1]
        device = draft_probs.device
        rows = torch.tensor(candidates, device=device)
        self.tokens = torch.tensor([tokens[c][tau:] for c in candidates], device=device)  # [n, L - tau]
        # Rows tau..L-1 (p: the target of token tau+m+1, as given); row 0's p is replaced by the chain's target.
        self.p = target_probs[:, tau:L].index_select(0, rows)
        self.q = draft_probs[:, tau:].index_select(0, rows)
        first = self.tokens[:, :1]
        # r_j(x) / g_j(x) = T_j(x) / (S_j g_j(x)); a drawn token has g_j(x) > 0 where the candidate can exist, and
        # a row of the chain without mass (0/0) is never used (_target_chain): 0 keeps the arithmetic finite.
        ratio_first = (targets.gather(1, first) / (masses[:, None] * first_laws.gather(1, first))).nan_to_num(0.0)
        later = self.tokens[:, 1:, None]
        ratio_rest = (self.p[:, 1:].gather(2, later) / self.q[:, 1:].gather(2, later)).squeeze(2)
        # w[:, m - 1] = w_m for m = 1..positions (the cat promotes the later ratios to float64)
        self.w = running_ratio(torch.cat([ratio_first, ratio_rest], dim=1), with_start=False)

    def scan(self, generator) -> list[int]:
        """Each candidate's stop step (the largest m with eta_m < h_m, 0 if none), from one read."""
        n, positions = self.tokens.shape
        V = self.p.shape[-1]
        w = self.w
        # Z_m = sum (w_m p - q)+ for m = 1..positions-1, one pass over the rows: row 0 of each candidate (whose p
        # is replaced by the chain's target) gets scale 0, hence (0 - q)+ = 0, and the last w_positions is unused.
        scale = torch.nn.functional.pad(w[:, :-1], (1, 0))  # [n, positions]: 0, w_1 .. w_{positions-1}
        excess = excess_mass(self.p.view(-1, V), self.q.view(-1, V), scale.view(-1)).view(n, positions)
        h = stop_probability(excess, scale)  # column m: h_m for m = 1..positions-1 (column 0 unused)
        random_device = None if generator is not None else w.device
        eta = uniform(n * positions, generator, device=random_device).to(w.device).view(n, positions)
        # h_m at m < positions from Z_m, h_positions = w_positions: compare eta_m with column m of h (shifted).
        passed = (eta < torch.cat([h[:, 1:], w[:, -1:]], dim=1)).tolist()
        return [max([m + 1 for m, ok in enumerate(row) if ok], default=0) for row in passed]

    def correction(self, j: int, step: int) -> torch.Tensor:
        """Candidate j's correction after accepting ``step`` >= 1 tokens: (w p - q)+ at that depth, unnormalised
        (p where that has no mass), in the rows' dtype as BV computes it."""
        p = self.p[j, step]
        excess = (p * self.w[j, step - 1] - self.q[j, step]).clamp_min_(0.0)
        return torch.where(excess.sum() > 0, excess, p)
