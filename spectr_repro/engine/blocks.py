"""Drafted blocks for a caller that verifies them itself (the replay evaluates every rule on each block).

    decoding = drafted_blocks(target, draft, [ids_0, ids_1], K=7, L=24, temperature=0.4, max_new_tokens=48,
                              seeds=[s_0, s_1], eos_token_ids=(eos,))
    for step in decoding:                      # one iteration: a drafted, scored block per running prompt
        for i, block in enumerate(step.blocks):
            step.results[i] = rule(block.draft_tokens, block.draft_probs, block.target_probs,
                                   generator=block.generator, state=block.state)
    decoding.outputs[b].new_tokens           # each prompt's trajectory, as its results steered it

Every block is drafted whole (L columns), as the engine drafts for a rule that is not lossless. One prompt decodes
through ``engine.loop`` and several through ``engine.batched``, the paths ``generate`` and ``generate_batch`` take,
so a prompt's blocks are the ones those would hand its rule (same seeds, same draws).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch

from spectr_repro.engine.batched import batch_decoding
from spectr_repro.engine.common import Decoding, DecodingSetup, check_numbers, check_setup, is_integer, prompt_tensor
from spectr_repro.engine.loop import prompt_decoding


def drafted_blocks(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    prompts: Sequence[torch.Tensor | Sequence[int]],
    K: int,
    L: int,
    temperature: float,
    max_new_tokens: int,
    seeds: Sequence[int],
    eos_token_ids: Iterable[int] = (),
    should_stop: Sequence[Callable[[list[int]], bool] | None] | None = None,
    vocab_size: int | None = None,
    prefill_chunk: int | None = None,
) -> Decoding:
    """The decoding of ``prompts`` (prompt b drawing from ``seeds[b]``, stopped by ``should_stop[b]``), handed out
    a step at a time; arguments as ``generate_batch``'s. ValueError on bad arguments, before any forward."""
    if draft is None:
        raise ValueError("drafted blocks need a draft model")
    check_numbers(K, L, temperature, max_new_tokens)
    if isinstance(prompts, torch.Tensor) or not len(prompts):
        raise ValueError("prompts must be a non-empty sequence of prompts (1-D token ids each)")
    stops = [None] * len(prompts) if should_stop is None else list(should_stop)
    if len(seeds) != len(prompts) or len(stops) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts need as many seeds and should_stop entries, got {len(seeds)} "
                         f"and {len(stops)}")
    if not all(is_integer(seed) for seed in seeds):
        raise ValueError(f"seeds must be integers, got {list(seeds)!r}")
    device, prefill_chunk, vocab_size, eos = check_setup(target, draft, True, prefill_chunk, vocab_size,
                                                          eos_token_ids)
    tensors = [prompt_tensor(ids, device, [target, draft]) for ids in prompts]
    setup = DecodingSetup(int(K), int(L), float(temperature), eos, vocab_size, prefill_chunk)
    if len(tensors) == 1:
        return prompt_decoding(target, draft, setup, tensors[0], int(max_new_tokens), int(seeds[0]), stops[0])
    return batch_decoding(target, draft, setup, tensors, int(max_new_tokens), seeds, stops)


__all__ = ["drafted_blocks"]
