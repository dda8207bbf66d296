"""GBV — greedy block verification (the K = 1 case of SpecTr-GBV), single draft.

With P(x^i), Q(x^i) the products of the (effective) target and draft conditionals since the iteration
began and g_i = min(1, P(X^i)/Q(X^i)) (the *joint* ratio, not BV's running clipped one):
    h_0 = 1;  h_i = Z_i / (Z_i + 1 − g_i), Z_i = Σ_x (g_i·p(x|X^i) − q(x|X^i))₊ (h_i = 1 if g_i = 1), i < L;
    h_L = g_L;  τ = the largest i with η_i < h_i (η_i ~ U(0,1) i.i.d.).
Emit X^τ, then a correction from norm((P(X^τ)·p(·|X^τ) − Q(X^τ)·q(·|X^τ))₊) — the UNCLIPPED ratio — when
τ < L, or a bonus from p(·|X^L) when τ = L. Per iteration E[τ] = Σ_i Σ_{x^i} min(P(x^i), Q(x^i)).

GBV is not lossless on its own. ``carry_over=True`` (default) threads the carry-over target of
``spectr_repro.verify.carry_over`` through ``state``: the caller passes the RAW next-iteration p and q
with the returned state, and the rule uses the effective target everywhere (acceptance, correction,
bonus). Exact enumeration shows the decoded law then equals the target's. ``carry_over=False`` is the
authors' release at K = 1: no state, not lossless.

Shapes: draft_tokens [1, L], draft_probs [1, L, V], target_probs [1, L+1, V] (see verify.base).
"""

from __future__ import annotations

import torch

from spectr_repro.verify.base import Outcome, Verifier, VerifyResult
from spectr_repro.verify.carry_over import EffectiveTargets, check_state, effective_targets, next_state
from spectr_repro.verify.common import normalize, sample, uniform


