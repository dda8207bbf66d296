"""SpecTr: K-SEQ optimal-transport draft selection, one depth at a time (Sun et al., NeurIPS 2023).

Shapes: draft_tokens [K, L], draft_probs [K, L, V] (q), target_probs [K, L+1, V] (p); drafts are i.i.d.
from q given the context, so rows of drafts sharing a prefix carry the same conditionals.

Depth t (t = 1..L): the survivors S_t are the drafts whose first t-1 tokens equal the emitted prefix; with
k = |S_t|, p = p(. | prefix), q = q(. | prefix):

    beta(rho) = sum_x min(q(x), p(x) / rho),
    rho* = the smallest rho in [1, k] with 1 - (1 - beta(rho))^k <= rho * beta(rho)   (bisection),

try the survivors in order, accepting survivor s's token X with probability min(1, p(X) / (rho* q(X))).
If one is accepted, emit X, keep the survivors carrying X and go to depth t+1; if none is, emit a token from

    norm(p - min(q, p / rho*) * (1 - (1 - beta)^k) / beta)   (mass (1 - beta)^k, >= 0 by rho*'s choice)

and stop. Past depth L emit a bonus from p(. | X^L). K = 1 gives rho* = 1 and the residual (p - q)+: SD.

rho* is found exactly: beta is piecewise of the form A + B / rho between the sorted ratios p/q in (1, K), so
one sort of those ratios locates the piece holding rho* and a scalar bisection on that piece finishes (no
per-step vocabulary sums).
"""

from __future__ import annotations

import torch

from spectr_repro.verify.base import Outcome, Verifier, VerifyResult
from spectr_repro.verify.common import LawBuilder, normalize, sample, token_ratios, uniform_list

# Slack on the K-SEQ condition: near rho = 1 with p ~ q the excess below is flat (order (rho - 1)^k) and
# its sign is decided by float64 round-off of beta; a residual at most this far below 0 is clipped to 0.
EXCESS_SLACK = 1e-15


def _kseq_excess(rho: float, beta: float, k: int) -> float:
    """rho * beta - (1 - (1 - beta)^k): >= 0 exactly when rho is admissible."""
    return rho * beta - (1.0 - (1.0 - beta) ** k)


def _admissible(rho: float, beta: float, k: int) -> bool:
    return _kseq_excess(rho, beta, k) >= -EXCESS_SLACK


def optimal_rho(p: torch.Tensor, q: torch.Tensor, k: int, tol: float = 1e-14) -> float:
    """rho* for k survivors (p, q: [V]); the returned value satisfies the K-SEQ condition (upper end).

    The excess rho*beta(rho) - (1 - (1 - beta(rho))^k) is non-decreasing in rho (rho*beta = sum min(rho q, p)
    grows, beta shrinks), so the admissible set is [rho*, k].
    """
    if k == 1:
        return 1.0
    p64, q64 = p.double(), q.double()
    ratio = p64 / q64  # q = 0: +inf, or NaN for 0/0; both count as "above" every rho (they add q = 0)
    # For rho in [1, k] a token with ratio <= 1 always adds p/rho to beta and one with ratio >= k always
    # adds q: only the ratios strictly inside (1, k) are breakpoints there, and only they are sorted
    # (on Qwen's 152k vocabulary typically a few thousand: the full sort was ~70 % of SpecTr's time).
    low, inside = ratio <= 1.0, (ratio > 1.0) & (ratio < k)
    high = ~(low | inside)
    mid_index = inside.nonzero().squeeze(1)
    mid_ratio, order = ratio[mid_index].sort()
    mid_index = mid_index[order]
    p_mid, q_mid = p64[mid_index], q64[mid_index]
    p_low, q_high = torch.stack([torch.where(low, p64, 0.0).sum(), torch.where(high, q64, 0.0).sum()]).tolist()
    beta_one = p_low + q_high + float(q_mid.sum())  # sum min(p, q): p below ratio 1, q above
    below_p = p_low + p_mid.cumsum(0)  # sum of p over the tokens with ratio <= mid_ratio[j]
    above_q = q_high + q_mid.flip(0).cumsum(0).flip(0)  # sum of q over the tokens with ratio >= mid_ratio[j]
    # On the piece [r_{j-1}, r_j] (and at r_j): beta = A_j + B_j / rho, A_j = above_q[j], B_j = below_p[j-1].
    beta_at = above_q + (below_p - p_mid) / mid_ratio
    excess = mid_ratio * beta_at - 1.0 + (1.0 - beta_at) ** k
    # admissible is monotone along the sorted ratios: j = the first admissible breakpoint (n if none;
    # the breakpoints at or above k are all admissible).
    j = int((excess < -EXCESS_SLACK).sum())
    if _admissible(1.0, beta_one, k):  # p = q, disjoint supports, ...
        return 1.0
    n = mid_ratio.numel()
    lo, b = (1.0, p_low) if j == 0 else tuple(torch.stack([mid_ratio[j - 1], below_p[j - 1]]).tolist())
    hi, a = (float(k), q_high) if j == n else tuple(torch.stack([mid_ratio[j], above_q[j]]).tolist())
    for _ in range(200):  # scalar bisection on the piece beta = a + b / rho, rho in [lo, hi]
        if hi - lo <= tol * hi:
            break
        mid = 0.5 * (lo + hi)
        if _admissible(mid, a + b / mid, k):
            hi = mid
        else:
            lo = mid
    return hi


