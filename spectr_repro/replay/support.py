"""A block's support: the replay's rules judged on the tokens that carry its mass, the rest pooled into one token.

A real pair's rows are V = 151,936 wide, yet at the temperatures of the paper all but a few hundred to a few thousand
tokens have probabilities below 1e-12 under both models (measured on recorded Qwen2.5-Coder blocks, T = 0.4: 170 to
2,000 tokens keep all but 1e-10 of every row). Every rule's V-wide work (sorts, residual masses, draws) is then
spent on tokens that cannot change its value. ``compact_block`` keeps the tokens some row of the block gives more
than a threshold, under either model, plus the drafted tokens, and pools the rest of each row into one extra
"tail" token with exactly the mass it drops (so every row still sums to what it summed to).

Why the values stay what they were: a rule's value is a sum over tokens of functions of (p(x), q(x)) that are
positive-homogeneous and subadditive in (p, q) (sum_x (w p - c q)+, min(p, q), p - min(p, q), ...), so pooling the
dropped tokens changes any such mass by at most max(w P, c Q) <= the dropped mass of the row, P (target) and Q
(draft). The threshold is chosen per block as the largest power of ten at which no row drops more than
``tail_mass`` (default 1e-9, two orders below the float32 rounding of the rows themselves), so every exact value
moves by at most ~(L + 1) * tail_mass. The drafted tokens are kept by name, so every path's tokens, ratios and
matches are unchanged; Monte-Carlo draws see the same law with a different random stream (a residual draw that
lands in the tail lands on the tail token, which no draft carries, exactly as a dropped token would).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SUPPORT_TAIL_MASS = 1e-9  # the most mass any row of a block may pool into its tail token
_DECADES = 45  # thresholds 1e-1 ... 1e-45 (float32's smallest subnormal is ~1.4e-45): below, nothing is dropped


@dataclass(frozen=True)
class Support:
    """What ``compact_block`` kept: ``kept`` tokens of ``vocabulary``, at most ``dropped_mass`` pooled in a row."""

    vocabulary: int
    kept: int
    threshold: float  # tokens some row gives more than this (or drafted) are kept; 0.0: every token kept
    dropped_mass: float  # the largest mass one row pooled into its tail token


def compact_block(draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                  tail_mass: float = SUPPORT_TAIL_MASS
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Support]:
    """The block on its support plus one tail token: (draft_tokens [K, L], draft_probs [K, L, S + 1],
    target_probs [K, L + 1, S + 1], Support), the tokens renumbered in vocabulary order, the tail token last.

    Returns the block unchanged (``kept == vocabulary``) when pooling would save little (the support holds more
    than half the vocabulary) or no threshold keeps every row's pooled mass within ``tail_mass``. Two host reads
    (the per-decade masses and the support's size)."""
    if not tail_mass > 0:
        raise ValueError(f"tail_mass must be > 0, got {tail_mass!r}")
    V = draft_probs.shape[-1]
    blocks = (draft_probs.reshape(-1, V), target_probs.reshape(-1, V))
    largest = torch.maximum(*(rows.amax(0) for rows in blocks)).float()  # [V]: the most any row gives a token
    # Decade d >= 1 holds the tokens whose largest probability lies in (1e-(d+1), 1e-d]; decade 0 the rest.
    decade = (-largest.clamp_min(1e-45).log10()).floor().clamp_(0, _DECADES).long()  # [V]
    indicator = torch.zeros(V, _DECADES + 1, device=largest.device).scatter_(1, decade[:, None], 1.0)  # [V, D]
    per_decade = torch.cat([_mass_by_decade(rows, indicator) for rows in blocks])  # [R, D] float64
    # Dropping every token with largest <= 1e-d drops the decades >= d: the mass at or beyond d, worst row.
    beyond = per_decade.flip(1).cumsum(1).flip(1).amax(0).tolist()  # [D]
    fits = [d for d in range(1, _DECADES + 1) if beyond[d] <= tail_mass]
    if not fits:
        return draft_tokens, draft_probs, target_probs, Support(V, V, 0.0, 0.0)
    first = fits[0]
    threshold = 10.0 ** -first
    keep = decade < first  # largest > 1e-first (decade 0: > 0.1)
    keep[draft_tokens.reshape(-1).long()] = True  # the drafted tokens, by name, whatever their mass
    kept = int(keep.sum())
    if kept > V // 2:
        return draft_tokens, draft_probs, target_probs, Support(V, V, 0.0, 0.0)
    index = keep.nonzero().squeeze(-1)  # [S]: kept tokens in vocabulary order
    renumber = keep.long().cumsum(0) - 1  # [V]: a kept token's place in ``index``
    compact_tokens = renumber[draft_tokens.long()].to(draft_tokens.dtype)

    def pooled(probs: torch.Tensor) -> torch.Tensor:
        kept_rows = probs.index_select(-1, index)  # [..., S]
        # The mass dropped: a difference of float64 sums of the rows' own values (exact to ~1e-16).
        tail = (probs.sum(-1, keepdim=True, dtype=torch.float64)
                - kept_rows.sum(-1, keepdim=True, dtype=torch.float64)).clamp_min_(0)
        return torch.cat([kept_rows, tail.to(probs.dtype)], -1)

    dropped = max(beyond[first], 0.0)
    return (compact_tokens, pooled(draft_probs), pooled(target_probs),
            Support(V, kept, threshold, dropped))


def _mass_by_decade(rows: torch.Tensor, indicator: torch.Tensor, chunk: int = 64) -> torch.Tensor:
    """Each row's mass in each decade: [R, D] float64, one matrix product with the decades' indicator [V, D] (built
    once a block, shared by the draft's and the target's rows; float32 accumulation: the sums are compared with
    ``tail_mass`` to within ~1e-6 of themselves), ``chunk`` rows at a time."""
    return torch.cat([rows[lo : lo + chunk].float() @ indicator for lo in range(0, rows.shape[0], chunk)]).double()


__all__ = ["SUPPORT_TAIL_MASS", "Support", "compact_block"]
