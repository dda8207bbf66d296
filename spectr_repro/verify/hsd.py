"""HSD: hierarchical speculative decoding (Zhou, Huang, Li, Wu, Wang, Zhang, Lin, Cheng; arXiv 2601.05724,
ICLR 2026), single draft, as its authors released it (github ZhouYuxuanYX/Hierarchical-Speculative-Decoding).

Shapes: draft_tokens [1, L], draft_probs [1, L, V] (q), target_probs [1, L+1, V] (p).

P(X^i), Q(X^i) are the products of the target's and the draft's conditionals of the first i draft tokens,
r_i = P(X^i) / Q(X^i) (r_0 = 1) the joint ratio. At each depth i < L the rule compares the target's *capped*
joint mass of the branches X^i·x, s_i·Q(X^i)·p(x | X^i), with the draft's, Q(X^i)·q(x | X^i):

    s_i = r_i / max(1, r_1, ..., r_i)   (cap="running_max": the release's GSM8K path; equal to BV's w_i)
    s_i = min(1, r_i)                   (cap="joint_min": the release's EAGLE-3H path, and GBV's g_i)
    Z_i = sum_x (s_i p(x | X^i) - q(x | X^i))+   (the excess; the deficit is Z_i + 1 - s_i)
    h_i = Z_i / max(excess, deficit) = Z_i / (Z_i + 1 - s_i)   (1 where s_i = 1),   h_0 = 1,
    h_L = min(1, r_L)                   (the whole block passes on its *joint* ratio, both caps)

tau = the largest i with eta_i < h_i (the release's backward "step back" scan: it steps back from depth i with
probability 1 - h_i); emit X^tau, then a correction from norm((s_tau p(. | X^tau) - q(. | X^tau))+) when tau < L,
or a bonus from p(. | X^L). Given the drafts, P(tau = i) = h_i prod_{m > i} (1 - h_m).

With cap="running_max" every h_i (i < L) and every correction are BV's (bv.py); only the last test differs:
min(1, r_L) >= BV's w_L. BV is the best valid single-draft rule used as is (docs/methods.md, the LP), so wherever
min(1, r_L) > w_L on drafts of positive probability the rule accepts more than any lossless rule can: it is not
lossless (measured: the audit). ``final_test="capped"`` replaces the last test by h_L = s_L, which makes the rule
BV exactly (tests/verify/test_hsd.py): the one change that separates the release from BV, and the paper's text
(section 5.2: h_gamma = min(r*, 1) with r* the capped prefix ratio of Def. 5), which its own code listing (Appendix F)
and the release do not follow. docs/methods.md says where.

Cost: the same [L - 1, V] pass as BV's and GBV's ``expected_emitted`` (Z_1..Z_{L-1}); no host read there. The
sampler reads the ratios and uniforms once and the Z of the positions whose test can pass once.
"""

from __future__ import annotations

import torch

from spectr_repro.verify.base import Outcome, Verifier, VerifyResult
from spectr_repro.verify.bv import backward_scan, excess_mass, rows_at
from spectr_repro.verify.common import (
    LawBuilder,
    clipped_stop_probability,
    expected_emitted_from_stops,
    residual,
    sample,
    stop_law,
    token_ratios,
    uniform,
)

CAPS = ("running_max", "joint_min")
FINAL_TESTS = ("joint", "capped")


