"""BV: block verification (Sun, Mendlovic, Leviathan, Aharoni, Beirami, Ro, Suresh; ICLR 2025). Single draft.

Shapes: draft_tokens [1, L], draft_probs [1, L, V] (q), target_probs [1, L+1, V] (p).

With p_0 = 1 and p_i = min(1, p_{i-1} * p(X_i | X^{i-1}) / q(X_i | X^{i-1})) (a running, clipped ratio):

    Z_i = sum_x (p_i * p(x | X^i) - q(x | X^i))+,   h_i = Z_i / (Z_i + 1 - p_i)  (i < L; 1 when p_i = 1),
    h_L = p_L,   tau = the LARGEST i in 1..L with eta_i < h_i (0 if none; a failure does not stop the scan),

emit X^tau, then a correction from norm((p_tau * p(. | X^tau) - q(. | X^tau))+) if tau < L, else a bonus
from p(. | X^L). Given the drafts, P(tau = i) = h_i * prod_{m > i} (1 - h_m) with h_0 = 1.

The scan is written for a *segment* whose first target may be replaced (``first_target``), which is
what recursive block verification (rbv.py) runs on each draft.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spectr_repro.verify.base import Outcome, Verifier, VerifyResult
from spectr_repro.verify.common import LawBuilder, residual, sample, token_ratios, uniform_list


@dataclass
class BlockSegment:
    """One draft's positions 1..n seen by a block-verification scan.

    targets [n, V]: row i = the target for token i+1 (T_{i+1}); ``first_target`` [V], if given,
    replaces row 0 (rbv's current target). drafts [n, V]: row i = q for token i+1. tokens [n].
    """

    targets: torch.Tensor
    drafts: torch.Tensor
    tokens: torch.Tensor
    first_target: torch.Tensor | None = None

    def __post_init__(self) -> None:
        ratios = token_ratios(self.targets, self.drafts, self.tokens)
        if self.first_target is not None:
            first = token_ratios(self.first_target[None], self.drafts[:1], self.tokens[:1])
            ratios = torch.cat([first, ratios[1:]])
        self.weights = clipped_weights(ratios.tolist())  # w_0..w_n, float64 scalars

    @property
    def length(self) -> int:
        return len(self.weights) - 1

    def target(self, i: int) -> torch.Tensor:
        """T_{i+1}: the target for the token after position i."""
        if i == 0 and self.first_target is not None:
            return self.first_target
        return self.targets[i]

    def stop_probabilities(self, start: int = 0) -> list[float]:
        """h_0..h_n (h_0 = 1). Only h_i for i > start are computed from Z_i; those below are set to 1,
        which is harmless: whenever start is a position with w = 1 (h = 1) the scan never goes below it."""
        n, w = self.length, self.weights
        h = [1.0] * (n + 1)
        h[n] = w[n]
        lo = max(start, 0) + 1
        if lo < n:  # positions lo..n-1 in one batched pass over [n - lo, V] (rows with w = 1 are ignored)
            scale = torch.tensor(w[lo:n], dtype=self.targets.dtype, device=self.targets.device)
            excess = self.targets[lo:n] * scale[:, None]
            excess.sub_(self.drafts[lo:n]).clamp_min_(0)
            for i, z in enumerate(excess.sum(-1).tolist(), start=lo):  # Z_i in the input dtype
                if w[i] < 1.0:
                    h[i] = z / (z + 1.0 - w[i])  # denominator >= 1 - w_i > 0
        return h

    def stop_law(self) -> list[float]:
        """P(tau = i), i = 0..n, given the drafts."""
        h = self.stop_probabilities()
        law, none_above = [0.0] * (self.length + 1), 1.0
        for i in range(self.length, -1, -1):
            law[i] = h[i] * none_above
            none_above *= 1.0 - h[i]
        return law

    def scan(self, generator: torch.Generator | None) -> int:
        """Draw eta_1..eta_n and return tau = the largest i with eta_i < h_i (0 if none)."""
        n, w = self.length, self.weights
        eta = uniform_list(n, generator, self.targets.device)  # eta[i - 1] belongs to position i
        if eta[n - 1] < w[n]:  # the whole block passes: no full-vocabulary work at all
            return n
        # Below the last position with w = 1 (h = 1) the scan cannot go; only positions above it need Z.
        floor = max([i for i in range(n) if w[i] >= 1.0])
        h = self.stop_probabilities(start=floor)
        for i in range(n - 1, floor, -1):
            if eta[i - 1] < h[i]:
                return i
        return floor

    def correction(self, tau: int) -> torch.Tensor:
        """Law of the token after X^tau when tau < n: norm((w_tau * T_{tau+1} - q_{tau+1})+)."""
        target = self.target(tau)
        return residual(self.weights[tau] * target, self.drafts[tau], fallback=target)


def clipped_weights(ratios: list[float]) -> list[float]:
    """w_0 = 1, w_i = min(1, w_{i-1} * ratio_i), in float64 Python scalars."""
    weights = [1.0]
    for ratio in ratios:
        prev = weights[-1]
        weights.append(min(1.0, prev * ratio) if prev > 0 else 0.0)
    return weights


class BlockVerification(Verifier):
    name = "bv"
    lossless = True
    claimed_lossless = True
    single_draft = True

    @staticmethod
    def _segment(draft_tokens, draft_probs, target_probs) -> BlockSegment:
        L = draft_tokens.shape[1]
        tokens = draft_tokens[0].long().to(draft_probs.device)
        return BlockSegment(target_probs[0, :L], draft_probs[0], tokens)

    def _sample(self, draft_tokens, draft_probs, target_probs, generator, state) -> VerifyResult:
        segment = self._segment(draft_tokens, draft_probs, target_probs)
        L = segment.length
        tau = segment.scan(generator)
        law = target_probs[0, L] if tau == L else segment.correction(tau)
        out = torch.cat([segment.tokens[:tau], sample(law, generator).view(1)])
        return VerifyResult(out, tau, 0, None)

    def _law(self, draft_tokens, draft_probs, target_probs, state) -> list[Outcome]:
        segment = self._segment(draft_tokens.long(), draft_probs.double(), target_probs.double())
        L = segment.length
        prefix = tuple(segment.tokens.tolist())
        law = LawBuilder()
        for tau, prob in enumerate(segment.stop_law()):
            if prob > 0:
                after = target_probs[0, L].double() if tau == L else segment.correction(tau)
                law.add(prefix[:tau], prob, after)
        return law.outcomes()
