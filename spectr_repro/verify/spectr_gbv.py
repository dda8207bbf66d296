"""SpecTr-GBV exactly as the authors released it (github junemily/SpecTr-GBV, src/engine.py), K drafts.

Replicated from docs/methods.md and a reading of the released code (not copied). φ(a) = (1 − a)^K, eps = 1e-20.
For draft j = 0..K−1 in order, with τ the accepted length when draft j starts:
  (Q, P) start as the products of draft j's OWN first τ tokens (even if they differ from the accepted
  prefix); for i = τ+1..L−1 they are extended by token i, and with P_v = P·p(v|x^i), Q_v = Q·q(v|x^i),
  c_v = min(1, Q_v / (P_v + eps)), c = min(1, Q / (P + eps)):
      h = [Σ_v P_v φ(c_v) − P φ(c)] / (1 − (1−Q)^K − Σ_v P_v (1 − φ(c_v)) + eps);
  a uniform u is drawn, THEN the prefix x^i of draft j is skipped if it is in ``seen``; otherwise u < h
  accepts it (τ = i, selected = j, (Q, P) remembered) and u ≥ h adds it to ``seen``.
  At i = L (no ``seen`` test): h_L = P·(1 − φ(min(1, Q/(P + eps)))) / (1 − (1−Q)^K + eps); acceptance
  sets τ = L and ends the loop over drafts.
After the loop: τ < L gives a correction from r(v) ∝ P·p(v|x^τ)·(1 − min(1, Q·q(v|x^τ)/(P·p(v|x^τ) + eps))^K)
with the remembered (Q, P) of the selected draft (the release's operator precedence puts the power on
the min; (Q, P) = (1, 1) and draft 0 when nothing was accepted); τ = L gives a bonus from p(·|x^L).
No state is carried to the next iteration. Not lossless for K ≥ 2 (see tests/verify/test_spectr_gbv.py).

Deliberate differences from the release (none changes the rule in exact arithmetic):
  * the products P, Q and every per-prefix scalar are float64, and the vocabulary-wide terms are
    formed from p, q with coefficients (Q, P, eps)/max(Q, P, eps) ≤ 1 in the input dtype (float32 in
    the engine, float64 in the exact tests), so nothing underflows (1 − (1 − Q)^K still cancels, but
    only below Q ~ 1e-16 instead of float32's 3e-8; the release holds its rows in the model dtype,
    float16 by default, and computes the products and h in float32: see ``arithmetic`` below);
    tests/verify/test_dtype_consistency.py checks the float32 law against the float64 one;
  * the sampler computes a draft's prefix tests only when the scan runs them (not for prefixes already
    rejected, nor for a draft whose full block passes); the uniforms are drawn exactly as released;
  * a correction residual with no mass (the release would crash in torch.multinomial) falls back to p;
  * uniforms come from the caller's generator.

``arithmetic`` (default ``"float64"``, the replica above) selects the release's own arithmetic instead:
``"release_fp16"`` / ``"release_bf16"`` / ``"release_fp32"`` run the rule as the release computes it with
``--dtype float16`` (its default) / ``bfloat16`` / ``float32``. Reading of src/engine.py, kvcache.py, util.py:
the probability rows are the model-dtype softmax (``prob_history``), but the running products m_s, m_b start
as ``torch.ones(1)`` and eps, one as ``torch.tensor(...)``: float32 tensors with a dimension, so by torch's
promotion every product, ratio, power, sum and h is computed in float32 from the half values (eps = 1e-20
is a normal float32 number and keeps its value; nothing is computed in half precision). So the option
rounds the rows it is given to the model dtype (inputs stay float32 by contract: the engine's rows, rounded
as the release's softmax output would be) and then repeats the release's float32 operations in its order:
products token by token from 1, ratio = (Q·q)/(P·p + eps), φ(x) = torch.pow(1 − x, K), the sums over the
vocabulary, h = num/(den + eps), the residual (P·p)·(1 − min(Q·q/(P·p + eps), 1)^K) normalised, and the
bonus from the rounded target row (torch.multinomial normalises it). What float32 does to the rule: with
Q < 2^-25 (≈ 3e-8), 1 − Q rounds to 1, so 1 − (1 − Q)^K = 0 and the full-block test divides by eps alone
(h = P·(…)/1e-20: the block is accepted whenever P·(…) > 1e-20); for Q up to ~1e-5 the cancellation errs by
≥ 1 %. Not modelled (outside the rule's arithmetic): the logits/T division in half precision before the
release's softmax, its float32 uniforms (2^-24 granularity), the GPU's order of summation over the
vocabulary, and drafts drawn from the rounded draft rows (ours come from the float32 rows the engine drew
them from). No carry-over (the release has none).

``carry_over=True`` (not in the release) threads the carry-over target of
``spectr_repro.verify.carry_over`` with the residual of power K (the release's correction form), so the
correction is the first token drawn from the carried target. At K = 1, φ(a) = 1 − a and
1 − a^1 = 1 − a, so h, h_L and the correction reduce algebraically to GBV's (h = [Σ_v (P_v − Q_v)₊ −
(P − Q)₊] / Σ_v (Q_v − P_v)₊ = Z/(Z + 1 − g) with g = min(1, P/Q); h_L = min(P, Q)/Q = g_L; the correction
is (P·p − Q·q)₊), ``seen`` never triggers with one draft, and the power-1 frame is GBV's: the rule then
equals ``gbv`` (up to the eps guards, which only act on degenerate 0/0 inputs).

The decomposition of the release's bias (docs/theory.md, ``python -m spectr_repro theory --decomposition``)
corrects it one step at a time through two more options, both off by default (the release):
``clamp_h=True`` clamps every h to [0, 1] before its test (the law cannot move: a uniform u < h already
accepts always when h > 1 and never when h < 0; the step shows that h leaving [0, 1] is not where the bias
comes from); ``residual="coupling"`` draws the correction from P·p(v)·(1 − min(1, Q·q(v)/(P·p(v))))^K, the
target mass the paper's conditionally independent coupling leaves at v (the power on 1 − c, the form the
numerator of h sums), instead of the release's 1 − min(...)^K; with ``carry_over=True`` the carried frames use
the same form. ``h_excursions`` reports where h leaves [0, 1] on a block.

Shapes: draft_tokens [K, L], draft_probs [K, L, V], target_probs [K, L+1, V] (see verify.base).
"""

