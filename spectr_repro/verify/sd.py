"""SD: token-level speculative decoding (Leviathan et al. 2023; Chen et al. 2023). Single draft.

Shapes: draft_tokens [1, L], draft_probs [1, L, V] (q), target_probs [1, L+1, V] (p).

For i = 1..L accept X_i with probability a_i = min(1, p(X_i | X^{i-1}) / q(X_i | X^{i-1})); at the
first rejection emit a correction from norm((p - q)+) at that position and stop; if all L pass, emit a
bonus from p(. | X^L). Token-level identity behind its validity:

    q(x) * min(1, p(x)/q(x)) + (1 - sum_y min(p(y), q(y))) * norm((p - q)+)(x) = p(x).

The law (given the drafts) is: tau = i < L with probability prod_{j<i} a_j * (1 - a_i), then the
correction; tau = L with probability prod_j a_j, then the bonus.
"""

from __future__ import annotations

import torch

from spectr_repro.verify.base import Outcome, Verifier, VerifyResult
from spectr_repro.verify.common import LawBuilder, residual, sample, token_ratios, uniform


class SpeculativeDecoding(Verifier):
    name = "sd"
    lossless = True
    claimed_lossless = True
    single_draft = True

    def correction(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """Law of the token emitted after a rejection: norm((p - q)+) ([V] rows; p where that has no mass)."""
        return residual(p, q, fallback=p)

    def _sample(self, draft_tokens, draft_probs, target_probs, generator, state) -> VerifyResult:
        tokens = draft_tokens[0].long().to(draft_probs.device)
        L = tokens.shape[0]
        p, q = target_probs[0], draft_probs[0]
        accept = token_ratios(p[:L], q, tokens).clamp(max=1.0)
        eta = uniform(L, generator, device=None if generator is not None else p.device).to(p.device)
        # Strict "<": a ratio of 0 never accepts, a ratio of 1 always does (eta lies in [0, 1)).
        rejected = torch.cat([eta >= accept, torch.ones(1, dtype=torch.bool, device=p.device)])
        tau = int(rejected.int().argmax())  # first rejection, L if none (the only host sync)
        if tau == L:
            extra = sample(p[L], generator)
        else:  # only the stopping position needs a full-vocabulary residual
            extra = sample(self.correction(p[tau], q[tau]), generator)
        out = torch.cat([tokens[:tau], extra.view(1)])
        return VerifyResult(out, tau, 0, None)

    def expected_emitted(self, draft_tokens, draft_probs, target_probs, state=None) -> torch.Tensor:
        """1 + sum_i prod_{j <= i} a_j: tau >= i exactly when the first i tokens pass."""
        tokens = draft_tokens[0].long().to(draft_probs.device)
        accept = token_ratios(target_probs[0, : tokens.shape[0]], draft_probs[0], tokens).clamp(max=1.0)
        return 1.0 + accept.cumprod(0).sum()

    def _law(self, draft_tokens, draft_probs, target_probs, state) -> list[Outcome]:
        tokens = draft_tokens[0].long()
        L = tokens.shape[0]
        p, q = target_probs[0].double(), draft_probs[0].double()
        accept = token_ratios(p[:L], q, tokens).clamp(max=1.0).tolist()
        prefix = tuple(tokens.tolist())
        law = LawBuilder()
        reach = 1.0
        for i in range(L):
            law.add(prefix[:i], reach * (1.0 - accept[i]), self.correction(p[i], q[i]))
            reach *= accept[i]
        law.add(prefix, reach, p[L])
        return law.outcomes()
