"""HSD-RRS: hierarchical speculative decoding over K drafts with recursive rejection sampling (Zhou et al., arXiv
2601.05724, ICLR 2026, Appendix G, Algorithm 3), in the paper's reading and as its authors' code runs it
(github ZhouYuxuanYX/Hierarchical-Speculative-Decoding, ``--backward --clever --multidraft K --parallel``).

Shapes: draft_tokens [K, L], draft_probs [K, L, V] (q), target_probs [K, L+1, V] (p).

The drafts are taken in turn. The state is the accepted prefix X^tau (tau = 0 at first), the law rho of the token
after it (p(. | context) at first) and, in the release, the joint ratio R of the prefix along the way (R = 1 at
first). A draft whose first tau tokens are not X^tau is skipped. Otherwise single-draft HSD (hsd.py) runs on its
tokens tau+1..L with rho in place of the target's row at tau, its *sub-block* of n = L - tau tokens:

    l_i = sum_{j < i} log(T_{tau+j}(x_{tau+j+1}) / q(x_{tau+j+1} | X^{tau+j})),  T_tau = rho, T_m = p (m > tau)
    s_i = exp(l_i - max(0, l_1..l_i))                                  prefix="fresh": the sub-block on its own
    s_i = exp(c + l_i - max(0, c, c + l_1..c + l_i)),  c = log R       prefix="carried": the release
    h_i = Z_i / (Z_i + 1 - s_i),  Z_i = sum_x (s_i p(x | X^{tau+i}) - q(x | X^{tau+i}))+   for 0 < i < n
    h_0 = 1,  h_n = s_n (final_test="capped": Eq. 19's min(r*, 1))  or  min(1, exp(l_n)) (final_test="joint")

and its backward scan gives i = the largest depth with eta_i < h_i. i = n: the draft passes whole, with a bonus
token from p(. | X^L), and the iteration ends. Otherwise tau <- tau + i, rho <- norm((s_i T_tau - q(. | X^tau))+)
(Eq. 20; Algorithm 3's "set P*_res as new target distribution"), c <- c + l_i, and the next draft is tried.
After the last draft: X^tau and one token from rho.

Readings. The paper's Algorithm 3 computes h "from Equation (19) based on the corresponding probabilities for the
draft tokens x_{tau+1}, ..., x_gamma" with P*_res and its ratio as the new target at tau + 1: the sub-block on its
own (``prefix="fresh"``, ``final_test="capped"``), the rule ``hsd_rrs``. It is lossless: the sub-block is BV
(hsd.py's capped reading) for the target rho at tau + 1 and p after it, and every state it leaves, (X^tau, rho), is
handed to a later draft, which is an independent draw from q given X^tau once its prefix matches, or to rho itself
(induction over the drafts left; the exact audit measures it). At K = 1 it is BV.
The release (``hsd_rrs_release``) keeps the joint probabilities of the path since the context: the accepted
prefix's joint ratio R starts the sub-block's running maximum (so s_0 = min(1, R) scales the target's row at tau,
and the correction where the draft fails at once is norm((min(1, R) rho - q)+)), and the whole sub-block passes on
its raw joint ratio (``prefix="carried"``, ``final_test="joint"``). At K = 1 it is ``hsd``, which the audit
already finds biased; docs/methods.md gives the audit of both readings and of each change alone.

Where a correction has no mass (probability 0 under the rule; the release would divide 0 by 0 there) the token
comes from the row the correction was taken against (rho or p).

Cost: the sampler reads the block's token ratios and uniforms once, then per tried draft one scalar rho(x) and the
Z of the depths whose test can pass, and one [V] correction where it stops early. ``expected_emitted`` is None
(the replay averages the sampler's draws): the exact value would follow every state (tau, rho) the drafts can
leave, up to C(L + K, K) of them, each with its own [V] law.
"""

from __future__ import annotations

import math

import torch

