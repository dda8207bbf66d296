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
    last_only: bool = False,
) -> torch.Tensor:
    """Run ``input_ids`` [B, T] on top of ``cache`` (updated in place); logits [B, T or 1, vocab_size].

    ``last_only`` computes the head for the last position only (prefill, drafting).
    """
    output = model(
        input_ids=input_ids,
        use_cache=True,
        logits_to_keep=1 if last_only else 0,
        **{_cache_argument(type(model)): cache},
    )
    return output.logits[..., :vocab_size]


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


__all__ = ["forward_logits", "head_size", "resolve_vocab_size", "shared_vocab_size"]
