"""The contract every verification rule follows.

Shapes (K drafts, L draft tokens each, V vocabulary):
    draft_tokens  LongTensor [K, L]
    draft_probs   float      [K, L, V]    row i = q(. | context, draft[:i]), the law token i was drawn from
    target_probs  float      [K, L+1, V]  row i = p(. | context, draft[:i])
p is the target and q the draft, everywhere. Drafts share the context, so drafts whose first i tokens
agree carry the same rows i of q and p (``validate_inputs`` refuses blocks where they differ).

A rule returns the accepted prefix of one draft followed by exactly one more token (a correction
when it stopped early, a bonus from p when the whole block passed). ``law`` gives the exact law of
that outcome for small inputs, by integrating the rule's uniform draws analytically.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from spectr_repro.verify.registry import VERIFIERS


@dataclass(frozen=True)
class VerifyResult:
    tokens: torch.Tensor  # 1-D LongTensor: accepted draft tokens + one correction/bonus token
    num_accepted: int  # = len(tokens) - 1
    draft_index: int  # which draft row the accepted prefix came from
    state: Any = None  # carry-over for the next call (None for rules used "as is")


@dataclass(frozen=True)
class FirstTokenLaw:
    """The exact law of the first token one iteration emits, given the drafts:
    P(y) = sum_k draft_weights[k] 1{y = draft_tokens[k, 0]} + (1 - sum_k draft_weights[k]) residual[y].

    The drafts' first tokens carry what the rule accepts (tau >= 1 on draft k's path); ``residual`` is the law of
    the token emitted when nothing is accepted (tau = 0)."""

    draft_weights: torch.Tensor  # float64 [K]: P(tau >= 1 and the emitted path is draft k's)
    residual: torch.Tensor  # float64 [V], normalised: the law of the correction at depth 0

    @property
    def residual_weight(self) -> float:
        return max(0.0, 1.0 - float(self.draft_weights.sum()))


@dataclass(frozen=True)
class Outcome:
    """One atom of a rule's exact per-iteration law."""

    probability: float
    tokens: tuple[int, ...]
    state: Any = None


class Verifier:
    """Base class: subclasses set the class attributes and implement ``_sample`` and ``_law``.

    Inputs are validated once here (shapes, dtypes, non-negative, normalised rows) so that every
    rule sees the same clean tensors: float32 or float64, never half precision.
    """

    name: str = ""
    lossless: bool = False  # what this harness guarantees (proven by the exact tests)
    claimed_lossless: bool = True  # what the rule's authors claim
    single_draft: bool = False  # True: K > 1 is a ValueError

    def __init__(self, check_inputs: bool = True, **options: Any) -> None:
        self.check_inputs = check_inputs
        if options:
            raise TypeError(f"{self.name}: unknown options {sorted(options)}")

    def __call__(
        self,
        draft_tokens: torch.Tensor,
        draft_probs: torch.Tensor,
        target_probs: torch.Tensor,
        generator: torch.Generator | None = None,
        state: Any = None,
    ) -> VerifyResult:
        if self.check_inputs:
            validate_inputs(draft_tokens, draft_probs, target_probs, self.name, self.single_draft)
        return self._sample(draft_tokens, draft_probs, target_probs, generator, state)

    def law(
        self,
        draft_tokens: torch.Tensor,
        draft_probs: torch.Tensor,
        target_probs: torch.Tensor,
        state: Any = None,
    ) -> list[Outcome]:
        """Exact law of this iteration's outcome given the drafts (small inputs only)."""
        validate_inputs(draft_tokens, draft_probs, target_probs, self.name, self.single_draft)
        return self._law(draft_tokens, draft_probs, target_probs, state)

    def expected_emitted(
        self,
        draft_tokens: torch.Tensor,
        draft_probs: torch.Tensor,
        target_probs: torch.Tensor,
        state: Any = None,
    ) -> torch.Tensor | None:
        """E[tau + 1 | drafts]: the exact conditional expectation of the number of tokens this iteration emits
        (the accepted prefix plus its one extra token), as a 0-dim float64 tensor on the inputs' device, with
        buffers of the order of the inputs and few host reads (each rule states its count: none for sd, bv, gbv
        and for K = 1; the draft tokens for spectr and rbv, plus spectr's rho* pieces). None when the rule has
        no cheap closed form (callers then average draws of the sampler). Inputs are not validated here (the
        engine's calls are not either); ``law`` gives the same number as sum(probability * len(tokens)) on
        small inputs."""
        return None

    def first_token_law(
        self,
        draft_tokens: torch.Tensor,
        draft_probs: torch.Tensor,
        target_probs: torch.Tensor,
    ) -> FirstTokenLaw | None:
        """The exact law of the first token this iteration emits given the drafts, from a fresh state (no carry-over),
        at any vocabulary size, or None when the rule has no cheap form (callers then count the rule's own draws).
        ``law`` gives the same marginal on small inputs (tests/verify/test_first_token_law.py)."""
        return None

    def expected_emitted_by_length(
        self,
        draft_tokens: torch.Tensor,
        draft_probs: torch.Tensor,
        target_probs: torch.Tensor,
        lengths: Sequence[int],
        state: Any = None,
    ) -> dict[int, torch.Tensor] | None:
        """``expected_emitted`` of the sub-blocks of the first L tokens (rows [:, :L], targets [:, :L + 1]), for
        every L in ``lengths``, or None when the rule has no closed form. One call per length here; a rule whose
        work on the longest block contains the shorter ones' (mpbv's path) overrides it to share that work."""
        values = {}
        for L in lengths:
            value = self.expected_emitted(draft_tokens[:, :L], draft_probs[:, :L], target_probs[:, :L + 1], state)
            if value is None:
                return None
            values[L] = value
        return values

    def _sample(self, draft_tokens, draft_probs, target_probs, generator, state) -> VerifyResult:
        raise NotImplementedError

    def _law(self, draft_tokens, draft_probs, target_probs, state) -> list[Outcome]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, lossless={self.lossless})"


