"""SD: token-level speculative decoding (Leviathan et al. 2023; Chen et al. 2023). Single draft.

Shapes: draft_tokens [1, L], draft_probs [1, L, V] (q), target_probs [1, L+1, V] (p).

For i = 1..L accept X_i with probability a_i = min(1, p(X_i | X^{i-1}) / q(X_i | X^{i-1})); at the
first rejection emit a correction from norm((p - q)+) at that position and stop; if all L pass, emit a
bonus from p(. | X^L). Token-level identity behind its validity:

    q(x) * min(1, p(x)/q(x)) + (1 - sum_y min(p(y), q(y))) * norm((p - q)+)(x) = p(x).

The law (given the drafts) is: tau = i < L with probability prod_{j<i} a_j * (1 - a_i), then the
correction; tau = L with probability prod_j a_j, then the bonus.

Also home of the small helpers the other rules' samplers and laws share (``token_ratios``,
``LawBuilder``, ``uniform_list``).
"""

from __future__ import annotations

import torch

from spectr_repro.verify.base import Outcome, Verifier, VerifyResult
from spectr_repro.verify.common import residual, sample, uniform


def token_ratios(target_rows: torch.Tensor, draft_rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """p(x_i) / q(x_i) in float64 for rows [n, V] and tokens [n] (same device as the rows).

    q(x_i) = 0 cannot happen for a drawn token (inputs are validated); if it does (check_inputs=False)
    the ratio is +inf where p(x_i) > 0 and 0 where both vanish, so no NaN reaches an acceptance test.
    """
    index = tokens.long().to(target_rows.device).unsqueeze(-1)
    p_at = target_rows.gather(-1, index).squeeze(-1).double()
    q_at = draft_rows.gather(-1, index).squeeze(-1).double()
    return (p_at / q_at).nan_to_num(nan=0.0, posinf=float("inf"))


def uniform_list(n: int, generator: torch.Generator | None, device: torch.device) -> list[float]:
    """n U(0,1) draws as Python floats, from ``generator`` (on its own device) or the default RNG."""
    return uniform(n, generator, device=None if generator is not None else device).tolist()


class LawBuilder:
    """Accumulates the atoms of an exact per-iteration law, merging outcomes with equal tokens."""

    def __init__(self) -> None:
        self.mass: dict[tuple[int, ...], float] = {}

    def add(self, prefix: tuple[int, ...], weight: float, dist: torch.Tensor) -> None:
        """Atoms prefix + (y,) with probability weight * dist[y] (dist: a normalised [V] vector)."""
        if weight <= 0:
            return
        for y, prob in enumerate(dist.tolist()):
            if prob > 0:
                key = prefix + (y,)
                self.mass[key] = self.mass.get(key, 0.0) + weight * prob

    def outcomes(self) -> list[Outcome]:
        return [Outcome(prob, tokens, None) for tokens, prob in self.mass.items() if prob > 0]


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
