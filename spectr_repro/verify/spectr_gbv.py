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
  * everything is computed in float64 (the release works in the model dtype, float16 by default, where
    the products underflow and eps = 1e-20 rounds to 0);
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
from spectr_repro.verify.carry_over import check_state, effective_targets, next_state
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
        """Effective targets, joint products P, Q [K, L+1] (column i: first i tokens) and h [K, L].

        h[j, i] is the acceptance probability of draft j's prefix of length i+1; it does not depend on the
        scan's decisions, so the whole table is computed at once.
        """
        K, L = draft_tokens.shape
        if self.carry_over:
            frames = check_state(state, L, self.name)
        elif state is not None:
            raise ValueError(f"{self.name}: carry_over=False takes no state, got {type(state).__name__}")
        else:
            frames = ()
        effective = effective_targets(draft_tokens, draft_probs, target_probs, frames)
        target = effective.probs  # [K, L+1, V], input dtype; float64 from here on
        token = draft_tokens.long().unsqueeze(-1)
        ones = torch.ones(K, 1, dtype=torch.float64, device=target.device)
        P = torch.cat([ones, torch.cumprod(target[:, :L].gather(-1, token).squeeze(-1).double(), 1)], 1)
        Q = torch.cat([ones, torch.cumprod(draft_probs.gather(-1, token).squeeze(-1).double(), 1)], 1)

        def phi(a):
            return (1 - a) ** K

        h = torch.empty(K, L, dtype=torch.float64, device=target.device)
        if L > 1:
            P_i, Q_i = P[:, 1:L], Q[:, 1:L]  # [K, L-1]: prefixes of length 1..L-1
            # In-place float64 passes over [K, L-1, V]: this is the rule's only full-vocabulary work.
            # Copies (copy=True): the caller's tensors are never modified.
            P_v = target[:, 1:L].to(torch.float64, copy=True).mul_(P_i.unsqueeze(-1))
            sum_P_v = P_v.sum(-1)
            phi_v = draft_probs[:, 1:L].to(torch.float64, copy=True).mul_(Q_i.unsqueeze(-1))
            phi_v.div_(P_v + EPS).clamp_(max=1)  # c_v
            phi_v.neg_().add_(1).pow_(K)  # φ(c_v)
            sum_P_v_phi = torch.linalg.vecdot(P_v, phi_v)
            c = torch.clamp(Q_i / (P_i + EPS), max=1)
            numerator = sum_P_v_phi - P_i * phi(c)
            # Σ_v P_v (1 − φ(c_v)) written as Σ_v P_v − Σ_v P_v φ(c_v): one pass less, same value.
            denominator = 1 - phi(Q_i) - (sum_P_v - sum_P_v_phi)
            h[:, : L - 1] = numerator / (denominator + EPS)
        c_full = torch.clamp(Q[:, L] / (P[:, L] + EPS), max=1)
        h[:, L - 1] = P[:, L] * (1 - phi(c_full)) / (1 - phi(Q[:, L]) + EPS)
        return effective, P, Q, h

    @staticmethod
    def _correction_law(target_rows, draft_rows, P, Q, K: int):
        """Correction law(s) [..., V] (float64) from rows [..., V] and the selected draft's P, Q [...]."""
        target_rows = target_rows.double()
        P_v = P.unsqueeze(-1) * target_rows
        ratio = torch.clamp(Q.unsqueeze(-1) * draft_rows.double() / (P_v + EPS), max=1)
        weights = P_v * (1 - ratio**K)  # the power on the min, as released
        return normalize(weights, fallback=target_rows)

    def _last_token_law(self, effective, draft_probs, P, Q, selected: int, tau: int, K: int, L: int):
        """Law [V] (float64) of the token after the selected draft's first τ tokens."""
        if tau == L:
            return effective.probs[selected, L].double()
        return self._correction_law(effective.probs[selected, tau], draft_probs[selected, tau],
                                    P[selected, tau], Q[selected, tau], K)

    def _state_after(self, effective, draft_probs, target_probs, P, Q, selected, tau, last_token, K, L):
        if not self.carry_over:
            return None
        new_frame = None
        if tau < L:
            num = float(P[selected, tau]) * float(effective.probs[selected, tau, last_token])
            den = float(Q[selected, tau]) * float(draft_probs[selected, tau, last_token])
            new_frame = (math.log(num) if num > 0 else -math.inf) - (math.log(den) if den > 0 else -math.inf)
        return next_state(effective, draft_probs, target_probs, selected, tau, last_token, new_frame, K, L)

    def _sample(self, draft_tokens, draft_probs, target_probs, generator, state) -> VerifyResult:
        K, L = draft_tokens.shape
        effective, P, Q, h = self._block(draft_tokens, draft_probs, target_probs, state)
        h_table = h.tolist()
        drafts = draft_tokens.tolist()
        # One uniform per test slot (j, i); the release draws it before the `seen` test.
        draws = uniform(K * L, generator, device=None if generator is not None else h.device).tolist()
        tau, selected = 0, 0
        seen: set[tuple[int, ...]] = set()
        for j in range(K):
            for i in range(tau, L - 1):  # the range is fixed when draft j starts
                prefix = tuple(drafts[j][: i + 1])
                if prefix in seen:
                    continue
                if draws[j * L + i] < h_table[j][i]:
                    tau, selected = i + 1, j
                else:
                    seen.add(prefix)
            if draws[j * L + L - 1] < h_table[j][L - 1]:
                tau, selected = L, j
                break
        last_law = self._last_token_law(effective, draft_probs, P, Q, selected, tau, K, L)
        last_token = int(sample(last_law, generator))
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
        effective, P, Q, h = self._block(draft_tokens, draft_probs, target_probs, state)
        drafts = [[int(t) for t in row] for row in draft_tokens.tolist()]
        # Every possible last-token law at once: corrections after τ < L tokens, bonus after L.
        corrections = self._correction_law(effective.probs[:, :L], draft_probs, P[:, :L], Q[:, :L], K)
        last_laws = torch.cat([corrections, effective.probs[:, L:].double()], 1).tolist()  # [K][L+1][V]
        merged: dict = {}
        for (tau, selected), weight in self._scan_law(drafts, h.tolist(), K, L).items():
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
