"""Drafting: K independent drafts of L tokens as K rows of one batch, with the draft's KV cache."""

from __future__ import annotations

import torch

from spectr_repro.engine.rows import DynamicRows, StaticRows
from spectr_repro.sampling import probs_from_logits, sample


def first_draft_probs(rows: DynamicRows | StaticRows, pending: torch.Tensor, temperature: float) -> torch.Tensor:
    """q at the first draft position, [V] float32: feeds ``pending`` (1-D) as text every row shares.

    rows: the draft's cache holding the committed text except ``pending`` (the whole prompt on the
        first iteration, then the last emitted token, sometimes two).
    The prompt is thus prefilled by the same call that yields q, never by a call of its own.
    """
    return probs_from_logits(rows.feed_shared(pending), temperature)


def draft_block(
    rows: DynamicRows | StaticRows,
    first_probs: torch.Tensor,
    K: int,
    L: int,
    temperature: float,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample K drafts of L tokens i.i.d. from q, starting from ``first_draft_probs``'s output.

    rows: the draft's cache, every row holding the whole committed text.
    Returns draft_tokens [K, L] and draft_probs [K, L, V] (float32), row i of draft_probs being
    exactly the law token i was sampled from. Afterwards the cache has K rows, each holding the
    committed text plus that row's first L-1 draft tokens (the last one is never fed: nothing
    needs its distribution).

    The committed text was run once (at batch size 1 in the eager path), and only then is the cache
    repeated K times, so the shared part is never computed K times.
    """
    probs = first_probs.expand(K, -1)  # [K, V]
    rows.expand(K)
    tokens = sample(probs, generator)  # [K]
    all_tokens, all_probs = [tokens], [probs]
    for _ in range(L - 1):
        logits = rows.feed_rows(tokens.unsqueeze(1), keep_last=1)  # [K, 1, V]
        probs = probs_from_logits(logits[:, -1], temperature)
        tokens = sample(probs, generator)
        all_tokens.append(tokens)
        all_probs.append(probs)
    return torch.stack(all_tokens, dim=1), torch.stack(all_probs, dim=1)


__all__ = ["draft_block", "first_draft_probs"]
