"""SpecTr-GBV exactly as the authors released it (github junemily/SpecTr-GBV, src/engine.py), K drafts.

Replicated from METHODS.md and a reading of the released code (not copied). φ(a) = (1 − a)^K, eps = 1e-20.
For draft j = 0..K−1 in order, with τ the accepted length when draft j starts:
  (Q, P) start as the products of draft j's OWN first τ tokens (even if they differ from the accepted
  prefix); for i = τ+1..L−1 they are extended by token i, and with P_v = P·p(v|x^i), Q_v = Q·q(v|x^i),
  c_v = min(1, Q_v / (P_v + eps)), c = min(1, Q / (P + eps)):
      h = [Σ_v P_v φ(c_v) − P φ(c)] / (1 − (1−Q)^K − Σ_v P_v (1 − φ(c_v)) + eps);
  a uniform u is drawn, THEN the prefix x^i of draft j is skipped if it is in ``seen``; otherwise u < h
  accepts it (τ = i, selected = j, (Q, P) remembered) and u ≥ h adds it to ``seen``.
  At i = L (no ``seen`` test): h_L = P·(1 − φ(min(1, Q/(P + eps)))) / (1 − (1−Q)^K + eps); acceptance
  sets τ = L and ends the loop over drafts.
After the loop: τ < L gives a correction from r(v) ∝ P·p(v|x^τ)·(1 − min(1, Q·q(v|x^τ)/(P·p(v|x^τ) + eps))^K)
with the remembered (Q, P) of the selected draft (the release's operator precedence puts the power on
the min; (Q, P) = (1, 1) and draft 0 when nothing was accepted); τ = L gives a bonus from p(·|x^L).
No state is carried to the next iteration. Not lossless for K ≥ 2 (see tests/verify/test_spectr_gbv.py).

Deliberate differences from the release (none changes the rule in exact arithmetic):
  * the products P, Q and every per-prefix scalar are float64, and the vocabulary-wide terms are
    formed from p, q with coefficients (Q, P, eps)/max(Q, P, eps) ≤ 1 in the input dtype (float32 in
    the engine, float64 in the exact tests), so nothing underflows and eps keeps its value (the release
    works in the model dtype, float16 by default, where the products underflow and eps = 1e-20 rounds
    to 0); tests/verify/test_dtype_consistency.py checks the float32 law against the float64 one;
  * the sampler computes a draft's prefix tests only when the scan runs them (not for prefixes already
    rejected, nor for a draft whose full block passes); the uniforms are drawn exactly as released;
  * a correction residual with no mass (the release would crash in torch.multinomial) falls back to p;
  * uniforms come from the caller's generator.

``carry_over=True`` (not in the release) threads the carry-over target of
``spectr_repro.verify.carry_over`` with the residual of power K (the release's correction form), so the
correction is the first token drawn from the carried target. At K = 1, φ(a) = 1 − a and
1 − a^1 = 1 − a, so h, h_L and the correction reduce algebraically to GBV's (h = [Σ_v (P_v − Q_v)₊ −
(P − Q)₊] / Σ_v (Q_v − P_v)₊ = Z/(Z + 1 − g) with g = min(1, P/Q); h_L = min(P, Q)/Q = g_L; the correction
is (P·p − Q·q)₊), ``seen`` never triggers with one draft, and the power-1 frame is GBV's: the rule then
equals ``gbv`` (up to the eps guards, which only act on degenerate 0/0 inputs).

Shapes: draft_tokens [K, L], draft_probs [K, L, V], target_probs [K, L+1, V] (see verify.base).
"""

from __future__ import annotations

import math

import torch

from spectr_repro.verify.base import Outcome, Verifier, VerifyResult
from spectr_repro.verify.carry_over import effective_targets, integer_power, next_state, resolve_frames
from spectr_repro.verify.common import normalize, sample, uniform

EPS = 1e-20  # the release's guard on every division


