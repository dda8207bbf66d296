"""The decoding loop: autoregressive (AR) and speculative, one target call per iteration.

One speculative iteration (p = target, q = draft):
    1. the draft samples K drafts of L tokens (``drafting.draft_block``), keeping q for each token;
    2. one target forward scores the K rows [last committed token, x_1..x_L] on top of the committed
       cache repeated K times: target_probs [K, L+1, V];
    3. the verifier returns the accepted prefix of one draft plus one token; both caches keep that
       draft's row and are cropped to the committed length; the last emitted token is carried into
       the next iteration (it is not in either cache yet).

The prompt has no forward of its own: both caches start empty and the prompt is the first
iteration's pending text, so the draft's prompt forward also yields q at the first draft
position and, at K = 1, the target's prompt forward also scores the first block (AR: yields the
first token), as transformers' generate does. At K > 1 the target's prompt runs once at batch
size 1 before the K rows.

Invariants at the start of an iteration (n = prompt + emitted tokens so far):
    target cache = first t tokens, t = 0 on the first iteration, n-1 afterwards (one row);
    draft cache = first d tokens, d = 0 first, then d in {n-2, n-1} (one row);
    the pending text of each model = committed[t:] and committed[d:].
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from spectr_repro.engine.common import (
    BlockStep,
    Decoding,
    DecodingSetup,
    DraftedBlock,
    block_efficiency,
    block_length,
    check_arguments,
    check_setup,
    is_integer,
    prompt_tensor,
    read_outcomes,
    verify_each,
)
from spectr_repro.engine.drafting import draft_block, first_draft_probs
from spectr_repro.engine.rows import make_rows
from spectr_repro.engine.timing import SectionTimer
from spectr_repro.sampling import probs_from_logits, sample
from spectr_repro.verify import Verifier

# prefill: the calls that carry the prompt (AR: the first target call; speculative: the draft's prompt
# forward, and the target's first call, which at K = 1 also scores the first block).
TIME_SECTIONS = ("prefill", "draft", "target", "verify", "total")


@dataclass
class GenerationOutput:
    new_tokens: list[int]  # exactly max_new_tokens unless an EOS came first (EOS kept, nothing after)
    target_calls: int  # one per iteration (AR: per token); the first carries the prompt as well
    block_efficiency: float  # len(new_tokens) / target_calls (0.0 when nothing was generated)
    stats: dict[str, Any] = field(default_factory=dict)


def acceptance_by_position(
    accepted_lengths: Iterable[int], L: int, block_lengths: Iterable[int] | None = None
) -> list[float | None]:
    """P(draft position i is accepted | the verifier reached it), i = 1..L, from accepted lengths τ.

    Position i is reached when τ >= i-1 and i <= that block's length, and accepted when τ >= i;
    None where never reached. ``block_lengths``: the drafted length of each block (default L for
    all; the engine shortens the last block to the tokens still wanted). Pool the lists of many
    prompts before calling this to get a per-cell profile.
    """
    accepted_lengths = list(accepted_lengths)
    block_lengths = [L] * len(accepted_lengths) if block_lengths is None else list(block_lengths)
    if len(block_lengths) != len(accepted_lengths):
        raise ValueError(f"{len(accepted_lengths)} accepted lengths but {len(block_lengths)} block lengths")
    reached, accepted = [0] * L, [0] * L
    for tau, length in zip(accepted_lengths, block_lengths):
        if not 0 <= tau <= length <= L:
            raise ValueError(f"accepted length {tau} does not fit a block of {length} <= L={L}")
        for i in range(min(tau + 1, length)):  # 0-based draft positions the verifier looked at
            reached[i] += 1
            accepted[i] += i < tau
    return [a / r if r else None for a, r in zip(accepted, reached)]


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
    prefill_chunk: int | None = None,
    compile: bool | dict = False,
) -> GenerationOutput:
    """Decode up to ``max_new_tokens`` tokens after ``input_ids`` (1-D or [1, T]).

    method: "ar" (the target alone; ``draft`` may be None) or a rule of ``spectr_repro.verify``
        (sd, spectr, bv, gbv, spectr_gbv, rbv, sbv), or a ready ``Verifier`` instance (tests).
    verifier_options: passed to ``get_verifier``; ``check_inputs`` defaults to False here (the
        engine builds well-formed tensors; the tests run every rule with checks on).
    should_stop: called with the tokens so far after each iteration (stop strings); True ends.
    vocab_size: the shared tokenizer's length; default the smaller output head.
    prefill_chunk: feed the prompt in chunks of this many tokens (None: one call); see
        ``forward.forward_chunked`` for why a CPU wants this.
    compile: run target and draft with static caches under ``torch.compile`` (``hardware.compile``;
        True: torch.compile's defaults, CUDA graphs on CUDA; a dict: torch.compile's arguments), the
        same for AR and every method; see ``engine.rows``. Default False: eager, dynamic caches.
    Tokens are sampled with a torch.Generator on the target's device seeded with ``seed``.

    A lossless rule that carries no state into the last block drafts it only as long as the
    tokens still wanted (``max_new_tokens`` minus those emitted, minus the one every iteration
    adds), as transformers' assisted generation does: lossless rules stay lossless at any block
    length, and what a longer block could add would be cut anyway. Rules run as published (not
    lossless) always draft L. ``stats["block_lengths"]`` records each block's drafted length.
    """
    verifier = check_arguments(draft, method, K, L, temperature, max_new_tokens, verifier_options)
    K, L, max_new_tokens, temperature = int(K), int(L), int(max_new_tokens), float(temperature)
    if not is_integer(seed) or not -(2**63) <= seed < 2**64:
        raise ValueError(f"seed must be an integer in [-2**63, 2**64), got {seed!r}")
    seed = int(seed)
    device, prefill_chunk, vocab_size, eos = check_setup(target, draft, verifier is not None, prefill_chunk, vocab_size,
                                                          eos_token_ids)
    prompt = prompt_tensor(input_ids, device, [target] if verifier is None else [target, draft])
    generator = torch.Generator(device=device).manual_seed(seed)
    # Sections on CUDA: events, read once at the end (no synchronisation per section); the total is
    # wall clock between two synchronisations. AR and every method are timed the same way.
    timer = SectionTimer(device, TIME_SECTIONS, events=True)
    timer.sync()
    start = time.perf_counter()
    with torch.inference_mode():
        if verifier is None:
            out = _generate_ar(target, prompt, temperature, max_new_tokens, eos, should_stop,
                               vocab_size, generator, timer, prefill_chunk, compile)
        else:
            setup = DecodingSetup(K, L, temperature, eos, vocab_size, prefill_chunk, compile)
            steps = speculative_steps(target, draft, setup, prompt, max_new_tokens, should_stop, generator, timer,
                                      lambda state, remaining: block_length(verifier, state, L, remaining),
                                      repr(verifier))
            decoding = Decoding(steps, lambda output: [output])
            verify_each(decoding, lambda prompt: verifier)
            [out] = decoding.outputs
    timer.sync()
    timer.seconds["total"] = time.perf_counter() - start
    out.stats["time_s"] = dict(timer.seconds)
    return out


def _generate_ar(target, prompt, temperature, max_new_tokens, eos, should_stop, vocab_size, generator, timer,
                 prefill_chunk, compile):
    rows = make_rows(target, "target", vocab_size, prefill_chunk, compile, 1, prompt.numel() + max_new_tokens + 2)
    new_tokens: list[int] = []
    calls = 0
    pending = prompt  # the first call feeds the whole prompt and yields the first token
    while len(new_tokens) < max_new_tokens:
        with timer("target" if calls else "prefill"):
            logits = rows.feed_shared(pending) if not calls else rows.feed_rows(pending.view(1, 1), 1)[0, -1]
            pending = sample(probs_from_logits(logits, temperature), generator).reshape(1)
            token = int(pending)  # the iteration's one host read: EOS and stop strings are host decisions
        calls += 1
        new_tokens.append(token)
        if token in eos or (should_stop is not None and should_stop(new_tokens)):
            break
    stats = {"accepted_lengths": [0] * calls, "block_lengths": [0] * calls, "acceptance_by_position": [],
             "num_iterations": calls}
    return GenerationOutput(new_tokens, calls, block_efficiency(new_tokens, calls), stats)


def prompt_decoding(target, draft, setup: DecodingSetup, prompt: torch.Tensor, max_new_tokens: int, seed: int,
                    should_stop) -> Decoding:
    """One prompt's decoding (arguments checked, as ``generate``'s) with whole blocks of L and the rule left to the
    caller: the blocks ``generate`` would hand a rule that is not lossless, drawn from the same seed."""
    generator = torch.Generator(device=prompt.device).manual_seed(seed)
    timer = SectionTimer(prompt.device, TIME_SECTIONS, events=True)
    steps = speculative_steps(target, draft, setup, prompt, max_new_tokens, should_stop, generator, timer,
                              lambda state, remaining: setup.L)
    return Decoding(steps, lambda output: [output])


def speculative_steps(target, draft, setup: DecodingSetup, prompt: torch.Tensor, max_new_tokens: int, should_stop,
                      generator: torch.Generator, timer: SectionTimer, lengths: Callable[[Any, int], int],
                      rule: str = "the rule") -> Generator[BlockStep, None, GenerationOutput]:
    """One prompt's speculative decoding, a step per iteration: each yields the block the draft drafted and the
    target scored (a ``BlockStep`` of one ``DraftedBlock``); whoever drives it sets the rule's result before the
    next step, and the decoding goes on from that result. Returns the output. ``lengths(state, remaining)``: the
    next block's draft length (``common.block_length``); ``rule``: how contract errors name the rule."""
    K, L, temperature, eos = setup.K, setup.L, setup.temperature, setup.eos
    vocab_size, prefill_chunk, compile = setup.vocab_size, setup.prefill_chunk, setup.compile
    max_length = prompt.numel() + max_new_tokens + L + 2
    target_rows = make_rows(target, "target", vocab_size, prefill_chunk, compile, K, max_length)
    draft_rows = make_rows(draft, "draft", vocab_size, prefill_chunk, compile, K, max_length)
    committed = prompt.clone()  # prompt + emitted tokens, on the device (slices feed the models)
    num_committed = committed.numel()
    new_tokens: list[int] = []
    accepted_lengths: list[int] = []
    block_lengths: list[int] = []
    state = None
    calls = 0
    while len(new_tokens) < max_new_tokens:
        first = calls == 0
        block = lengths(state, max_new_tokens - len(new_tokens))
        with timer("prefill" if first else "draft"):
            first_probs = first_draft_probs(draft_rows, committed[draft_rows.length:], temperature)
        with timer("draft"):
            draft_tokens, draft_probs = draft_block(draft_rows, first_probs, K, block, temperature, generator)
        with timer("prefill" if first else "target"):
            target_probs = _score_drafts(target_rows, committed, draft_tokens, L, temperature)
        calls += 1
        with timer("verify"):  # the rule runs while the step is out (its time is the verify section's)
            step = BlockStep([DraftedBlock(0, draft_tokens, draft_probs, target_probs, generator, state,
                                           len(new_tokens))])
            yield step
            [result] = step.verified()
            emitted = read_outcomes([result], draft_tokens[None], [block], K, rule)[0]  # the one host read
        state = result.state
        tau, row = len(emitted) - 1, int(result.draft_index)
        accepted_lengths.append(tau)
        block_lengths.append(block)

        done = False
        for token in emitted:
            new_tokens.append(token)
            if token in eos or len(new_tokens) >= max_new_tokens:
                done = True
                break
        if done or (should_stop is not None and should_stop(new_tokens)):
            break

        # Keep the chosen draft's row and cut both caches to the committed text minus the last
        # emitted token (the draft cache may lack x_L too, when the whole block was accepted; a
        # static draft cache also gives back the token before, so that it always re-feeds two).
        with timer("target"):
            target_rows.keep(row, num_committed + tau)
        with timer("draft"):
            draft_rows.keep(row, num_committed + tau + 1 - draft_rows.pending_width)
        committed = torch.cat([committed, result.tokens.to(committed.device)])
        num_committed += tau + 1

    return _speculative_output(new_tokens, calls, accepted_lengths, block_lengths, L)


