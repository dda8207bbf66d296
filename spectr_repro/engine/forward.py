"""Model forwards and the shared vocabulary.

Target and draft heads may be padded to different sizes (checkpoints round the embedding matrix
up); only the ids the shared tokenizer can produce are real, so every head is sliced to that
length before the softmax.
"""

from __future__ import annotations

import functools
import inspect

import torch
from transformers import Cache


def forward_logits(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    cache: Cache,
    vocab_size: int,
    keep_last: int | None = None,
) -> torch.Tensor:
    """Run ``input_ids`` [B, T] on top of ``cache`` (updated in place); logits [B, T or keep_last, vocab_size].

    ``keep_last`` computes the head for the last ``keep_last`` positions only (None: all of them);
    at V = 152k the head is a large share of a small model's cost.
    """
    output = model(
        input_ids=input_ids,
        use_cache=True,
        logits_to_keep=keep_last or 0,  # transformers: 0 means every position
        **{_cache_argument(type(model)): cache},
    )
    return output.logits[..., :vocab_size]


def forward_chunked(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    cache: Cache,
    vocab_size: int,
    keep_last: int,
    chunk_tokens: int | None = None,
) -> torch.Tensor:
    """``forward_logits(..., keep_last)`` on a long input (a prompt), run in chunks of ``chunk_tokens``.

    Only the last ``keep_last`` positions need logits, so the positions before them are fed in
    chunks of ``chunk_tokens`` and the last chunk also carries the kept positions (one call when
    the input fits in ``chunk_tokens + keep_last``, or ``chunk_tokens`` is None). Attention is
    causal, so the cache and logits are those of one call, up to float rounding. Why: CPU matmul
    kernels run some long shapes up to 30 % slower per token than others (bfloat16, 2 cores:
    a 481-token prefill took 4.2 s in one call and 3.6 s as 256 + 225).
    """
    if keep_last < 1 or keep_last > input_ids.shape[1]:
        raise ValueError(f"keep_last must be in [1, {input_ids.shape[1]}], got {keep_last}")
    if chunk_tokens is not None and chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1 or None, got {chunk_tokens}")
    head = input_ids.shape[1] - keep_last  # positions whose logits nobody needs
    start = 0
    if chunk_tokens is not None:
        while head - start > chunk_tokens:
            forward_logits(model, input_ids[:, start:start + chunk_tokens], cache, vocab_size, keep_last=1)
            start += chunk_tokens
    return forward_logits(model, input_ids[:, start:], cache, vocab_size, keep_last=keep_last)


@functools.cache
def _cache_argument(model_class: type) -> str:
    """The forward's cache keyword: ``cache`` since transformers 5.2x, ``past_key_values`` before
    (still accepted there, with a deprecation warning on every call)."""
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def head_size(model: torch.nn.Module) -> int:
    """Number of rows of the model's output head (its padded vocabulary)."""
    head = model.get_output_embeddings()
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    return int(model.config.vocab_size)


def resolve_vocab_size(target: torch.nn.Module, draft: torch.nn.Module | None, vocab_size: int | None) -> int:
    """The shared vocabulary length: ``vocab_size`` (the tokenizer's length) or the smaller head."""
    heads = [head_size(target)] + ([head_size(draft)] if draft is not None else [])
    if vocab_size is None:
        return min(heads)
    if vocab_size < 1 or vocab_size > min(heads):
        raise ValueError(f"vocab_size={vocab_size} must be in [1, {min(heads)}] (output head sizes {heads})")
    return int(vocab_size)


def shared_vocab_size(target_tokenizer, draft_tokenizer=None) -> int:
    """Length of the tokenizer both models use; ValueError if the two tokenizers differ.

    Speculative decoding compares p and q token by token, so both models must index the same
    vocabulary: same token -> id map and the same special tokens.
    """
    if draft_tokenizer is None or draft_tokenizer is target_tokenizer:
        return len(target_tokenizer)
    if len(target_tokenizer) != len(draft_tokenizer):
        raise ValueError(
            f"target and draft tokenizers differ: {len(target_tokenizer)} vs {len(draft_tokenizer)} tokens "
            "(speculative decoding needs one shared vocabulary)"
        )
    target_vocab, draft_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if target_vocab != draft_vocab:
        differing = sorted(set(target_vocab.items()) ^ set(draft_vocab.items()))[:3]
        raise ValueError(
            f"target and draft tokenizers map tokens to different ids (e.g. {differing}); "
            "speculative decoding needs one shared vocabulary"
        )
    if target_tokenizer.eos_token_id != draft_tokenizer.eos_token_id:
        raise ValueError(
            f"target and draft tokenizers have different EOS ids "
            f"({target_tokenizer.eos_token_id} vs {draft_tokenizer.eos_token_id})"
        )
    return len(target_tokenizer)


__all__ = ["forward_chunked", "forward_logits", "head_size", "resolve_vocab_size", "shared_vocab_size"]
