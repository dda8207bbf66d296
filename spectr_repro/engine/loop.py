"""The decoding loop: autoregressive (AR) and speculative, one target call per iteration.

One speculative iteration (p = target, q = draft):
    1. the draft samples K drafts of L tokens (``drafting.draft_block``), keeping q for each token;
    2. one target forward scores the K rows [last committed token, x_1..x_L] on top of the committed
       cache repeated K times: target_probs [K, L+1, V];
    3. the verifier returns the accepted prefix of one draft plus one token; both caches keep that
       draft's row and are cropped to the committed length; the last emitted token is carried into
       the next iteration (it is not in either cache yet).

Invariants at the start of an iteration (n = prompt + emitted tokens so far):
    target cache = first n-1 tokens (one row); draft cache = first d tokens, d in {n-2, n-1}
    (one row); ``draft_pending`` = committed[d:], ``target_pending`` = committed[n-1:].
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache

from spectr_repro.engine.cache import crop_to, keep_row, repeat_rows
from spectr_repro.engine.drafting import draft_block
from spectr_repro.engine.forward import forward_logits, resolve_vocab_size
from spectr_repro.engine.timing import SectionTimer
from spectr_repro.sampling import probs_from_logits, sample
from spectr_repro.verify import VERIFIERS, Verifier, get_verifier

TIME_SECTIONS = ("prefill", "draft", "target", "verify", "total")


@dataclass
class GenerationOutput:
    new_tokens: list[int]  # exactly max_new_tokens unless an EOS came first (EOS kept, nothing after)
    target_calls: int  # target forwards after the prefill (AR: one per token)
    block_efficiency: float  # len(new_tokens) / target_calls (0.0 when nothing was generated)
    stats: dict[str, Any] = field(default_factory=dict)


def acceptance_by_position(accepted_lengths: Iterable[int], L: int) -> list[float | None]:
    """P(draft position i is accepted | the verifier reached it), i = 1..L, from accepted lengths τ.

    Position i is reached when τ >= i-1 and accepted when τ >= i; None where never reached. Pool
    the accepted lengths of many prompts before calling this to get a per-cell profile.
    """
    counts = [0] * (L + 1)
    for tau in accepted_lengths:
        counts[tau] += 1
    reached = sum(counts)
    profile: list[float | None] = []
    for i in range(1, L + 1):
        accepted = reached - counts[i - 1]
        profile.append(accepted / reached if reached else None)
        reached = accepted
    return profile


def generate(
    target: torch.nn.Module,
    draft: torch.nn.Module | None,
    input_ids: torch.Tensor | Sequence[int],
    method: str | Verifier = "ar",
    K: int = 1,
    L: int = 1,
    temperature: float = 0.0,
    max_new_tokens: int = 128,
    seed: int = 0,
    eos_token_ids: Iterable[int] = (),
    should_stop: Callable[[list[int]], bool] | None = None,
    verifier_options: dict[str, Any] | None = None,
    vocab_size: int | None = None,
) -> GenerationOutput:
    """Decode up to ``max_new_tokens`` tokens after ``input_ids`` (1-D or [1, T]).

    method: "ar" (the target alone; ``draft`` may be None) or a rule of ``spectr_repro.verify``
        (sd, spectr, bv, gbv, spectr_gbv, rbv, sbv), or a ready ``Verifier`` instance (tests).
    verifier_options: passed to ``get_verifier``; ``check_inputs`` defaults to False here (the
        engine builds well-formed tensors; the tests run every rule with checks on).
    should_stop: called with the tokens so far after each iteration (stop strings); True ends.
    vocab_size: the shared tokenizer's length; default the smaller output head.
    Tokens are sampled with a torch.Generator on the target's device seeded with ``seed``.
    """
    verifier = _check_arguments(draft, method, K, L, temperature, max_new_tokens, verifier_options)
    device = _model_device(target)
    if verifier is not None and _model_device(draft) != device:
        # One generator drives every draw; cross-device pairs would also copy tokens every step.
        raise ValueError(f"target and draft must be on one device, got {device} and {_model_device(draft)}")
    prompt = _prompt_tensor(input_ids, device)
    vocab_size = resolve_vocab_size(target, None if verifier is None else draft, vocab_size)
    eos = frozenset(int(t) for t in eos_token_ids)
    generator = torch.Generator(device=device).manual_seed(seed)
    timer = SectionTimer(device, TIME_SECTIONS)
    start = time.perf_counter()
    with torch.inference_mode():
        if verifier is None:
            out = _generate_ar(target, prompt, temperature, max_new_tokens, eos, should_stop,
                               vocab_size, generator, timer)
        else:
            out = _generate_speculative(target, draft, prompt, verifier, K, L, temperature, max_new_tokens,
                                        eos, should_stop, vocab_size, generator, timer)
    timer.sync()
    timer.seconds["total"] = time.perf_counter() - start
    out.stats["time_s"] = dict(timer.seconds)
    return out


def _generate_ar(target, prompt, temperature, max_new_tokens, eos, should_stop, vocab_size, generator, timer):
    cache = DynamicCache()
    new_tokens: list[int] = []
    with timer("prefill"):
        _prefill(target, prompt, cache, vocab_size)
    pending = prompt[-1:]
    calls = 0
    while len(new_tokens) < max_new_tokens:
        with timer("target"):
            logits = forward_logits(target, pending.unsqueeze(0), cache, vocab_size, last_only=True)
            pending = sample(probs_from_logits(logits[0, -1], temperature), generator).reshape(1)
            token = int(pending)
        calls += 1
        new_tokens.append(token)
        if token in eos or (should_stop is not None and should_stop(new_tokens)):
            break
    stats = {"accepted_lengths": [0] * calls, "acceptance_by_position": [], "num_iterations": calls}
    return GenerationOutput(new_tokens, calls, _block_efficiency(new_tokens, calls), stats)


def _generate_speculative(target, draft, prompt, verifier, K, L, temperature, max_new_tokens, eos,
                          should_stop, vocab_size, generator, timer):
    device = prompt.device
    target_cache, draft_cache = DynamicCache(), DynamicCache()
    with timer("prefill"):
        _prefill(target, prompt, target_cache, vocab_size)
        _prefill(draft, prompt, draft_cache, vocab_size)
    committed = prompt.clone()  # prompt + emitted tokens, on the device (slices feed the models)
    num_committed = committed.numel()
    new_tokens: list[int] = []
    accepted_lengths: list[int] = []
    state = None
    calls = 0
    while len(new_tokens) < max_new_tokens:
        draft_seen = draft_cache.get_seq_length()
        with timer("draft"):
            draft_tokens, draft_probs = draft_block(draft, draft_cache, committed[draft_seen:], K, L,
                                                    temperature, vocab_size, generator)
        with timer("target"):
            rows = torch.cat([committed[-1:].expand(K, 1), draft_tokens], dim=1)  # [K, L+1]
            repeat_rows(target_cache, K)
            logits = forward_logits(target, rows, target_cache, vocab_size)  # [K, L+1, V]
            target_probs = probs_from_logits(logits, temperature)
        calls += 1
        with timer("verify"):
            result = verifier(draft_tokens, draft_probs, target_probs, generator=generator, state=state)
            emitted = result.tokens.tolist()
        state = result.state
        tau, row = result.num_accepted, result.draft_index
        accepted_lengths.append(tau)
        if len(emitted) != tau + 1 or not 0 <= row < K or not 0 <= tau <= L:
            raise RuntimeError(f"{verifier!r} returned {len(emitted)} tokens, num_accepted={tau}, "
                               f"draft_index={row} for K={K}, L={L}")

        done = False
        for token in emitted:
            new_tokens.append(token)
            if token in eos or len(new_tokens) >= max_new_tokens:
                done = True
                break
        if done or (should_stop is not None and should_stop(new_tokens)):
            break

        # Keep the chosen draft's row and crop both caches to the committed text minus the last
        # emitted token (the draft cache may lack x_L too, when the whole block was accepted).
        with timer("target"):
            keep_row(target_cache, row, K, device)
            crop_to(target_cache, num_committed + tau)
        with timer("draft"):
            keep_row(draft_cache, row, K, device)
            crop_to(draft_cache, min(num_committed + tau, draft_cache.get_seq_length()))
        accepted = draft_tokens[row, :tau]
        if tau and not torch.equal(accepted, result.tokens[:tau].to(accepted.device)):
            raise RuntimeError(f"{verifier!r}: accepted tokens are not a prefix of draft {row}")
        committed = torch.cat([committed, result.tokens.to(device)])
        num_committed += tau + 1

    stats = {
        "accepted_lengths": accepted_lengths,
        "acceptance_by_position": acceptance_by_position(accepted_lengths, L),
        "num_iterations": calls,
    }
    return GenerationOutput(new_tokens, calls, _block_efficiency(new_tokens, calls), stats)


def _prefill(model, prompt, cache, vocab_size) -> None:
    """Put all prompt tokens but the last into ``cache`` (the last one is fed with the first step)."""
    if prompt.numel() > 1:
        forward_logits(model, prompt[:-1].unsqueeze(0), cache, vocab_size, last_only=True)


def _block_efficiency(new_tokens: list[int], calls: int) -> float:
    return len(new_tokens) / calls if calls else 0.0


def _check_arguments(draft, method, K, L, temperature, max_new_tokens, verifier_options) -> Verifier | None:
    """Validate the arguments; return the verifier (None for AR)."""
    if not isinstance(K, int) or K < 1:
        raise ValueError(f"K must be an integer >= 1, got {K!r}")
    if not isinstance(L, int) or L < 1:
        raise ValueError(f"L must be an integer >= 1, got {L!r}")
    if not temperature >= 0:  # also rejects NaN
        raise ValueError(f"temperature must be >= 0, got {temperature!r}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if isinstance(method, Verifier):
        verifier, single_draft = method, method.single_draft
    elif method == "ar":
        return None
    elif isinstance(method, str) and method in VERIFIERS:
        verifier = get_verifier(method, **{"check_inputs": False, **(verifier_options or {})})
        single_draft = VERIFIERS[method].single_draft
    else:
        known = ", ".join(["ar", *VERIFIERS])
        raise ValueError(f"unknown method {method!r}; known: {known}")
    if single_draft and K != 1:
        raise ValueError(f"method {verifier.name!r} verifies a single draft; got K={K}")
    if draft is None:
        raise ValueError(f"method {verifier.name!r} needs a draft model")
    return verifier


def _model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _prompt_tensor(input_ids, device: torch.device) -> torch.Tensor:
    prompt = torch.as_tensor(input_ids, dtype=torch.long)
    if prompt.dim() == 2 and prompt.shape[0] == 1:
        prompt = prompt[0]
    if prompt.dim() != 1:
        raise ValueError(f"input_ids must be 1-D or [1, T], got shape {tuple(prompt.shape)}")
    if prompt.numel() == 0:
        raise ValueError("input_ids is empty: the prompt needs at least one token (e.g. BOS)")
    return prompt.to(device)


__all__ = ["GenerationOutput", "TIME_SECTIONS", "acceptance_by_position", "generate"]