def _tolerance(dtype: torch.dtype) -> float:
    return 1e-8 if dtype == torch.float64 else 1e-3


def validate_inputs(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    name: str = "verifier",
    single_draft: bool = False,
) -> None:
    """Raise ValueError with one clear message if the inputs break the contract."""
    for label, value in (("draft_tokens", draft_tokens), ("draft_probs", draft_probs), ("target_probs", target_probs)):
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"{name}: {label} must be a torch.Tensor, got {type(value).__name__}")
    if len({draft_tokens.device, draft_probs.device, target_probs.device}) > 1:
        raise ValueError(f"{name}: inputs on different devices ({draft_tokens.device}, {draft_probs.device}, "
                         f"{target_probs.device})")
    if draft_tokens.dim() != 2:
        raise ValueError(f"{name}: draft_tokens must be a [K, L] LongTensor")
    if draft_tokens.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{name}: draft_tokens must be integer, got {draft_tokens.dtype}")
    K, L = draft_tokens.shape
    if K < 1 or L < 1:
        raise ValueError(f"{name}: need K >= 1 and L >= 1, got draft_tokens of shape {tuple(draft_tokens.shape)}")
    if single_draft and K != 1:
        multi = ", ".join(n for n, spec in VERIFIERS.items() if not spec.single_draft)
        raise ValueError(f"{name} verifies a single draft; got K={K} (use {multi} for K > 1)")
    if draft_probs.dim() != 3 or tuple(draft_probs.shape[:2]) != (K, L):
        raise ValueError(f"{name}: draft_probs must be [K={K}, L={L}, V], got {tuple(draft_probs.shape)}")
    V = draft_probs.shape[2]
    if tuple(target_probs.shape) != (K, L + 1, V):
        raise ValueError(f"{name}: target_probs must be [K={K}, L+1={L + 1}, V={V}], got {tuple(target_probs.shape)}")
    for label, probs in (("draft_probs", draft_probs), ("target_probs", target_probs)):
        if probs.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"{name}: {label} must be float32 or float64 (never half precision), got {probs.dtype}")
        if not bool(torch.isfinite(probs).all()) or bool((probs < 0).any()):
            raise ValueError(f"{name}: {label} has negative or non-finite entries")
        sums = probs.sum(-1, dtype=torch.float64)
        if bool(((sums - 1).abs() > _tolerance(probs.dtype)).any()):
            worst = float((sums - 1).abs().max())
            raise ValueError(f"{name}: {label} rows must sum to 1 (worst deviation {worst:.3g})")
    if bool(((draft_tokens < 0) | (draft_tokens >= V)).any()):
        raise ValueError(f"{name}: draft_tokens out of range [0, {V})")
    drawn = draft_probs.gather(-1, draft_tokens.long().unsqueeze(-1)).squeeze(-1)
    if bool((drawn <= 0).any()):
        raise ValueError(f"{name}: a draft token has probability 0 under the draft_probs it was sampled from")
    if K > 1:
        _check_shared_prefix_rows(draft_tokens, draft_probs, target_probs, name)


def _check_shared_prefix_rows(draft_tokens, draft_probs, target_probs, name: str) -> None:
    """Drafts whose first i tokens agree were drawn in the same context: their rows i must agree."""
    K, L = draft_tokens.shape
    same_token = draft_tokens.unsqueeze(1) == draft_tokens.unsqueeze(0)  # [K, K, L]
    shared = torch.cat([torch.ones(K, K, 1, dtype=torch.long, device=draft_tokens.device),
                        same_token.long().cumprod(-1)], dim=-1)  # [K, K, L+1]: first i tokens agree
    first = shared.argmax(dim=1)  # [K, L+1]: the first draft with row k's prefix at position i
    for label, probs in (("draft_probs", draft_probs), ("target_probs", target_probs)):
        positions = probs.shape[1]
        index = torch.arange(positions, device=probs.device)
        gap = (probs - probs[first[:, :positions], index]).abs().amax(-1)  # [K, positions]
        if bool((gap > _tolerance(probs.dtype)).any()):
            k, i = (int(v) for v in (gap == gap.max()).nonzero()[0])
            raise ValueError(f"{name}: drafts {int(first[k, i])} and {k} share their first {i} token(s) but their "
                             f"{label} rows {i} differ by {float(gap[k, i]):.3g} (drafts share the context)")