def log_joint_ratios(targets: torch.Tensor, drafts: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log r_0..log r_L ([L+1], float64; log r_0 = 0): targets, drafts [L, V] (rows 0..L-1), tokens [L]. Joint
    ratios of up to L probabilities live in log space (their products underflow)."""
    log_steps = torch.log(token_ratios(targets, drafts, tokens))  # [L]
    return torch.cat([log_steps.new_zeros(1), torch.cumsum(log_steps, 0)])


def capped_scale(log_ratio: torch.Tensor, cap: str) -> torch.Tensor:
    """s_0..s_L ([L+1], float64, each in [0, 1], s_0 = 1): the factor on Q(X^i) that caps the target's joint mass.

    running_max: r_i / max(1, r_1..r_i) = exp(log r_i - max(0, log r_1..log r_i)) (BV's running clipped ratio);
    joint_min: min(1, r_i)."""
    if cap == "running_max":
        return torch.exp(log_ratio - torch.cummax(log_ratio.clamp_min(0.0), 0).values)
    return torch.exp(log_ratio.clamp_max(0.0))


def stop_probabilities(targets: torch.Tensor, drafts: torch.Tensor, scale: torch.Tensor,
                       last: torch.Tensor) -> torch.Tensor:
    """h_1..h_L ([L], float64): h_i = min(Z_i / (Z_i + 1 - s_i), s_i) for 0 < i < L (1 where s_i = 1), h_L = last.

    targets, drafts [L, V] (rows 0..L-1; row 0 is not used: h_0 = 1), scale [L+1] (s_0..s_L), last: 0-dim."""
    L = drafts.shape[0]
    inner = scale[1:L]  # [L-1]
    z = excess_mass(targets[1:L], drafts[1:L], inner).double()  # [L-1]: one [L-1, V] buffer
    return torch.cat([clipped_stop_probability(z, inner), last.reshape(1)])


def excess_weights(target: torch.Tensor, draft: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(s p - q)+ ([V], the rows' dtype): the unnormalised correction law at one depth; one fresh buffer."""
    return torch.mul(target, scale.to(target.dtype)).sub_(draft).clamp_min_(0)


class HierarchicalSpeculativeDecoding(Verifier):
    name = "hsd"
    claimed_lossless = True
    single_draft = True

    def __init__(self, cap: str = "running_max", final_test: str = "joint", check_inputs: bool = True) -> None:
        super().__init__(check_inputs=check_inputs)
        if cap not in CAPS:
            raise ValueError(f"hsd: cap must be one of {CAPS}, got {cap!r}")
        if final_test not in FINAL_TESTS:
            raise ValueError(f"hsd: final_test must be one of {FINAL_TESTS}, got {final_test!r}")
        self.cap, self.final_test = cap, final_test
        # Measured (audit): the release's joint last test is biased; with the capped one and the running-max cap
        # the rule is BV, law for law.
        self.lossless = cap == "running_max" and final_test == "capped"

    # --- the rule's numbers ---------------------------------------------------------------------------

    def _block(self, draft_tokens, draft_probs, target_probs):
        """(tokens [L], targets [L, V], drafts [L, V], s [L+1] float64, h_L 0-dim float64) of draft row 0."""
        L = draft_tokens.shape[1]
        tokens = draft_tokens[0].long().to(draft_probs.device)
        targets, drafts = target_probs[0, :L], draft_probs[0]
        log_ratio = log_joint_ratios(targets, drafts, tokens)  # [L+1]
        scale = capped_scale(log_ratio, self.cap)  # [L+1]
        last = scale[L] if self.final_test == "capped" else torch.exp(log_ratio[L].clamp_max(0.0))
        return tokens, targets, drafts, scale, last

    def _all_stops(self, draft_tokens, draft_probs, target_probs) -> torch.Tensor:
        """h_0..h_L ([L+1], float64, h_0 = 1)."""
        _, targets, drafts, scale, last = self._block(draft_tokens, draft_probs, target_probs)
        return torch.cat([scale.new_ones(1), stop_probabilities(targets, drafts, scale, last)])

    @staticmethod
    def _correction(targets, drafts, scale, tau: int) -> torch.Tensor:
        """norm((s_tau p(. | X^tau) - q(. | X^tau))+) ([V]); no residual mass (probability 0) falls back to p."""
        return residual(scale[tau].to(targets.dtype) * targets[tau], drafts[tau], fallback=targets[tau])

    # --- the contract ---------------------------------------------------------------------------------

    def _sample(self, draft_tokens, draft_probs, target_probs, generator, state) -> VerifyResult:
        L = draft_tokens.shape[1]
        tokens, targets, drafts, scale, last = self._block(draft_tokens, draft_probs, target_probs)
        eta = uniform(L, generator, device=None if generator is not None else scale.device).to(scale.device)
        host = torch.cat([scale[:L], last.reshape(1), eta]).tolist()  # one host read
        tests, eta_list = host[: L + 1], host[L + 1:]

        def stops(positions: list[int]) -> list[float]:
            at = scale[torch.tensor(positions, device=scale.device)]
            z = excess_mass(rows_at(targets, positions), rows_at(drafts, positions), at).double()
            return clipped_stop_probability(z, at).tolist()

        tau = backward_scan(eta_list, tests, stops)  # tests[L] = h_L; h_i <= s_i below L
        if tau == L:
            last = sample(target_probs[0, L], generator)
        else:  # (s p - q)+ unnormalised (sample needs no normalising); no mass (probability 0): p, without a branch
            weights = excess_weights(targets[tau], drafts[tau], scale[tau])
            last = sample(torch.addcmul(weights, targets[tau], weights.sum() <= 0), generator)
        return VerifyResult(torch.cat([tokens[:tau], last.view(1)]), tau, 0, None)

    def expected_emitted(self, draft_tokens, draft_probs, target_probs, state=None) -> torch.Tensor:
        """E[tau + 1 | drafts] from h_1..h_L on the device (no host read)."""
        _, targets, drafts, scale, last = self._block(draft_tokens, draft_probs, target_probs)
        return expected_emitted_from_stops(stop_probabilities(targets, drafts, scale, last))

    def _law(self, draft_tokens, draft_probs, target_probs, state) -> list[Outcome]:
        draft_probs, target_probs = draft_probs.double(), target_probs.double()
        L = draft_tokens.shape[1]
        tokens, targets, drafts, scale, _ = self._block(draft_tokens, draft_probs, target_probs)
        prefix = tuple(tokens.tolist())
        law = LawBuilder()
        for tau, prob in enumerate(stop_law(self._all_stops(draft_tokens, draft_probs, target_probs).tolist())):
            if prob > 0:
                after = target_probs[0, L] if tau == L else self._correction(targets, drafts, scale, tau)
                law.add(prefix[:tau], prob, after)
        return law.outcomes()
