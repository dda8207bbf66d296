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

GPU cost: the carried frames are applied one frame at a time to all their rows at once (no loop over rows,
no host read); the sampler reads g and its uniforms once, the Z_i of the positions whose test can pass
once, and the next state's numbers once: at most three host reads per call, with any number of frames.

Shapes: draft_tokens [1, L], draft_probs [1, L, V], target_probs [1, L+1, V] (see verify.base).
"""

from __future__ import annotations

import torch

from spectr_repro.verify.base import Outcome, Verifier, VerifyResult
from spectr_repro.verify.bv import backward_scan
from spectr_repro.verify.carry_over import (
    EffectiveTargets,
    effective_targets,
    next_state,
    residual_weights,
    resolve_frames,
)
from spectr_repro.verify.common import (
    clipped_stop_probability,
    expected_emitted_from_stops,
    normalize,
    sample,
    uniform,
)


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
        """Effective targets, log P/Q after each prefix ([L+1] float64) and g = min(1, P/Q) ([L+1])."""
        K, L = draft_tokens.shape
        if K != 1:
            raise ValueError(f"{self.name} verifies a single draft; got K={K}")
        frames = resolve_frames(state, L, self.name, self.carry_over)
        effective = effective_targets(draft_tokens, draft_probs, target_probs, frames)
        # P and Q are products of up to L probabilities: their ratio lives in float64 log space.
        log_steps = torch.log(effective.token_target[0]) - torch.log(effective.token_draft[0])
        log_ratio = torch.cat([log_steps.new_zeros(1), torch.cumsum(log_steps, 0)])  # [L+1]
        g = torch.exp(log_ratio.clamp(max=0))
        return effective, log_ratio, g

    @staticmethod
    def _stop_probabilities(effective: EffectiveTargets, draft_probs, g, positions: list[int]) -> list[float]:
        """h_i for the positions 0 < i < L given (increasing, each with g_i < 1), as floats.

        Z_i = Σ_x (g_i·p − q)₊ is the rule's only full-vocabulary work; it runs in the input dtype (an
        ordinary sum of probability-sized terms, no long products). In exact arithmetic Z_i ≤ g_i, hence
        h_i ≤ g_i; h is clipped to g so that the sampler may skip every position with η_i ≥ g_i and
        still agree bit for bit with the law.
        """
        target = effective.rows(0, positions)
        index = torch.tensor(positions, device=g.device)
        scale = g[index].to(target.dtype).unsqueeze(-1)
        draft = draft_probs[0, positions[0] : positions[-1] + 1] if positions[-1] - positions[0] + 1 == len(
            positions) else draft_probs[0, index.to(draft_probs.device)]
        # One fresh buffer, then in place: never modify the caller's rows.
        z = torch.mul(target, scale).sub_(draft).clamp_(min=0).sum(-1).double()
        g_at = g[index]
        h = clipped_stop_probability(z, g_at)  # 1 − g_i > 0 here
        return h.tolist()

    def _all_stop_probabilities(self, effective, draft_probs, g, L: int) -> list[float]:
        """h_0..h_L: h_0 = 1, h_i = 1 when g_i = 1, h_L = g_L (for the exact law)."""
        g_values = g.tolist()
        h = [1.0] * (L + 1)
        h[L] = g_values[L]
        positions = [i for i in range(1, L) if g_values[i] < 1]
        if positions:
            for i, h_i in zip(positions, self._stop_probabilities(effective, draft_probs, g, positions)):
                h[i] = h_i
        return h

    def _correction_weights(self, target_row: torch.Tensor, draft_row: torch.Tensor, log_ratio: torch.Tensor):
        """(P·p − Q·q)₊ up to the factor 1/max(P, Q): the unclipped joint ratio r = P/Q.

        target_row, draft_row: [..., V]; log_ratio: [...] = log P − log Q (float64). The two coefficients
        are at most 1 and computed in float64; the rows stay in their dtype (see carry_over.residual_weights
        for why a coefficient rounding to 0 in float32 is harmless).
        """
        return residual_weights(target_row, draft_row, log_ratio, 1)

    def _correction_law(self, target_rows, draft_rows, log_ratio):
        """norm((P·p − Q·q)₊) per row [..., V]; no residual mass (a probability-0 event) falls back to p."""
        return normalize(self._correction_weights(target_rows, draft_rows, log_ratio), fallback=target_rows)

    def _sample_last_token(self, effective: EffectiveTargets, draft_probs, log_ratio, tau: int, L: int,
                           generator) -> torch.Tensor:
        """The token emitted after X^τ ([1], on the device): a correction if τ < L, else the bonus."""
        if tau == L:
            return sample(effective.row(0, L), generator).view(1)
        target_row = effective.row(0, tau)
        weights = self._correction_weights(target_row, draft_probs[0, tau], log_ratio[tau])
        # No residual mass (a probability-0 event): fall back to p, by arithmetic on the device (no branch;
        # a broadcast torch.where over V is ~5x slower on CPU).
        weights = torch.addcmul(weights, target_row, weights.sum() <= 0)
        return sample(weights, generator).view(1)  # sample needs no normalising

    def _state_after(self, effective, draft_probs, target_probs, log_ratio, tau: int,
                     last_token: int | torch.Tensor, L: int):
        if not self.carry_over:
            return None
        new_frame = None
        if tau < L:
            # The new frame's P, Q run through the correction token: P·T(c), Q·q(c) (float64, on the device).
            token = torch.as_tensor(last_token, device=log_ratio.device).reshape(1)
            target_at = effective.row(0, tau).gather(0, token).double()
            draft_at = draft_probs[0, tau].gather(0, token).double()
            new_frame = log_ratio[tau] + target_at.log() - draft_at.log()
        return next_state(effective, draft_probs, target_probs, 0, tau, last_token, new_frame, 1, L)

    def _scan(self, effective, draft_probs, g, g_values: list[float], eta: list[float], L: int) -> int:
        """τ = the largest i with η_i < h_i, computing Z_i only where the test can pass.

        η_L < g_L: the whole block passes, no vocabulary work. Otherwise the largest i < L with g_i = 1
        (h_i = 1; i = 0 at worst) is a floor the scan never goes below, and above it h_i ≤ g_i rules out
        every position with η_i ≥ g_i: Z is needed only for the remaining candidates (one batched pass,
        one host read). eta[i − 1] belongs to position i; g_values = g on the host.
        """
        return backward_scan(eta, g_values[: L + 1],
                             lambda positions: self._stop_probabilities(effective, draft_probs, g, positions))

    def _sample(self, draft_tokens, draft_probs, target_probs, generator, state) -> VerifyResult:
        L = draft_tokens.shape[1]
        effective, log_ratio, g = self._block(draft_tokens, draft_probs, target_probs, state)
        eta = uniform(L, generator, device=None if generator is not None else g.device).to(g.device)
        host = torch.cat([g, eta]).tolist()  # one host read: g_0..g_L and the uniforms
        tau = self._scan(effective, draft_probs, g, host[: L + 1], host[L + 1 :], L)
        last_token = self._sample_last_token(effective, draft_probs, log_ratio, tau, L, generator)
        tokens = torch.cat([draft_tokens[0, :tau].long().to(last_token.device), last_token])
        new_state = self._state_after(effective, draft_probs, target_probs, log_ratio, tau, last_token, L)
        return VerifyResult(tokens, tau, 0, new_state)

    def expected_emitted(self, draft_tokens, draft_probs, target_probs, state=None) -> torch.Tensor:
        """From h_1..h_L on the device (the effective targets of ``state``; None: a fresh iteration)."""
        L = draft_tokens.shape[1]
        effective, _, g = self._block(draft_tokens, draft_probs, target_probs, state)
        h_last = g[L:]
        if L == 1:
            return expected_emitted_from_stops(h_last)
        inner = g[1:L]
        target = effective.rows(0, list(range(1, L)))
        z = torch.mul(target, inner.to(target.dtype).unsqueeze(-1)).sub_(draft_probs[0, 1:L]).clamp_(min=0).sum(-1)
        h = clipped_stop_probability(z.double(), inner)  # 1 where g = 1, as in the sampler
        return expected_emitted_from_stops(torch.cat([h, h_last]))

    def _law(self, draft_tokens, draft_probs, target_probs, state) -> list[Outcome]:
        L = draft_tokens.shape[1]
        effective, log_ratio, g = self._block(draft_tokens, draft_probs, target_probs, state)
        h_values = self._all_stop_probabilities(effective, draft_probs, g, L)
        prefix = [int(t) for t in draft_tokens[0].tolist()]
        # Every possible last-token law at once: corrections after τ < L tokens, bonus after L.
        target = effective.probs[0]
        corrections = self._correction_law(target[:L], draft_probs[0], log_ratio[:L])
        last_laws = torch.cat([corrections, target[L:]]).double().tolist()  # [L+1][V]
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
