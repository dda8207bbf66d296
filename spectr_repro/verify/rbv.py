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

GPU cost: one host read before the scan (every draft token, its ratio under the raw target and one uniform
per (draft, position)), then at most one per draft that is scanned: the first ratio of a later segment
(under the current target r, a device row) and the Z_i of every position whose test can pass, read together.
"""

from __future__ import annotations

import math

import torch

from spectr_repro.verify.base import Outcome, Verifier, VerifyResult
from spectr_repro.verify.bv import BlockSegment, clipped_weights, excess_mass, rows_at
from spectr_repro.verify.common import LawBuilder, block_on_host, sample, token_ratios

PRODUCT_CAP = 1e300  # running products of ratios are capped here (see _scan_later_segment)


def _segment(draft_tokens, draft_probs, target_probs, k: int, start: int, current_target,
             ratios: list[float] | None = None) -> BlockSegment:
    """Draft k's positions start+1..L, with ``current_target`` as the target of position start+1 (None: the
    raw target); ``ratios`` when the caller holds them on the host."""
    L = draft_tokens.shape[1]
    return BlockSegment(target_probs[k, start:L], draft_probs[k, start:], draft_tokens[k, start:],
                        first_target=current_target, ratios=ratios)


def _scan_later_segment(tokens, draft_probs, target_probs, k: int, start: int, current: torch.Tensor,
                        later_ratios: list[float], eta: list[float]) -> tuple[BlockSegment, int]:
    """Scan draft k from position start + 1 against ``current`` (a device row) with one host read.

    The first ratio rho_1 = r(X) / q(X) lives on the device; every later weight is w_i = min(rho_1 * a_i, b_i)
    with a_i = prod_{m=2..i} rho_m and b_i the clipped weights started from w_1 = 1 (both host numbers; by
    induction on w_i = min(1, w_{i-1} rho_i)). So before rho_1 is known, b_i >= w_i bounds the positions whose
    test can pass (eta_i < w_i), and their Z_i are computed with device weights and read with rho_1.
    a_i is capped at PRODUCT_CAP: beyond it rho_1 * a_i > 1 >= b_i for every rho_1 > 1e-300.
    """
    segment_tokens = tokens[k, start:]
    n = segment_tokens.shape[0]
    bounds = clipped_weights([math.inf, *later_ratios])  # b_0..b_n (b_1 = 1)
    products = [1.0, 1.0]  # a_0 (unused), a_1
    for ratio in later_ratios:
        products.append(0.0 if products[-1] == 0 else min(products[-1] * ratio, PRODUCT_CAP))
    first_ratio = token_ratios(current[None], draft_probs[k, start : start + 1], segment_tokens[:1])  # [1]
    maybe = [i for i in range(1, n) if eta[i - 1] < bounds[i]]
    read = first_ratio
    if maybe:
        a, b = (torch.tensor([values[i] for i in maybe], dtype=torch.float64, device=current.device)
                for values in (products, bounds))
        scale = torch.minimum(first_ratio * a, b)
        start_rows = [start + i for i in maybe]
        z = excess_mass(rows_at(target_probs[k], start_rows), rows_at(draft_probs[k], start_rows), scale)
        read = torch.cat([first_ratio, z.double()])
    first, *z_values = read.tolist()
    excess = dict(zip(maybe, z_values))
    segment = _segment(tokens, draft_probs, target_probs, k, start, current, ratios=[first, *later_ratios])
    return segment, segment.stop_position(eta, lambda positions: [excess[i] for i in positions])


class RecursiveBlockVerification(Verifier):
    name = "rbv"
    lossless = True
    claimed_lossless = True
    single_draft = False

    def _sample(self, draft_tokens, draft_probs, target_probs, generator, state) -> VerifyResult:
        # One host read: every draft token, its ratio under the raw target and one uniform per (draft, position).
        tokens, rows, raw_ratios, eta = block_on_host(draft_tokens, draft_probs, target_probs, generator)
        K, L = tokens.shape
        committed, owner, current = 0, 0, None  # current None: the raw target p(. | context)
        for k in range(K):
            if rows[k][:committed] != rows[owner][:committed]:
                continue
            if current is None:  # the first segment: every weight is known on the host already
                segment = _segment(tokens, draft_probs, target_probs, k, 0, None, ratios=raw_ratios[k])
                tau = segment.scan(generator, eta=eta[k])
            else:
                segment, tau = _scan_later_segment(tokens, draft_probs, target_probs, k, committed, current,
                                                   raw_ratios[k][committed + 1 :], eta[k][committed:])
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
