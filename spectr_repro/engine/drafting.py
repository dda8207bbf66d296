"""Drafting: K independent drafts of L tokens as K rows of one batch, with the draft's KV cache."""

from __future__ import annotations

import torch
from transformers import Cache

from spectr_repro.engine.cache import repeat_rows
from spectr_repro.engine.forward import forward_chunked, forward_logits
from spectr_repro.sampling import probs_from_logits, sample


def first_draft_probs(
    draft: torch.nn.Module,
    cache: Cache,
    pending: torch.Tensor,
    temperature: float,
    vocab_size: int,
    chunk_tokens: int | None = None,
) -> torch.Tensor:
    """q at the first draft position, [V] float32: feeds ``pending`` to the draft at batch size 1.

    cache: the draft's cache, one row holding the committed text except ``pending`` (1-D: the whole
        prompt on the first iteration, then the last emitted token, sometimes two).
    The prompt is thus prefilled by the same call that yields q, never by a call of its own.
    """
    logits = forward_chunked(draft, pending.unsqueeze(0), cache, vocab_size, 1, chunk_tokens)  # [1, 1, V]
    return probs_from_logits(logits[0, -1], temperature)


def draft_block(
    draft: torch.nn.Module,
    cache: Cache,
    first_probs: torch.Tensor,
    K: int,
    L: int,
    temperature: float,
    vocab_size: int,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample K drafts of L tokens i.i.d. from q, starting from ``first_draft_probs``'s output.

    cache: the draft's cache, one row holding the whole committed text.
    Returns draft_tokens [K, L] and draft_probs [K, L, V] (float32), row i of draft_probs being
    exactly the law token i was sampled from. Afterwards the cache has K rows, each holding the
    committed text plus that row's first L-1 draft tokens (the last one is never fed: nothing
    needs its distribution).

    The committed text was run once at batch size 1, and only then is the cache repeated K times,
    so the shared part is never computed K times.
    """
    probs = first_probs.expand(K, -1)  # [K, V]
    repeat_rows(cache, K)
    tokens = sample(probs, generator)  # [K]
    all_tokens, all_probs = [tokens], [probs]
    for _ in range(L - 1):
        logits = forward_logits(draft, tokens.unsqueeze(1), cache, vocab_size, keep_last=1)  # [K, 1, V]
        probs = probs_from_logits(logits[:, -1], temperature)
        tokens = sample(probs, generator)
        all_tokens.append(tokens)
        all_probs.append(probs)
    return torch.stack(all_tokens, dim=1), torch.stack(all_probs, dim=1)


__all__ = ["draft_block", "first_draft_probs"]