from __future__ import annotations

import math

import torch

from spectr_repro.verify.base import FirstTokenLaw, Outcome, Verifier, VerifyResult
from spectr_repro.verify.carry_over import effective_targets, integer_power, next_state, resolve_frames
from spectr_repro.verify.common import normalize, sample, uniform

EPS = 1e-20  # the release's guard on every division

# arithmetic option -> dtype the release holds its probability rows in (None: the float64 replica).
ARITHMETICS = {"float64": None, "release_fp16": torch.float16, "release_bf16": torch.bfloat16,
               "release_fp32": torch.float32}
RESIDUALS = ("release", "coupling")  # the correction's form: 1 − c^K (as released) or (1 − c)^K


class SpecTrGBV(Verifier):
    name = "spectr_gbv"
    lossless = False
    claimed_lossless = True
    single_draft = False

    def __init__(self, carry_over: bool = False, arithmetic: str = "float64", clamp_h: bool = False,
                 residual: str = "release", check_inputs: bool = True) -> None:
        super().__init__(check_inputs=check_inputs)
        self.carry_over = bool(carry_over)
        if arithmetic not in ARITHMETICS:
            raise ValueError(f"spectr_gbv: arithmetic must be one of {', '.join(ARITHMETICS)}, got {arithmetic!r}")
        if residual not in RESIDUALS:
            raise ValueError(f"spectr_gbv: residual must be one of {', '.join(RESIDUALS)}, got {residual!r}")
        if (carry_over or residual != "release") and arithmetic != "float64":
            raise ValueError(f"spectr_gbv: arithmetic={arithmetic!r} reproduces the release, which has no "
                             "carry-over and the release's residual; use it with the default options")
        self.arithmetic = arithmetic
        self.row_dtype = ARITHMETICS[arithmetic]  # None: the float64 replica
        self.clamp_h = bool(clamp_h)
        self.residual = residual

    # --- the rule -------------------------------------------------------------------------------------

    def _block(self, draft_tokens, draft_probs, target_probs, state):
        """Effective targets and the joint products P, Q [K, L+1] float64 (column i: first i tokens).

        P and Q are products of up to L probabilities (they underflow float32 quickly): float64 scalars.
        """
        K, L = draft_tokens.shape
        frames = resolve_frames(state, L, self.name, self.carry_over)
        effective = effective_targets(draft_tokens, draft_probs, target_probs, frames)
        if self.row_dtype is not None:
            return effective, _release_products(effective.token_target), _release_products(effective.token_draft)
        ones = torch.ones(K, 1, dtype=torch.float64, device=effective.token_target.device)
        P = torch.cat([ones, torch.cumprod(effective.token_target, 1)], 1)
        Q = torch.cat([ones, torch.cumprod(effective.token_draft, 1)], 1)
        return effective, P, Q

    def _full_block_h(self, P, Q, K: int) -> torch.Tensor:
        """h of each draft's full block [K] (float64): P·(1 − φ(min(1, Q/P))) / (1 − φ(Q))."""
        if self.row_dtype is not None:
            return self._clamped(_release_full_block_h(P[:, -1], Q[:, -1], K))
        P_L, Q_L = P[:, -1], Q[:, -1]
        c_full = torch.clamp(Q_L / (P_L + EPS), max=1)
        return self._clamped(P_L * (1 - (1 - c_full) ** K) / (1 - (1 - Q_L) ** K + EPS))

    def _clamped(self, h: torch.Tensor) -> torch.Tensor:
        """h clamped to [0, 1] with ``clamp_h`` (the test u < h cannot tell the difference), else as computed."""
        return h.clamp(0, 1) if self.clamp_h else h

    def _prefix_h(self, target_rows, draft_rows, P, Q, K: int) -> torch.Tensor:
        """h of prefixes from their rows: target_rows, draft_rows [n, V] = p, q after each prefix;
        P, Q [n] float64 = the prefix products. Returns [n] float64.

        With P_v = P·p_v, Q_v = Q·q_v and S = Σ_v p_v φ(c_v):  Σ_v P_v φ(c_v) = P·S and
        Σ_v P_v (1 − φ(c_v)) = P·(Σ_v p_v − S), so only S and Σ_v p_v need the vocabulary.
        c_v = Q_v/(P_v + eps) = a·q_v/(b·p_v + e) with (a, b, e) = (Q, P, eps)/max(Q, P, eps) ≤ 1: the
        long products never enter the input dtype, e ≥ 1e−20 keeps every denominator positive, and a
        coefficient that rounds to 0 in float32 (< 1e−45 times the largest) changes c_v only where it
        is < 1e−25 or p_v is negligible. 1 − c_v is formed as max(0, (b·p_v + e − a·q_v)/(b·p_v + e)).
        """
        if self.row_dtype is not None:
            return self._clamped(_release_prefix_h(target_rows, draft_rows, P, Q, K))
        scale = torch.stack([Q, P, torch.full_like(P, EPS)]).amax(0)
        a, b, e = ((x / scale).to(target_rows.dtype).unsqueeze(-1) for x in (Q, P, torch.full_like(P, EPS)))
        n, V = target_rows.shape
        denominator, one_minus_c = self._buffers(n, V, target_rows.dtype, target_rows.device)
        torch.mul(target_rows, b, out=denominator).add_(e)  # b·p + e (addcmul broadcasting e is ~3x slower)
        torch.addcmul(denominator, draft_rows, a, value=-1, out=one_minus_c).div_(denominator).clamp_(min=0)
        phi = integer_power(one_minus_c, K, out=denominator)  # φ(c_v) = (1 − c_v)^K
        S = phi.mul_(target_rows).sum(-1).double()  # in place: φ's buffer is not needed after this
        sum_p = target_rows.sum(-1).double()
        c = torch.clamp(Q / (P + EPS), max=1)
        numerator = P * (S - (1 - c) ** K)
        denominator_h = 1 - (1 - Q) ** K - P * (sum_p - S)
        return self._clamped(numerator / (denominator_h + EPS))

    def _buffers(self, n: int, V: int, dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
        """Two scratch tensors [n, V], kept between calls (the engine calls once per iteration with the
        same shapes): writing into warm memory is several times faster than into fresh allocations."""
        cached = getattr(self, "_scratch", None)
        if cached is None or cached.dtype != dtype or cached.device != device or cached.shape[1] < n * V:
            cached = torch.empty(2, max(n * V, 1), dtype=dtype, device=device)
            self._scratch = cached
        return cached[0, : n * V].view(n, V), cached[1, : n * V].view(n, V)

    def _draft_prefix_h(self, effective, draft_probs, P, Q, j: int, positions: list[int],
                        K: int) -> list[float]:
        """h of draft j's prefixes of lengths i + 1 for i in ``positions`` (increasing), as floats."""
        rows = [i + 1 for i in positions]
        target_rows = effective.rows(j, rows)
        lo, hi = rows[0], rows[-1] + 1
        draft_rows = draft_probs[j, lo:hi] if hi - lo == len(rows) else draft_probs[j, rows]
        index = torch.tensor(rows, device=P.device)
        return self._prefix_h(target_rows, draft_rows, P[j, index], Q[j, index], K).tolist()

    def _h_table(self, effective, draft_probs, P, Q, K: int, L: int) -> list[list[float]]:
        """The whole table h[j][i] (prefix length i + 1): every draft's prefixes in one batch, one host read."""
        h_last = self._full_block_h(P, Q, K)
        if L == 1:
            return h_last[:, None].tolist()
        lengths = list(range(1, L))
        target_rows = torch.cat([effective.rows(j, lengths) for j in range(K)])  # [K (L - 1), V]
        draft_rows = draft_probs[:, 1:L].reshape(K * (L - 1), -1)
        inner = self._prefix_h(target_rows, draft_rows, P[:, 1:L].reshape(-1), Q[:, 1:L].reshape(-1), K)
        return torch.cat([inner.view(K, L - 1), h_last[:, None]], 1).tolist()

    def _correction_weights(self, target_rows, draft_rows, P, Q, K: int):
        """Unnormalised correction [..., V]: P·p·(1 − min(1, Q·q/(P·p + eps))^K) / max(Q, P, eps).

        The power on the min, as released. Same rescaling as ``_prefix_h``: the rows stay in their dtype.
        """
        if self.row_dtype is not None:
            return _release_correction_weights(target_rows, draft_rows, P, Q, K)
        scale = torch.stack([Q, P, torch.full_like(P, EPS)]).amax(0)
        dtype = target_rows.dtype
        a, b, e = ((x / scale).to(dtype).unsqueeze(-1) for x in (Q, P, torch.full_like(P, EPS)))
        P_v = torch.mul(target_rows, b)
        c = torch.mul(draft_rows, a).div_(P_v + e).clamp_(max=1)
        if self.residual == "coupling":  # P_v·(1 − c)^K: what the coupling leaves at v
            return P_v.mul_(integer_power(c.neg_().add_(1), K))
        return P_v.addcmul_(P_v, integer_power(c, K), value=-1)  # P_v·(1 − c^K)

    def _correction_law(self, target_rows, draft_rows, P, Q, K: int):
        """Correction law(s) [..., V] from rows [..., V] and the selected draft's P, Q [...]."""
        weights = self._correction_weights(target_rows, draft_rows, P, Q, K)
        if self.row_dtype is not None:  # sampling from float32 weights draws from their exact normalisation
            weights, target_rows = weights.double(), target_rows.double()
        return normalize(weights, fallback=target_rows)

    def _rows_for_arithmetic(self, draft_probs, target_probs):
        """The rows the rule computes with: as given (float64 replica), or rounded to the release's dtype."""
        if self.row_dtype is None:
            return draft_probs, target_probs
        return _release_rows(draft_probs, self.row_dtype), _release_rows(target_probs, self.row_dtype)

    def _state_after(self, effective, draft_probs, target_probs, P, Q, selected, tau, last_token, K, L):
        if not self.carry_over:
            return None
        new_frame = None
        if tau < L:
            num = float(P[selected, tau]) * float(effective.row(selected, tau)[last_token])
            den = float(Q[selected, tau]) * float(draft_probs[selected, tau, last_token])
            new_frame = (math.log(num) if num > 0 else -math.inf) - (math.log(den) if den > 0 else -math.inf)
        return next_state(effective, draft_probs, target_probs, selected, tau, last_token, new_frame, K, L,
                          coupling=self.residual == "coupling")

    def _sample(self, draft_tokens, draft_probs, target_probs, generator, state) -> VerifyResult:
        K, L = draft_tokens.shape
        draft_probs, target_probs = self._rows_for_arithmetic(draft_probs, target_probs)
        effective, P, Q = self._block(draft_tokens, draft_probs, target_probs, state)
        h_last = self._full_block_h(P, Q, K).tolist()
        drafts = draft_tokens.tolist()
        # One uniform per test slot (j, i); the release draws it before the `seen` test.
        draws = uniform(K * L, generator, device=None if generator is not None else P.device).tolist()
        tau, selected = 0, 0
        seen: set[tuple[int, ...]] = set()
        for j in range(K):
            if draws[j * L + L - 1] < h_last[j]:
                # The full block passes: draft j's prefix tests cannot change the outcome, skip their h.
                tau, selected = L, j
                break
            # The tests draft j runs are fixed when it starts: i from τ up, prefixes not yet rejected
            # (its own rejections are shorter than its later prefixes, so they never skip one of them).
            positions = [i for i in range(tau, L - 1) if tuple(drafts[j][: i + 1]) not in seen]
            if not positions:
                continue
            h_j = self._draft_prefix_h(effective, draft_probs, P, Q, j, positions, K)
            for i, h_i in zip(positions, h_j):
                if draws[j * L + i] < h_i:
                    tau, selected = i + 1, j
                else:
                    seen.add(tuple(drafts[j][: i + 1]))
        if tau == L:
            last_weights = effective.row(selected, L)
        else:
            target_row = effective.row(selected, tau)
            last_weights = self._correction_weights(target_row, draft_probs[selected, tau], P[selected, tau],
                                                    Q[selected, tau], K)
            if not bool(last_weights.sum() > 0):  # no residual mass (a probability-0 event): fall back to p
                last_weights = target_row
        last_token = int(sample(last_weights, generator))  # sample needs no normalising
        tokens = torch.cat([draft_tokens[selected, :tau].long(),
                            torch.tensor([last_token], dtype=torch.long, device=draft_tokens.device)])
        new_state = self._state_after(effective, draft_probs, target_probs, P, Q, selected, tau, last_token,
                                      K, L)
        return VerifyResult(tokens, tau, selected, new_state)

    def _scan_law(self, drafts: list[list[int]], h_table: list[list[float]], K: int, L: int,
                  track_selected: bool = True) -> dict:
        """Exact law of (τ, selected) after the scan: a dynamic programme over (τ, selected, seen).

        ``seen`` only matters through the prefixes a later draft can test, so each state keeps seen ∩ the
        later drafts' prefixes (states that differ elsewhere are merged): the programme stays small when the
        drafts share prefixes, as real drafts do. ``track_selected=False`` merges states over the selected
        draft (selected = 0 in the keys): enough for the law of τ alone (``expected_emitted``).
        """
        later = [set() for _ in range(K + 1)]  # later[j]: prefixes of drafts j..K-1 a test can meet
        for j in range(K - 1, -1, -1):
            later[j] = later[j + 1] | {tuple(drafts[j][: i + 1]) for i in range(L - 1)}

        def accept_probability(value: float) -> float:
            return 0.0 if value != value else min(1.0, max(0.0, value))  # P(u < h), NaN never accepts

        def add(table: dict, key, weight: float) -> None:
            table[key] = table.get(key, 0.0) + weight

        finished: dict[tuple[int, int], float] = {}
        states: dict[tuple[int, int, frozenset], float] = {(0, 0, frozenset()): 1.0}
        for j in range(K):
            useful = later[j + 1]  # a rejection of draft j matters only if a later draft can test it
            mark = j if track_selected else 0
            following: dict[tuple[int, int, frozenset], float] = {}
            for (tau_start, sel_start, seen_start), weight in states.items():
                branches = {(tau_start, sel_start, seen_start): weight}
                for i in range(tau_start, L - 1):
                    prefix = tuple(drafts[j][: i + 1])
                    a = accept_probability(h_table[j][i])
                    grown: dict[tuple[int, int, frozenset], float] = {}
                    for (tau, sel, seen), w in branches.items():
                        if prefix in seen:
                            add(grown, (tau, sel, seen), w)
                            continue
                        if a > 0:
                            add(grown, (i + 1, mark, seen), w * a)
                        if a < 1:
                            add(grown, (tau, sel, seen | {prefix} if prefix in useful else seen), w * (1 - a))
                    branches = grown
                a_full = accept_probability(h_table[j][L - 1])
                for (tau, sel, seen), w in branches.items():
                    if a_full > 0:
                        add(finished, (L, mark), w * a_full)
                    if a_full < 1:  # an earlier draft's rejection no later draft can test is dropped
                        add(following, (tau, sel, seen & useful), w * (1 - a_full))
            states = following
        for (tau, sel, _), weight in states.items():
            finished[(tau, sel)] = finished.get((tau, sel), 0.0) + weight
        return finished

    def expected_emitted(self, draft_tokens, draft_probs, target_probs, state=None) -> torch.Tensor:
        """E[τ + 1 | drafts], exact: the scan's law of τ (the programme of ``_law``, merged over the selected
        draft) from the table of every prefix's h, one [L − 1, V] pass per draft; no correction law is built.
        Host reads: the draft tokens and the h table (one each)."""
        K, L = draft_tokens.shape
        draft_probs, target_probs = self._rows_for_arithmetic(draft_probs, target_probs)
        effective, P, Q = self._block(draft_tokens, draft_probs, target_probs, state)
        drafts = draft_tokens.tolist()
        h_table = self._h_table(effective, draft_probs, P, Q, K, L)
        law = self._scan_law(drafts, h_table, K, L, track_selected=False)
        mean = sum(weight * (tau + 1) for (tau, _), weight in law.items())
        return torch.tensor(mean, dtype=torch.float64, device=draft_probs.device)

    def sampled_lengths(self, draft_tokens, draft_probs, target_probs, generators) -> list[int]:
        """τ of one run of the sampler per generator, from a fresh state, as ``__call__`` gives them draw by draw,
        but with the table of every prefix's h built once for all the draws (the replay's Monte-Carlo estimate
        takes 16 draws of every (K, L, row group); the sampler rebuilt the h of each draft's prefixes at every
        draw). Each draw consumes its generator's K·L uniforms as the sampler does; no correction is drawn (it
        does not change τ). tests/replay/test_release_k1.py checks τ draw by draw against the sampler."""
        K, L = draft_tokens.shape
        draft_probs, target_probs = self._rows_for_arithmetic(draft_probs, target_probs)
        effective, P, Q = self._block(draft_tokens, draft_probs, target_probs, None)
        h_table = self._h_table(effective, draft_probs, P, Q, K, L)
        drafts = draft_tokens.tolist()
        return [self._scan_draw(drafts, h_table, uniform(K * L, generator).tolist(), K, L)
                for generator in generators]

    @staticmethod
    def _scan_draw(drafts: list[list[int]], h_table: list[list[float]], draws: list[float], K: int, L: int) -> int:
        """τ of the sampler's scan (``_sample``) with uniforms ``draws`` [K·L] and the h table."""
        tau = 0
        seen: set[tuple[int, ...]] = set()
        for j in range(K):
            if draws[j * L + L - 1] < h_table[j][L - 1]:
                return L
            for i in range(tau, L - 1):
                prefix = tuple(drafts[j][: i + 1])
                if prefix in seen:
                    continue
                if draws[j * L + i] < h_table[j][i]:
                    tau = i + 1
                else:
                    seen.add(prefix)
        return tau

    def scan_law(self, draft_tokens, draft_probs, target_probs, state=None) -> dict[tuple[int, int], float]:
        """Exact law of (τ, selected draft) after the scan, the rule's uniforms integrated: {(τ, j): probability}.

        The accepted prefix is draft j's first τ tokens. Used by the decomposition (spectr_repro.theory) to build
        the law of the selection actually made over every draft set."""
        K, L = draft_tokens.shape
        draft_probs, target_probs = self._rows_for_arithmetic(draft_probs, target_probs)
        effective, P, Q = self._block(draft_tokens, draft_probs, target_probs, state)
        h_table = self._h_table(effective, draft_probs, P, Q, K, L)
        return self._scan_law(draft_tokens.tolist(), h_table, K, L)

    def h_excursions(self, draft_tokens, draft_probs, target_probs, state=None, undefined: bool = False,
                     tolerance: float = 1e-9) -> list[tuple[int, int, float]]:
        """Where the h this rule computes on a block leaves [0, 1], before any clamping: (draft j, prefix length
        i + 1, h) for every test slot (every prefix of every draft, whether the scan reaches it or not), NaN
        included. h outside [0, 1] is what ``clamp_h`` clamps; the release's test u < h clamps it implicitly.

        In exact arithmetic h is in [0, 1] wherever it is defined (docs/theory.md); it is 0/0 where its denominator
        vanishes (e.g. K = 1, P >= Q and Q·q_v <= P·p_v for every v), and there round-off decides its value. Such
        slots are left out unless ``undefined=True``: they are recognised by recomputing the denominator in float64
        from the products, |denominator| <= 1e-9·(1 − (1 − Q)^K). ``tolerance``: h within [−tolerance, 1 + tolerance]
        counts as inside (round-off of a value at 0 or 1)."""
        K, L = draft_tokens.shape
        raw = SpecTrGBV(carry_over=self.carry_over, arithmetic=self.arithmetic, residual=self.residual,
                        check_inputs=False)  # the same rule with h as computed
        draft_probs, target_probs = raw._rows_for_arithmetic(draft_probs, target_probs)
        effective, P, Q = raw._block(draft_tokens, draft_probs, target_probs, state)
        h_table = raw._h_table(effective, draft_probs, P, Q, K, L)
        out = []
        for j, row in enumerate(h_table):
            for i, h in enumerate(row):
                if -tolerance <= h <= 1.0 + tolerance:
                    continue
                if undefined or i == L - 1 or not _vanishing_denominator(
                        effective.row(j, i + 1).double(), draft_probs[j, i + 1].double(), float(P[j, i + 1]),
                        float(Q[j, i + 1]), K):
                    out.append((j, i + 1, h))
        return out

    def first_token_law(self, draft_tokens, draft_probs, target_probs) -> FirstTokenLaw:
        """Exact, from a fresh state: the scan's law of (tau, selected) puts P(tau >= 1, selected = k) on draft k's
        first token; tau = 0 (nothing accepted, draft 0's frame with P = Q = 1) emits the depth-0 correction
        p (1 - min(1, q/p)^K), normalised. Cost: ``expected_emitted``'s (the h table, one host read) plus one
        [V] correction row."""
        K, L = draft_tokens.shape
        draft_probs, target_probs = self._rows_for_arithmetic(draft_probs, target_probs)
        effective, P, Q = self._block(draft_tokens, draft_probs, target_probs, None)
        h_table = self._h_table(effective, draft_probs, P, Q, K, L)
        weights = [0.0] * K
        for (tau, selected), weight in self._scan_law(draft_tokens.tolist(), h_table, K, L).items():
            if tau >= 1:
                weights[selected] += weight
        residual = self._correction_law(effective.row(0, 0), draft_probs[0, 0], P[0, 0], Q[0, 0], K)
        return FirstTokenLaw(torch.tensor(weights, dtype=torch.float64, device=draft_probs.device),
                             residual.double())

    def _law(self, draft_tokens, draft_probs, target_probs, state) -> list[Outcome]:
        K, L = draft_tokens.shape
        draft_probs, target_probs = self._rows_for_arithmetic(draft_probs, target_probs)
        effective, P, Q = self._block(draft_tokens, draft_probs, target_probs, state)
        drafts = [[int(t) for t in row] for row in draft_tokens.tolist()]
        # Every possible last-token law at once: corrections after τ < L tokens, bonus after L.
        target = effective.probs
        corrections = self._correction_law(target[:, :L], draft_probs, P[:, :L], Q[:, :L], K)
        bonus = target[:, L:].to(corrections.dtype)
        if self.row_dtype is not None:  # the rounded row, as torch.multinomial normalises it
            bonus = normalize(bonus.double())
        last_laws = torch.cat([corrections, bonus.to(corrections.dtype)], 1).double().tolist()
        merged: dict = {}
        h_table = self._h_table(effective, draft_probs, P, Q, K, L)
        for (tau, selected), weight in self._scan_law(drafts, h_table, K, L).items():
            if weight <= 0:
                continue
            for last_token, p_last in enumerate(last_laws[selected][tau]):
                if p_last <= 0:
                    continue
                tokens = tuple(drafts[selected][:tau]) + (last_token,)
                new_state = self._state_after(effective, draft_probs, target_probs, P, Q, selected, tau,
                                              last_token, K, L)
                key = (tokens, new_state)
                merged[key] = merged.get(key, 0.0) + weight * p_last
        return [Outcome(p, tokens, st) for (tokens, st), p in merged.items()]


def _vanishing_denominator(target_row, draft_row, P: float, Q: float, K: int) -> bool:
    """Whether h's denominator 1 − (1 − Q)^K − Σ_v P·p_v·(1 − (1 − c_v)^K) of a prefix is 0 up to round-off
    (float64, relative to 1 − (1 − Q)^K): h is then 0/0 in exact arithmetic."""
    coverage = 1 - (1 - Q) ** K
    c = torch.clamp(Q * draft_row / (P * target_row + EPS), max=1)
    denominator = coverage - P * float((target_row * (1 - (1 - c) ** K)).sum())
    return abs(denominator) <= 1e-9 * coverage


# --- the release's arithmetic (arithmetic="release_*"): float32 operations in the release's order --------


def _release_rows(probs: torch.Tensor, row_dtype: torch.dtype) -> torch.Tensor:
    """Rows rounded to ``row_dtype`` and held in float32 (exact: every half value is a float32), a new tensor.

    float32 is the dtype torch promotes the release's half rows to when it multiplies them by its float32
    m_s, m_b. The rounded rows are not renormalised: the release uses them as its softmax left them.
    """
    return probs.to(row_dtype).to(torch.float32, copy=True)


def _release_products(token_probs: torch.Tensor) -> torch.Tensor:
    """[K, L] probabilities of the drafted tokens -> [K, L+1] float32 running products, column i: first i tokens.

    m = 1, then m = m·prob token by token (the release's loop; a float32 product of up to L factors).
    """
    token_probs = token_probs.to(torch.float32)
    K, L = token_probs.shape
    products = torch.ones(K, L + 1, dtype=torch.float32, device=token_probs.device)
    for i in range(L):  # sequential, as released (a float32 cumprod need not multiply in this order)
        products[:, i + 1] = products[:, i] * token_probs[:, i]
    return products


def _release_constants(K: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(one, eps, k) as the release makes them: float32 1.0 and 1e-20, and K as an integer tensor."""
    one = torch.tensor(1.0, dtype=torch.float32, device=device)
    eps = torch.tensor(EPS, dtype=torch.float32, device=device)
    return one, eps, torch.tensor(K, device=device)


def _release_full_block_h(P_L: torch.Tensor, Q_L: torch.Tensor, K: int) -> torch.Tensor:
    """[K] float32: (m_b·(1 − φ(min(m_s/(m_b + eps), 1)))) / (1 − φ(m_s) + eps), φ(x) = (1 − x)^K."""
    one, eps, k = _release_constants(K, P_L.device)
    ratio = torch.minimum(Q_L / (P_L + eps), one)
    return (P_L * (1 - torch.pow(one - ratio, k))) / (1 - torch.pow(one - Q_L, k) + eps)


def _release_prefix_h(target_rows, draft_rows, P, Q, K: int) -> torch.Tensor:
    """h of n prefixes [n] float32 from float32 rows [n, V] (p, q after each prefix) and products P, Q [n].

    numerator = Σ_v (m_b·p_v)·φ(min_v) − m_b·φ(min(m_s/(m_b + eps), 1)), min_v = min((m_s·q_v)/(m_b·p_v + eps), 1);
    denominator = 1 − φ(m_s) − Σ_v (m_b·p_v)·(1 − φ(min_v)); h = numerator / (denominator + eps).
    """
    one, eps, k = _release_constants(K, target_rows.device)
    m_b, m_s = P.to(torch.float32).unsqueeze(-1), Q.to(torch.float32).unsqueeze(-1)
    weighted = m_b * target_rows  # [n, V]
    min_ratio = torch.minimum((m_s * draft_rows) / (m_b * target_rows + eps), one)
    phi = torch.pow(one - min_ratio, k)
    raw_ratio = torch.minimum(m_s / (m_b + eps), one).squeeze(-1)
    numerator = torch.sum(weighted * phi, -1) - m_b.squeeze(-1) * torch.pow(one - raw_ratio, k)
    denominator = one - torch.pow(one - m_s.squeeze(-1), k) - torch.sum(weighted * (one - phi), -1)
    return numerator / (denominator + eps)


def _release_correction_weights(target_rows, draft_rows, P, Q, K: int) -> torch.Tensor:
    """Unnormalised correction [..., V] float32: (m_b·p)·(1 − min((m_s·q)/(m_b·p + eps), 1)^K)."""
    one, eps, k = _release_constants(K, target_rows.device)
    m_b, m_s = P.to(torch.float32).unsqueeze(-1), Q.to(torch.float32).unsqueeze(-1)
    ratio = (m_s * draft_rows) / (m_b * target_rows + eps)
    return m_b * target_rows * (one - torch.pow(torch.minimum(ratio, one), k))