from spectr_repro.verify.base import Outcome, Verifier, VerifyResult
from spectr_repro.verify.bv import backward_scan, excess_mass, rows_at
from spectr_repro.verify.common import LawBuilder, block_on_host, clipped_stop_probability, normalize, sample, stop_law

PREFIXES = ("fresh", "carried")
FINAL_TESTS = ("capped", "joint")


def log_of(ratio: float) -> float:
    """log of a token ratio, -inf where the target gives the token no mass."""
    return math.log(ratio) if ratio > 0 else -math.inf


def sub_block_tests(step_ratios: list[float], carry: float, prefix: str,
                    final_test: str) -> tuple[list[float], list[float], float]:
    """(s_0..s_n, l_0..l_n, h_n) of one sub-block, host floats: step_ratios = [T(x_{tau+1}) / q(x_{tau+1}), ...]
    (n of them), carry = c = log R of the accepted prefix (used with prefix="carried"). The caller's tests put
    h_0 = 1 in place of s_0 (the scan's floor)."""
    log_ratio = [0.0]
    for ratio in step_ratios:
        log_ratio.append(log_ratio[-1] + log_of(ratio))
    start = carry if prefix == "carried" else 0.0
    scale, running_max = [], max(0.0, start)
    for value in log_ratio:
        running_max = max(running_max, start + value)
        scale.append(math.exp(start + value - running_max) if start + value > -math.inf else 0.0)
    n = len(step_ratios)
    last = scale[n] if final_test == "capped" else min(1.0, math.exp(min(log_ratio[n], 0.0)))
    return scale, log_ratio, last


