"""The loops being compared: ours (``spectr_repro.engine.generate``) and transformers' own generate and
assisted generation, each over a list of prompts with EOS disabled so that every run emits exactly N tokens."""

from __future__ import annotations

import copy
from contextlib import contextmanager

import torch

from spectr_repro.bench.measure import timed
from spectr_repro.data import encode_prompt, load_examples
from spectr_repro.engine import generate

SECTIONS = ("prefill", "draft", "target", "verify")


def encode_prompts(pair, dataset: str, num_prompts: int, seed: int = 0) -> list[torch.Tensor]:
    """The dataset's first ``num_prompts`` prompts (seeded selection), as the runner encodes them."""
    examples = load_examples(dataset, num_prompts, seed=seed, tokenizer=pair.tokenizer)
    return [encode_prompt(pair.tokenizer, example)[0] for example in examples]


def run_ours(pair, prompts, method, K, L, temperature, max_new_tokens, prefill_chunk=None, use_draft=True, seed=0):
    """Total (seconds, tokens, target_calls, time split) over the prompts; prompt i uses seed + i."""
    seconds = tokens = calls = 0
    split = dict.fromkeys(SECTIONS, 0.0)
    for i, ids in enumerate(prompts):
        elapsed, out = timed(pair.device, lambda ids=ids, i=i: generate(
            pair.target, pair.draft if use_draft else None, ids.to(pair.device), method=method, K=K, L=L,
            temperature=temperature, max_new_tokens=max_new_tokens, seed=seed + i, eos_token_ids=(),
            vocab_size=pair.vocab_size, prefill_chunk=prefill_chunk))
        seconds, tokens, calls = seconds + elapsed, tokens + len(out.new_tokens), calls + out.target_calls
        for key in split:
            split[key] += out.stats["time_s"].get(key, 0.0)
    return seconds, tokens, calls, split


def hf_generation_config(model, temperature: float, max_new_tokens: int):
    """The model's generation config with plain sampling at ``temperature`` and EOS disabled."""
    config = copy.deepcopy(model.generation_config)
    config.do_sample, config.temperature = True, temperature
    config.top_k, config.top_p, config.min_p = 0, 1.0, None
    config.max_new_tokens, config.min_new_tokens = max_new_tokens, None
    # An empty list, not None: transformers 5 fills None from the model's own config (Qwen then stopped
    # at EOS while our loop ran on, and tokens/s compared runs of different lengths).
    config.eos_token_id = []
    if config.pad_token_id is None:
        config.pad_token_id = 0
    return config


@contextmanager
def assistant_drafting_exactly(assistant, L: int):
    """transformers reads the drafting schedule from the ASSISTANT's generation config (its defaults: up to
    20 tokens, cut early when the draft's confidence falls below 0.4): pin exactly L tokens per iteration,
    as our loop drafts, for the duration of the block."""
    saved = copy.deepcopy(assistant.generation_config)
    assistant.generation_config.num_assistant_tokens = L
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    assistant.generation_config.assistant_confidence_threshold = 0.0
    try:
        yield
    finally:
        assistant.generation_config = saved


def run_hf(pair, prompts, temperature, max_new_tokens, assistant=None, L=None, seed=0):
    """transformers' generate (``assistant`` None), its assisted generation at exactly ``L`` drafted tokens,
    or (``L`` None) at its own defaults. Returns (seconds, tokens)."""
    config = hf_generation_config(pair.target, temperature, max_new_tokens)
    extra = {} if assistant is None else {"assistant_model": assistant}
    if assistant is not None and L is not None:
        config.num_assistant_tokens, config.num_assistant_tokens_schedule = L, "constant"
        config.assistant_confidence_threshold = 0.0
        with assistant_drafting_exactly(assistant, L):
            return _run_hf_prompts(pair, prompts, config, extra, seed)
    return _run_hf_prompts(pair, prompts, config, extra, seed)


def _run_hf_prompts(pair, prompts, config, extra, seed):
    seconds = tokens = 0
    for i, ids in enumerate(prompts):
        torch.manual_seed(seed + i)
        batch = ids.to(pair.device).unsqueeze(0)
        elapsed, out = timed(pair.device, lambda batch=batch: pair.target.generate(
            batch, attention_mask=torch.ones_like(batch), generation_config=config, **extra))
        seconds, tokens = seconds + elapsed, tokens + out.shape[1] - batch.shape[1]
    return seconds, tokens


__all__ = ["assistant_drafting_exactly", "encode_prompts", "hf_generation_config", "run_hf", "run_ours"]