class SpecTrGBV(Verifier):
    name = "spectr_gbv"
    lossless = False
    claimed_lossless = True
    single_draft = False

    def __init__(self, carry_over: bool = False, check_inputs: bool = True) -> None:
        super().__init__(check_inputs=check_inputs)
        self.carry_over = bool(carry_over)

    # --- the rule -------------------------------------------------------------------------------------

    def _block(self, draft_tokens, draft_probs, target_probs, state):
        """Effective targets and the joint products P, Q [K, L+1] float64 (column i: first i tokens).

        P and Q are products of up to L probabilities (they underflow float32 quickly): float64 scalars.
        """
        K, L = draft_tokens.shape
        frames = resolve_frames(state, L, self.name, self.carry_over)
        effective = effective_targets(draft_tokens, draft_probs, target_probs, frames)
        ones = torch.ones(K, 1, dtype=torch.float64, device=effective.token_target.device)
        P = torch.cat([ones, torch.cumprod(effective.token_target, 1)], 1)
        Q = torch.cat([ones, torch.cumprod(effective.token_draft, 1)], 1)
        return effective, P, Q

    @staticmethod
    def _full_block_h(P, Q, K: int) -> torch.Tensor:
        """h of each draft's full block [K] (float64): P·(1 − φ(min(1, Q/P))) / (1 − φ(Q))."""
        P_L, Q_L = P[:, -1], Q[:, -1]
        c_full = torch.clamp(Q_L / (P_L + EPS), max=1)
        return P_L * (1 - (1 - c_full) ** K) / (1 - (1 - Q_L) ** K + EPS)

    def _prefix_h(self, target_rows, draft_rows, P, Q, K: int) -> torch.Tensor:
        """h of prefixes from their rows: target_rows, draft_rows [n, V] = p, q after each prefix;
        P, Q [n] float64 = the prefix products. Returns [n] float64.

        With P_v = P·p_v, Q_v = Q·q_v and S = Σ_v p_v φ(c_v):  Σ_v P_v φ(c_v) = P·S and
        Σ_v P_v (1 − φ(c_v)) = P·(Σ_v p_v − S), so only S and Σ_v p_v need the vocabulary.
        c_v = Q_v/(P_v + eps) = a·q_v/(b·p_v + e) with (a, b, e) = (Q, P, eps)/max(Q, P, eps) ≤ 1: the
        long products never enter the input dtype, e ≥ 1e−20 keeps every denominator positive, and a
        coefficient that rounds to 0 in float32 (< 1e−45 times the largest) changes c_v only where it
        is < 1e−25 or p_v is negligible. 1 − c_v is formed as max(0, (b·p_v + e − a·q_v)/(b·p_v + e)).
        """
        scale = torch.stack([Q, P, torch.full_like(P, EPS)]).amax(0)
        a, b, e = ((x / scale).to(target_rows.dtype).unsqueeze(-1) for x in (Q, P, torch.full_like(P, EPS)))
        n, V = target_rows.shape
        denominator, one_minus_c = self._buffers(n, V, target_rows.dtype, target_rows.device)
        torch.mul(target_rows, b, out=denominator).add_(e)  # b·p + e (addcmul broadcasting e is ~3x slower)
        torch.addcmul(denominator, draft_rows, a, value=-1, out=one_minus_c).div_(denominator).clamp_(min=0)
        phi = integer_power(one_minus_c, K, out=denominator)  # φ(c_v) = (1 − c_v)^K
        S = phi.mul_(target_rows).sum(-1).double()  # in place: φ's buffer is not needed after this
        sum_p = target_rows.sum(-1).double()
        c = torch.clamp(Q / (P + EPS), max=1)
        numerator = P * (S - (1 - c) ** K)
        denominator_h = 1 - (1 - Q) ** K - P * (sum_p - S)
        return numerator / (denominator_h + EPS)

    def _buffers(self, n: int, V: int, dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
        """Two scratch tensors [n, V], kept between calls (the engine calls once per iteration with the
        same shapes): writing into warm memory is several times faster than into fresh allocations."""
        cached = getattr(self, "_scratch", None)
        if cached is None or cached.dtype != dtype or cached.device != device or cached.shape[1] < n * V:
            cached = torch.empty(2, max(n * V, 1), dtype=dtype, device=device)
            self._scratch = cached
        return cached[0, : n * V].view(n, V), cached[1, : n * V].view(n, V)

    def _draft_prefix_h(self, effective, draft_probs, P, Q, j: int, positions: list[int],
                        K: int) -> list[float]:
        """h of draft j's prefixes of lengths i + 1 for i in ``positions`` (increasing), as floats."""
        rows = [i + 1 for i in positions]
        target_rows = effective.rows(j, rows)
        lo, hi = rows[0], rows[-1] + 1
        draft_rows = draft_probs[j, lo:hi] if hi - lo == len(rows) else draft_probs[j, rows]
        index = torch.tensor(rows, device=P.device)
        return self._prefix_h(target_rows, draft_rows, P[j, index], Q[j, index], K).tolist()

    def _h_table(self, effective, draft_probs, P, Q, K: int, L: int) -> list[list[float]]:
        """The whole table h[j][i] (prefix length i + 1), for the exact law."""
        h_last = self._full_block_h(P, Q, K).tolist()
        table = []
        for j in range(K):
            inner = (self._draft_prefix_h(effective, draft_probs, P, Q, j, list(range(L - 1)), K)
                     if L > 1 else [])
            table.append(inner + [h_last[j]])
        return table

    @staticmethod
    def _correction_weights(target_rows, draft_rows, P, Q, K: int):
        """Unnormalised correction [..., V]: P·p·(1 − min(1, Q·q/(P·p + eps))^K) / max(Q, P, eps).

        The power on the min, as released. Same rescaling as ``_prefix_h``: the rows stay in their dtype.
        """
        scale = torch.stack([Q, P, torch.full_like(P, EPS)]).amax(0)
        dtype = target_rows.dtype
        a, b, e = ((x / scale).to(dtype).unsqueeze(-1) for x in (Q, P, torch.full_like(P, EPS)))
        P_v = torch.mul(target_rows, b)
        c = torch.mul(draft_rows, a).div_(P_v + e).clamp_(max=1)
        return P_v.addcmul_(P_v, integer_power(c, K), value=-1)  # P_v·(1 − c^K)

    @classmethod
    def _correction_law(cls, target_rows, draft_rows, P, Q, K: int):
        """Correction law(s) [..., V] from rows [..., V] and the selected draft's P, Q [...]."""
        return normalize(cls._correction_weights(target_rows, draft_rows, P, Q, K), fallback=target_rows)

    def _state_after(self, effective, draft_probs, target_probs, P, Q, selected, tau, last_token, K, L):
        if not self.carry_over:
            return None
        new_frame = None
        if tau < L:
            num = float(P[selected, tau]) * float(effective.row(selected, tau)[last_token])
            den = float(Q[selected, tau]) * float(draft_probs[selected, tau, last_token])
            new_frame = (math.log(num) if num > 0 else -math.inf) - (math.log(den) if den > 0 else -math.inf)
        return next_state(effective, draft_probs, target_probs, selected, tau, last_token, new_frame, K, L)

    def _sample(self, draft_tokens, draft_probs, target_probs, generator, state) -> VerifyResult:
        K, L = draft_tokens.shape
        effective, P, Q = self._block(draft_tokens, draft_probs, target_probs, state)
        h_last = self._full_block_h(P, Q, K).tolist()
        drafts = draft_tokens.tolist()
        # One uniform per test slot (j, i); the release draws it before the `seen` test.
        draws = uniform(K * L, generator, device=None if generator is not None else P.device).tolist()
        tau, selected = 0, 0
        seen: set[tuple[int, ...]] = set()
        for j in range(K):
            if draws[j * L + L - 1] < h_last[j]:
                # The full block passes: draft j's prefix tests cannot change the outcome, skip their h.
                tau, selected = L, j
                break
            # The tests draft j runs are fixed when it starts: i from τ up, prefixes not yet rejected
            # (its own rejections are shorter than its later prefixes, so they never skip one of them).
            positions = [i for i in range(tau, L - 1) if tuple(drafts[j][: i + 1]) not in seen]
            if not positions:
                continue
            h_j = self._draft_prefix_h(effective, draft_probs, P, Q, j, positions, K)
            for i, h_i in zip(positions, h_j):
                if draws[j * L + i] < h_i:
                    tau, selected = i + 1, j
                else:
                    seen.add(tuple(drafts[j][: i + 1]))
        if tau == L:
            last_weights = effective.row(selected, L)
        else:
            target_row = effective.row(selected, tau)
            last_weights = self._correction_weights(target_row, draft_probs[selected, tau], P[selected, tau],
                                                    Q[selected, tau], K)
            if not bool(last_weights.sum() > 0):  # no residual mass (a probability-0 event): fall back to p
                last_weights = target_row
        last_token = int(sample(last_weights, generator))  # sample needs no normalising
        tokens = torch.cat([draft_tokens[selected, :tau].long(),
                            torch.tensor([last_token], dtype=torch.long, device=draft_tokens.device)])
        new_state = self._state_after(effective, draft_probs, target_probs, P, Q, selected, tau, last_token,
                                      K, L)
        return VerifyResult(tokens, tau, selected, new_state)

    def _scan_law(self, drafts: list[list[int]], h_table: list[list[float]], K: int, L: int) -> dict:
        """Exact law of (τ, selected) after the scan: a dynamic programme over (τ, selected, seen)."""

        def accept_probability(value: float) -> float:
            return 0.0 if value != value else min(1.0, max(0.0, value))  # P(u < h), NaN never accepts

        finished: dict[tuple[int, int], float] = {}
        states: dict[tuple[int, int, frozenset], float] = {(0, 0, frozenset()): 1.0}
        for j in range(K):
            following: dict[tuple[int, int, frozenset], float] = {}
            for (tau_start, sel_start, seen_start), weight in states.items():
                branches = [(tau_start, sel_start, seen_start, weight)]
                for i in range(tau_start, L - 1):
                    prefix = tuple(drafts[j][: i + 1])
                    a = accept_probability(h_table[j][i])
                    grown = []
                    for tau, sel, seen, w in branches:
                        if prefix in seen:
                            grown.append((tau, sel, seen, w))
                            continue
                        if a > 0:
                            grown.append((i + 1, j, seen, w * a))
                        if a < 1:
                            grown.append((tau, sel, seen | {prefix}, w * (1 - a)))
                    branches = grown
                a_full = accept_probability(h_table[j][L - 1])
                for tau, sel, seen, w in branches:
                    if a_full > 0:
                        finished[(L, j)] = finished.get((L, j), 0.0) + w * a_full
                    if a_full < 1:
                        key = (tau, sel, seen)
                        following[key] = following.get(key, 0.0) + w * (1 - a_full)
            states = following
        for (tau, sel, _), weight in states.items():
            finished[(tau, sel)] = finished.get((tau, sel), 0.0) + weight
        return finished

    def _law(self, draft_tokens, draft_probs, target_probs, state) -> list[Outcome]:
        K, L = draft_tokens.shape
        effective, P, Q = self._block(draft_tokens, draft_probs, target_probs, state)
        drafts = [[int(t) for t in row] for row in draft_tokens.tolist()]
        # Every possible last-token law at once: corrections after τ < L tokens, bonus after L.
        target = effective.probs
        corrections = self._correction_law(target[:, :L], draft_probs, P[:, :L], Q[:, :L], K)
        last_laws = torch.cat([corrections, target[:, L:].to(corrections.dtype)], 1).double().tolist()
        merged: dict = {}
        h_table = self._h_table(effective, draft_probs, P, Q, K, L)
        for (tau, selected), weight in self._scan_law(drafts, h_table, K, L).items():
            if weight <= 0:
                continue
            for last_token, p_last in enumerate(last_laws[selected][tau]):
                if p_last <= 0:
                    continue
                tokens = tuple(drafts[selected][:tau]) + (last_token,)
                new_state = self._state_after(effective, draft_probs, target_probs, P, Q, selected, tau,
                                              last_token, K, L)
                key = (tokens, new_state)
                merged[key] = merged.get(key, 0.0) + weight * p_last
        return [Outcome(p, tokens, st) for (tokens, st), p in merged.items()]
