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

from collections.abc import Callable
from dataclasses import dataclass

import torch

from spectr_repro.verify.base import Outcome, Verifier, VerifyResult
from spectr_repro.verify.common import (
    LawBuilder,
    clipped_stop_probability,
    expected_emitted_from_stops,
    residual,
    running_ratio,
    sample,
    stop_law,
    token_ratios,
    uniform_list,
)


@dataclass
class BlockSegment:
    """One draft's positions 1..n seen by a block-verification scan.

    targets [n, V]: row i = the target for token i+1 (T_{i+1}); ``first_target`` [V], if given,
    replaces row 0 (rbv's current target). drafts [n, V]: row i = q for token i+1. tokens [n].
    ratios: T_i(X_i) / q_i(X_i) for i = 1..n when the caller already holds them on the host (else they
    are computed here, one host read).
    """

    targets: torch.Tensor
    drafts: torch.Tensor
    tokens: torch.Tensor
    first_target: torch.Tensor | None = None
    ratios: list[float] | None = None

    def __post_init__(self) -> None:
        if self.ratios is None:
            ratios = token_ratios(self.targets, self.drafts, self.tokens)
            if self.first_target is not None:
                first = token_ratios(self.first_target[None], self.drafts[:1], self.tokens[:1])
                ratios = torch.cat([first, ratios[1:]])
            self.ratios = ratios.tolist()
        self.weights = clipped_weights(self.ratios)  # w_0..w_n, float64 scalars

    @property
    def length(self) -> int:
        return len(self.weights) - 1

    def target(self, i: int) -> torch.Tensor:
        """T_{i+1}: the target for the token after position i."""
        if i == 0 and self.first_target is not None:
            return self.first_target
        return self.targets[i]

    def excess_mass(self, positions: list[int], scale: torch.Tensor) -> torch.Tensor:
        """Z_i = sum_x (scale_i * T_{i+1}(x) - q_{i+1}(x))+ for positions 0 < i < n (increasing), on the device.

        scale: [len(positions)] (w_i). One batched pass over [len(positions), V] in the input dtype.
        """
        return excess_mass(rows_at(self.targets, positions), rows_at(self.drafts, positions), scale)

    def stop_probabilities(self, start: int = 0) -> list[float]:
        """h_0..h_n (h_0 = 1). Only h_i for i > start are computed from Z_i; those below are set to 1,
        which is harmless: whenever start is a position with w = 1 (h = 1) the scan never goes below it."""
        n, w = self.length, self.weights
        h = [1.0] * (n + 1)
        h[n] = w[n]
        positions = [i for i in range(max(start, 0) + 1, n) if w[i] < 1.0]  # rows with w = 1 have h = 1
        if positions:
            for i, z in zip(positions, self._excess_on_host(positions)):
                h[i] = host_stop_probability(z, w[i])
        return h

    def stop_law(self) -> list[float]:
        """P(tau = i), i = 0..n, given the drafts."""
        return stop_law(self.stop_probabilities())

    def scan(self, generator: torch.Generator | None, eta: list[float] | None = None) -> int:
        """Draw eta_1..eta_n (unless given: eta[i - 1] belongs to position i) and return tau = the largest i
        with eta_i < h_i (0 if none)."""
        if eta is None:
            eta = uniform_list(self.length, generator, self.targets.device)
        return self.stop_position(eta, self._excess_on_host)

    def stop_position(self, eta: list[float], excess: Callable[[list[int]], list[float]]) -> int:
        """tau = the largest i with eta_i < h_i (``backward_scan``), asking ``excess`` for Z_i only where the test
        can pass."""
        w = self.weights
        return backward_scan(eta, w, lambda positions: [host_stop_probability(z, w[i])
                                                        for i, z in zip(positions, excess(positions))])

    def _excess_on_host(self, positions: list[int]) -> list[float]:
        scale = torch.tensor([self.weights[i] for i in positions], dtype=self.targets.dtype,
                             device=self.targets.device)
        return self.excess_mass(positions, scale).tolist()  # Z_i in the input dtype, one host read

    def correction(self, tau: int) -> torch.Tensor:
        """Law of the token after X^tau when tau < n: norm((w_tau * T_{tau+1} - q_{tau+1})+)."""
        target = self.target(tau)
        return residual(self.weights[tau] * target, self.drafts[tau], fallback=target)


def backward_scan(eta: list[float], w: list[float], stop_probabilities: Callable[[list[int]], list[float]]) -> int:
    """tau = the largest i in 1..n with eta_i < h_i (0 if none), given w_0..w_n (host floats; eta[i - 1] belongs
    to position i) and ``stop_probabilities(positions)`` = h at 0 < i < n (clipped to w, h_n = w_n), asked only
    where the test can pass (BV's and GBV's scan; w is BV's running ratio or GBV's joint one).

    eta_n < w_n: the whole block passes (no vocabulary work at all). Below the last position with w = 1 (h = 1)
    the scan cannot go; above it h_i <= w_i rules out every position with eta_i >= w_i.
    """
    n = len(w) - 1
    if eta[n - 1] < w[n]:
        return n
    floor = max(i for i in range(n) if w[i] >= 1.0)
    candidates = [i for i in range(floor + 1, n) if eta[i - 1] < w[i]]
    if not candidates:
        return floor
    passed = [i for i, h in zip(candidates, stop_probabilities(candidates)) if eta[i - 1] < h]
    return max(passed, default=floor)


def host_stop_probability(z: float, w: float) -> float:
    """common.clipped_stop_probability on host floats, for w < 1 only (the denominator is >= 1 - w > 0, so the
    0/0 case never reaches it: positions with w = 1 have h = 1 and are never evaluated)."""
    return min(z / (z + 1.0 - w), w)


def rows_at(rows: torch.Tensor, positions: list[int]) -> torch.Tensor:
    """rows[positions] for increasing positions: a view when they are contiguous, else one gather."""
    lo, hi = positions[0], positions[-1] + 1
    if hi - lo == len(positions):
        return rows[lo:hi]
    return rows[torch.tensor(positions, device=rows.device)]


def excess_mass(targets: torch.Tensor, drafts: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """sum_x (scale * T(x) - q(x))+ per row: targets, drafts [m, V], scale [m]. In the rows' dtype (an
    ordinary sum of probability-sized terms); one fresh buffer, then in place (the caller's rows stay intact)."""
    return torch.mul(targets, scale.to(targets.dtype).unsqueeze(-1)).sub_(drafts).clamp_min_(0).sum(-1)


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

    def expected_emitted(self, draft_tokens, draft_probs, target_probs, state=None) -> torch.Tensor:
        """From h_1..h_L on the device: h_i = min(Z_i / (Z_i + 1 - w_i), w_i) (1 where w_i = 1), h_L = w_L."""
        L = draft_tokens.shape[1]
        tokens = draft_tokens[0].long().to(draft_probs.device)
        targets, drafts = target_probs[0, :L], draft_probs[0]
        w = running_ratio(token_ratios(targets, drafts, tokens))  # w_0..w_L, float64
        inner = w[1:L]
        z = excess_mass(targets[1:], drafts[1:], inner).double()  # Z_1..Z_{L-1}, one [L-1, V] buffer
        h = torch.cat([clipped_stop_probability(z, inner), w[L:]])
        return expected_emitted_from_stops(h)

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