class HierarchicalRecursiveRejection(Verifier):
    name = "hsd_rrs"
    claimed_lossless = True
    single_draft = False
    default_prefix, default_final_test = "fresh", "capped"

    def __init__(self, prefix: str | None = None, final_test: str | None = None, check_inputs: bool = True) -> None:
        super().__init__(check_inputs=check_inputs)
        prefix = self.default_prefix if prefix is None else prefix
        final_test = self.default_final_test if final_test is None else final_test
        if prefix not in PREFIXES:
            raise ValueError(f"{self.name}: prefix must be one of {PREFIXES}, got {prefix!r}")
        if final_test not in FINAL_TESTS:
            raise ValueError(f"{self.name}: final_test must be one of {FINAL_TESTS}, got {final_test!r}")
        self.prefix, self.final_test = prefix, final_test
        # The paper's reading is lossless (module docstring; measured by the audit); the release's last test is
        # biased already at K = 1, and carrying the prefix's ratio moves the law at K >= 2 (the audit).
        self.lossless = prefix == "fresh" and final_test == "capped"

    # --- one sub-block -------------------------------------------------------------------------------

    def _sub_block(self, ratios_row: list[float], first_ratio: float, tau: int, carry: float):
        """(s_0..s_n, l_0..l_n, h_n) of the draft whose token ratios are ``ratios_row`` from depth tau, where the
        first token's ratio is taken against rho (``first_ratio``)."""
        return sub_block_tests([first_ratio, *ratios_row[tau + 1:]], carry, self.prefix, self.final_test)

    @staticmethod
    def _stops(targets: torch.Tensor, drafts: torch.Tensor, tau: int, scale: list[float], depths: list[int]):
        """h at sub-block depths 0 < i < n (host floats): Z over the rows p, q at tau + i of this draft."""
        absolute = [tau + i for i in depths]
        at = torch.tensor([scale[i] for i in depths], dtype=torch.float64, device=targets.device)
        z = excess_mass(rows_at(targets, absolute), rows_at(drafts, absolute), at).double()
        return clipped_stop_probability(z, at).tolist()

    @staticmethod
    def _correction(rho: torch.Tensor, targets: torch.Tensor, drafts: torch.Tensor, tau: int, depth: int,
                    scale: list[float]) -> torch.Tensor:
        """The law after a draft stopped at sub-depth ``depth`` (absolute tau + depth): norm((s T - q)+), T = rho at
        depth 0 and p below; no mass: T itself."""
        row = rho if depth == 0 else targets[tau + depth]
        weights = torch.mul(row, scale[depth]).sub_(drafts[tau + depth]).clamp_min_(0)
        return normalize(weights, fallback=row)

    @staticmethod
    def _first_ratio(rho: torch.Tensor, drafts: torch.Tensor, tau: int, token: int) -> float:
        """rho(x) / q(x | X^tau) for the draft's token x at depth tau (one host read)."""
        return float(rho[token].double() / drafts[tau, token].double())

    # --- the contract ---------------------------------------------------------------------------------

    def _sample(self, draft_tokens, draft_probs, target_probs, generator, state) -> VerifyResult:
        K, L = draft_tokens.shape
        tokens, rows, ratios, eta = block_on_host(draft_tokens, draft_probs, target_probs, generator)
        tau, rho, carry, ref, rho_is_target = 0, target_probs[0, 0], 0.0, 0, True
        for k in range(K):
            if rows[k][:tau] != rows[ref][:tau]:
                continue  # Algorithm 3, line 21: the draft leaves the accepted prefix
            targets, drafts = target_probs[k], draft_probs[k]
            first = ratios[k][tau] if rho_is_target else self._first_ratio(rho, drafts, tau, rows[k][tau])
            scale, log_ratio, last = self._sub_block(ratios[k], first, tau, carry)
            n = L - tau
            tests = [1.0, *scale[1:n], last]

            def stops(depths: list[int], targets=targets, drafts=drafts, tau=tau, scale=scale) -> list[float]:
                return self._stops(targets, drafts, tau, scale, depths)

            depth = backward_scan(eta[k][tau:], tests, stops)
            if depth == n:
                bonus = sample(targets[L], generator)
                return VerifyResult(torch.cat([tokens[k], bonus.view(1)]), L, k, None)
            rho = self._correction(rho, targets, drafts, tau, depth, scale)
            tau, carry, ref, rho_is_target = tau + depth, carry + log_ratio[depth], k, False
        last_token = sample(rho, generator)
        return VerifyResult(torch.cat([tokens[ref, :tau], last_token.view(1)]), tau, ref, None)

    def _law(self, draft_tokens, draft_probs, target_probs, state) -> list[Outcome]:
        draft_probs, target_probs = draft_probs.double(), target_probs.double()
        K, L = draft_tokens.shape
        rows = [[int(x) for x in row] for row in draft_tokens.tolist()]
        law = LawBuilder()

        def visit(k: int, tau: int, rho: torch.Tensor, carry: float, ref: int, weight: float) -> None:
            if k == K:
                law.add(tuple(rows[ref][:tau]), weight, rho)
                return
            if rows[k][:tau] != rows[ref][:tau]:
                visit(k + 1, tau, rho, carry, ref, weight)
                return
            targets, drafts = target_probs[k], draft_probs[k]
            ratios_row = (targets[torch.arange(L), rows[k]] / drafts[torch.arange(L), rows[k]]).tolist()
            scale, log_ratio, last = self._sub_block(ratios_row, self._first_ratio(rho, drafts, tau, rows[k][tau]),
                                                     tau, carry)
            n = L - tau
            inner = self._stops(targets, drafts, tau, scale, list(range(1, n))) if n > 1 else []
            for depth, prob in enumerate(stop_law([1.0, *inner, last])):
                if prob <= 0:
                    continue
                if depth == n:
                    law.add(tuple(rows[k]), weight * prob, targets[L])
                else:
                    visit(k + 1, tau + depth, self._correction(rho, targets, drafts, tau, depth, scale),
                          carry + log_ratio[depth], k, weight * prob)

        visit(0, 0, target_probs[0, 0], 0.0, 0, 1.0)
        return law.outcomes()


class ReleasedHierarchicalRecursiveRejection(HierarchicalRecursiveRejection):
    """The authors' multi-draft loop: the prefix's joint ratio carried into each sub-block, the raw joint last test."""

    name = "hsd_rrs_release"
    default_prefix, default_final_test = "carried", "joint"