class GreedyBlockVerification(Verifier):
    name = "gbv"
    claimed_lossless = True
    single_draft = True

    def __init__(self, carry_over: bool = True, check_inputs: bool = True) -> None:
        super().__init__(check_inputs=check_inputs)
        self.carry_over = bool(carry_over)
        self.lossless = self.carry_over  # exact tests: lossless with the carry-over, biased without

    # --- the rule -------------------------------------------------------------------------------------

    def _block(self, draft_tokens, draft_probs, target_probs, state):
        """Effective targets, log P/Q after each prefix ([L+1] float64) and the h_i ([L+1] float64)."""
        K, L = draft_tokens.shape
        if K != 1:
            raise ValueError(f"{self.name} verifies a single draft; got K={K}")
        if self.carry_over:
            frames = check_state(state, L, self.name)
        elif state is not None:
            raise ValueError(f"{self.name}: carry_over=False takes no state, got {type(state).__name__}")
        else:
            frames = ()
        effective = effective_targets(draft_tokens, draft_probs, target_probs, frames)
        target, draft = effective.probs[0], draft_probs[0]  # [L+1, V], [L, V]
        token = draft_tokens[0].long().unsqueeze(-1)
        log_steps = torch.log(target[:L].gather(-1, token).squeeze(-1).double()) - torch.log(
            draft.gather(-1, token).squeeze(-1).double())
        log_ratio = torch.cat([log_steps.new_zeros(1), torch.cumsum(log_steps, 0)])  # [L+1]
        g = torch.exp(log_ratio.clamp(max=0))
        h = torch.empty(L + 1, dtype=torch.float64, device=target.device)
        h[0] = 1.0
        h[L] = g[L]
        if L > 1:
            # Z_i = Σ_x (g_i·p − q)₊ in float64, in place: the rule's only full-vocabulary pass.
            z = target[1:L].to(torch.float64, copy=True)  # a copy: never modify the caller's tensor
            z = z.mul_(g[1:L].unsqueeze(-1)).sub_(draft[1:L]).clamp_(min=0).sum(-1)
            # 0/0 only when g_i = 1 and Z_i = 0; with g_i = 1 the rule accepts (h_i = 1) anyway.
            h[1:L] = torch.where(g[1:L] >= 1, torch.ones_like(z), z / (z + 1 - g[1:L]).clamp_min(1e-300))
        return effective, log_ratio, h

    def _correction_weights(self, target_row: torch.Tensor, draft_row: torch.Tensor, log_ratio: torch.Tensor):
        """(P·p − Q·q)₊ up to the factor 1/max(P, Q): the unclipped joint ratio r = P/Q.

        target_row, draft_row: [..., V]; log_ratio: [...] = log P − log Q (float64).
        """
        log_ratio = log_ratio.unsqueeze(-1)
        scale_target = torch.exp(log_ratio.clamp(max=0))
        scale_draft = torch.exp((-log_ratio).clamp(max=0))
        return (scale_target * target_row - scale_draft * draft_row).clamp_min(0)

    def _correction_law(self, target_rows, draft_rows, log_ratio):
        """norm((P·p − Q·q)₊) per row [..., V]; no residual mass (a probability-0 event) falls back to p."""
        return normalize(self._correction_weights(target_rows, draft_rows, log_ratio), fallback=target_rows)

    def _last_token_law(self, effective: EffectiveTargets, draft_probs, log_ratio, tau: int, L: int):
        """Law [V] of the token emitted after X^τ: the correction if τ < L, else the bonus."""
        if tau == L:
            return effective.probs[0, L]
        return self._correction_law(effective.probs[0, tau], draft_probs[0, tau], log_ratio[tau])

    def _state_after(self, effective, draft_probs, target_probs, log_ratio, tau: int, last_token: int,
                     L: int):
        if not self.carry_over:
            return None
        new_frame = None
        if tau < L:
            # The new frame's P, Q run through the correction token: P·T(c), Q·q(c).
            step = torch.log(effective.probs[0, tau, last_token].double()) - torch.log(
                draft_probs[0, tau, last_token].double())
            new_frame = float(log_ratio[tau] + step)
        return next_state(effective, draft_probs, target_probs, 0, tau, last_token, new_frame, 1, L)

    def _sample(self, draft_tokens, draft_probs, target_probs, generator, state) -> VerifyResult:
        L = draft_tokens.shape[1]
        effective, log_ratio, h = self._block(draft_tokens, draft_probs, target_probs, state)
        eta = uniform(L, generator, device=None if generator is not None else h.device).to(h.device)
        positions = torch.arange(1, L + 1, device=h.device)
        tau = int(torch.where(eta < h[1:], positions, 0).max())  # the largest i with η_i < h_i, else 0
        last_law = self._last_token_law(effective, draft_probs, log_ratio, tau, L)
        last_token = int(sample(last_law, generator))
        tokens = torch.cat([draft_tokens[0, :tau].long(),
                            torch.tensor([last_token], dtype=torch.long, device=draft_tokens.device)])
        new_state = self._state_after(effective, draft_probs, target_probs, log_ratio, tau, last_token, L)
        return VerifyResult(tokens, tau, 0, new_state)

    def _law(self, draft_tokens, draft_probs, target_probs, state) -> list[Outcome]:
        L = draft_tokens.shape[1]
        effective, log_ratio, h = self._block(draft_tokens, draft_probs, target_probs, state)
        h_values = h.tolist()
        prefix = [int(t) for t in draft_tokens[0].tolist()]
        # Every possible last-token law at once: corrections after τ < L tokens, bonus after L.
        corrections = self._correction_law(effective.probs[0, :L], draft_probs[0], log_ratio[:L])
        last_laws = torch.cat([corrections, effective.probs[0, L:]]).double().tolist()  # [L+1][V]
        outcomes = []
        for tau in range(L + 1):
            # τ = i: η_i < h_i and every later test fails (h_0 = 1: τ = 0 when all fail).
            p_tau = h_values[tau]
            for later in h_values[tau + 1 :]:
                p_tau *= 1 - later
            if p_tau <= 0:
                continue
            for last_token, p_last in enumerate(last_laws[tau]):
                if p_last > 0:
                    new_state = self._state_after(effective, draft_probs, target_probs, log_ratio, tau,
                                                  last_token, L)
                    outcomes.append(Outcome(p_tau * p_last, tuple(prefix[:tau]) + (last_token,), new_state))
        return outcomes