def _speculative_output(new_tokens, calls, accepted_lengths, block_lengths, L) -> GenerationOutput:
    stats = {"accepted_lengths": accepted_lengths, "block_lengths": block_lengths,
             "acceptance_by_position": acceptance_by_position(accepted_lengths, L, block_lengths),
             "num_iterations": calls}
    return GenerationOutput(new_tokens, calls, block_efficiency(new_tokens, calls), stats)


def _score_drafts(rows, committed, draft_tokens, L, temperature):
    """target_probs [K, block+1, V] of the K rows [last committed token, draft row]; the cache then has K rows.

    The committed tokens the target has not seen (the last emitted one; the whole prompt on the
    first iteration) are fed once: in the single row itself at K = 1 (eager), as shared text before
    the rows diverge otherwise. A compiled (static) target always scores L+1 columns: a shorter last
    block is padded by repeating its last token, and the padding's probabilities are dropped.
    """
    K, block = draft_tokens.shape
    pending = committed[rows.length:]
    if K == 1 and not rows.compiled:
        tokens = torch.cat([pending, draft_tokens[0]]).unsqueeze(0)  # [1, P+L]
    else:
        if pending.numel() > 1:
            rows.feed_shared(pending[:-1])
        tokens = torch.cat([pending[-1:].expand(K, 1), draft_tokens], dim=1)  # [K, L+1]
        rows.expand(K)
    width = block + 1
    if rows.compiled and block < L:
        tokens = torch.cat([tokens, tokens[:, -1:].expand(K, L - block)], dim=1)
    logits = rows.feed_rows(tokens, keep_last=tokens.shape[1] if rows.compiled else width)  # [K, >= width, V]
    return probs_from_logits(logits[:, :width], temperature)


__all__ = ["GenerationOutput", "TIME_SECTIONS", "acceptance_by_position", "generate", "prompt_decoding",
           "speculative_steps"]