def kseq_residual(p: torch.Tensor, q: torch.Tensor, rho: float, k: int) -> torch.Tensor:
    """norm(p - min(q, p/rho) * (1 - (1 - beta)^k) / beta): the law of the correction after k rejections."""
    accepted = torch.minimum(q, p / rho)
    if k == 1:
        scale = 1.0  # (1 - (1 - beta)) / beta, written exactly so that K = 1 is bit-for-bit SD
    else:
        beta = float(accepted.sum(dtype=torch.float64))
        scale = (1.0 - (1.0 - beta) ** k) / beta if beta > 0 else 0.0
    return normalize((p - accepted * scale).clamp_min(0), fallback=p)


class SpecTr(Verifier):
    name = "spectr"
    lossless = True
    claimed_lossless = True
    single_draft = False

    def __init__(self, check_inputs: bool = True, **options) -> None:
        super().__init__(check_inputs, **options)
        # The exact law is called for every draft tuple of a toy, and the depth-t step (rho*, residual)
        # depends only on (p, q, k): memoise it across calls by value (law inputs are small by contract).
        self._law_steps: dict[tuple[bytes, bytes, int], tuple[float, torch.Tensor]] = {}

    def correction(self, p: torch.Tensor, q: torch.Tensor, rho: float, k: int) -> torch.Tensor:
        """Law of the token emitted when all k survivors are rejected (see ``kseq_residual``)."""
        return kseq_residual(p, q, rho, k)

    def _law_step(self, p: torch.Tensor, q: torch.Tensor, k: int) -> tuple[float, torch.Tensor]:
        if p.numel() > 256:  # not a toy: no memo (it would hold full-vocabulary rows)
            rho = optimal_rho(p, q, k)
            return rho, self.correction(p, q, rho, k)
        key = (p.numpy().tobytes(), q.numpy().tobytes(), k)
        if key not in self._law_steps:
            if len(self._law_steps) > 100_000:
                self._law_steps.clear()
            rho = optimal_rho(p, q, k)
            self._law_steps[key] = (rho, self.correction(p, q, rho, k))
        return self._law_steps[key]

    def _sample(self, draft_tokens, draft_probs, target_probs, generator, state) -> VerifyResult:
        device = draft_probs.device
        tokens = draft_tokens.long().to(device)
        rows = tokens.tolist()
        K, L = tokens.shape
        survivors = list(range(K))
        for t in range(L):
            first = survivors[0]
            p, q = target_probs[first, t], draft_probs[first, t]
            k = len(survivors)
            rho = optimal_rho(p, q, k)
            candidates = tokens[survivors, t]
            ratios = token_ratios(p.expand(k, -1), q.expand(k, -1), candidates).tolist()
            eta = uniform_list(k, generator, device)
            accepted = (rows[s][t] for s, u, r in zip(survivors, eta, ratios) if u < min(1.0, r / rho))
            chosen = next(accepted, None)  # the first survivor whose test passes
            if chosen is None:
                extra = sample(self.correction(p, q, rho, k), generator)
                return VerifyResult(torch.cat([tokens[first, :t], extra.view(1)]), t, first, None)
            survivors = [s for s in survivors if rows[s][t] == chosen]
        first = survivors[0]
        extra = sample(target_probs[first, L], generator)
        return VerifyResult(torch.cat([tokens[first], extra.view(1)]), L, first, None)

    def _law(self, draft_tokens, draft_probs, target_probs, state) -> list[Outcome]:
        rows = draft_tokens.long().tolist()
        K, L = draft_tokens.shape
        p_all, q_all = target_probs.double().cpu(), draft_probs.double().cpu()
        # Survivors share their prefix, hence their conditionals: each draft's own rows give its ratio.
        ratios = token_ratios(p_all[:, :L], q_all, draft_tokens.long()).tolist()
        law = LawBuilder()

        def depth(t: int, survivors: list[int], prefix: tuple[int, ...], mass: float) -> None:
            first = survivors[0]
            if t == L:
                law.add(prefix, mass, p_all[first, L])
                return
            p, q, k = p_all[first, t], q_all[first, t], len(survivors)
            rho, correction = self._law_step(p, q, k)
            accepted: dict[int, float] = {}
            none_yet = mass  # P(reach depth t and every survivor so far rejected)
            for s in survivors:
                a = min(1.0, ratios[s][t] / rho)
                accepted[rows[s][t]] = accepted.get(rows[s][t], 0.0) + none_yet * a
                none_yet *= 1.0 - a
            for token, token_mass in accepted.items():
                if token_mass > 0:
                    depth(t + 1, [s for s in survivors if rows[s][t] == token], prefix + (token,), token_mass)
            law.add(prefix, none_yet, correction)

        depth(0, list(range(K)), (), 1.0)
        return law.outcomes()
