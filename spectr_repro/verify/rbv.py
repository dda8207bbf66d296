"""RBV: recursive block verification over K drafts (this project's lossless multi-draft block rule).

Shapes: draft_tokens [K, L], draft_probs [K, L, V] (q), target_probs [K, L+1, V] (p).

Keep a committed prefix z (length j, initially empty) and a *current target* r for position j+1
(initially p(. | context)). For each draft in order: skip it unless its first j tokens equal z; otherwise
run block verification (bv.py) on its positions j+1..L starting from w_j = 1, with r as the target at
position j+1 and p afterwards:

    w_i = min(1, w_{i-1} T_i(X_i) / q(X_i | X^{i-1})),  Z_i = sum_x (w_i T_{i+1}(x) - q(x | X^i))+,
    h_i = Z_i / (Z_i + 1 - w_i)  (j < i < L),  h_j = 1,  h_L = w_L,  tau = the largest i with eta_i < h_i;

set z = X^tau. If tau = L stop; else r <- norm((w_tau T_{tau+1} - q(. | z))+). At the end emit z plus a
token from p(. | z) if |z| = L, else from r. Each step is BV against a valid target (the residual law of
the tokens not yet explained), so the whole is valid as is; K = 1 is exactly BV.
"""

from __future__ import annotations

import torch

from spectr_repro.verify.base import Outcome, Verifier, VerifyResult
from spectr_repro.verify.bv import BlockSegment
from spectr_repro.verify.common import LawBuilder, sample


def _segment(draft_tokens, draft_probs, target_probs, k: int, start: int, current_target) -> BlockSegment:
    """Draft k's positions start+1..L, with ``current_target`` as the target of position start+1."""
    L = draft_tokens.shape[1]
    return BlockSegment(target_probs[k, start:L], draft_probs[k, start:], draft_tokens[k, start:],
                        first_target=current_target)


class RecursiveBlockVerification(Verifier):
    name = "rbv"
    lossless = True
    claimed_lossless = True
    single_draft = False

    def _sample(self, draft_tokens, draft_probs, target_probs, generator, state) -> VerifyResult:
        tokens = draft_tokens.long().to(draft_probs.device)
        rows = tokens.tolist()
        K, L = tokens.shape
        committed, owner, current = 0, 0, target_probs[0, 0]
        for k in range(K):
            if rows[k][:committed] != rows[owner][:committed]:
                continue
            segment = _segment(tokens, draft_probs, target_probs, k, committed, current)
            tau = segment.scan(generator)
            committed, owner = committed + tau, k
            if committed == L:
                extra = sample(target_probs[k, L], generator)
                return VerifyResult(torch.cat([tokens[k], extra.view(1)]), L, k, None)
            current = segment.correction(tau)
        extra = sample(current, generator)
        return VerifyResult(torch.cat([tokens[owner, :committed], extra.view(1)]), committed, owner, None)

    def _law(self, draft_tokens, draft_probs, target_probs, state) -> list[Outcome]:
        tokens = draft_tokens.long()
        rows = tokens.tolist()
        K, L = tokens.shape
        q_all, p_all = draft_probs.double(), target_probs.double()
        law = LawBuilder()

        def visit(k: int, committed: int, owner: int, current: torch.Tensor, mass: float) -> None:
            prefix = tuple(rows[owner][:committed])
            if k == K:
                law.add(prefix, mass, current)
                return
            if tuple(rows[k][:committed]) != prefix:
                visit(k + 1, committed, owner, current, mass)
                return
            segment = _segment(tokens, q_all, p_all, k, committed, current)
            for tau, prob in enumerate(segment.stop_law()):
                if prob <= 0:
                    continue
                if committed + tau == L:
                    law.add(tuple(rows[k]), mass * prob, p_all[k, L])
                else:
                    visit(k + 1, committed + tau, k, segment.correction(tau), mass * prob)

        visit(0, 0, 0, p_all[0, 0], 1.0)
        return law.outcomes()
