"""Batched decoding for block-efficiency runs: B prompts at once, each with the law of batch 1.

    from spectr_repro.engine import generate_batch
    out = generate_batch(target, draft, [ids_0, ids_1, ...], method="sbv", K=3, L=6, temperature=0.4,
                         max_new_tokens=64, seeds=[s_0, s_1, ...], eos_token_ids=(eos,))
    out.outputs[b].new_tokens, out.outputs[b].block_efficiency, out.stats["time_s"]

One iteration for the R prompts still running (p = target, q = draft):
    1. one draft forward feeds each prompt's pending tokens (1 or 2) and yields q at its first draft
       position; the cache is repeated K times; L-1 forwards of R*K rows draft the blocks;
    2. one target forward scores the R*K rows [last committed token, x_1..x_L];
    3. the rule runs once per prompt on that prompt's [K, L] slice, with that prompt's generator and
       carry-over state (and that prompt's own ``Verifier`` instance when ``method`` gives one per prompt):
       exactly the call the batch-1 engine makes (``engine.loop``);
    4. both caches keep each prompt's chosen row; the tokens after each prompt's accepted prefix
       become holes (``engine.batch_cache``); finished prompts leave the batch.

Why each row's law is the batch-1 law: every prompt's draws come from its own generator in the
batch-1 order (draft tokens position by position through the one sampler, then the rule's draws), the
rule sees the same tensors (its own slice; a prompt whose last block is shorter than its batch
mates' is verified on its own block length, and its extra drafted columns are never sampled), and
the models compute each row's probabilities on exactly that row's text at its own positions
(``batch_cache``: masked holes, explicit position ids). So a prompt's tokens do not depend on its
batch mates: equal to batch 1 at T = 0 and, in float32, at T > 0 with the same seed unless a
rounding difference of the batched shapes moves a draw across a boundary (probability ~1e-7 per
draw). In bfloat16 the batched shapes round differently, so greedy ties and near-ties can resolve
differently: same law, not the same tokens.

The prompts are prefilled one at a time at batch size 1 (the batch-1 engine's own calls, chunked
by ``prefill_chunk``) and their caches stacked, left-padded; after that every forward is batched.
Wall time of a batch is not a per-prompt wall time: speed-ups stay batch-1 measurements (runner).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache

from spectr_repro.engine.batch_cache import BatchCache, to_device
from spectr_repro.engine.common import (
    BlockStep,
    Decoding,
    DecodingSetup,
    DraftedBlock,
    block_efficiency,
    block_length,
    check_arguments,
    check_setup,
    model_device,
    prompt_tensor,
    read_outcomes,
    verify_each,
)
from spectr_repro.engine.forward import forward_chunked
from spectr_repro.engine.loop import TIME_SECTIONS, GenerationOutput, acceptance_by_position
from spectr_repro.engine.timing import SectionTimer
from spectr_repro.sampling import probs_from_logits, sample
from spectr_repro.verify import Verifier


@dataclass
class BatchOutput:
    outputs: list[GenerationOutput]  # one per prompt, in input order (stats as batch 1, without time_s)
    stats: dict[str, Any] = field(default_factory=dict)  # the batch's time_s split, batch_prompts


@dataclass
class _Prompt:
    """One prompt's decoding state; everything a batch-1 ``generate`` call would hold."""

    index: int
    prompt: torch.Tensor  # 1-D, on the device
    budget: int  # max_new_tokens
    generator: torch.Generator
    should_stop: Callable[[list[int]], bool] | None
    committed: list[int]  # prompt + emitted tokens (host)
    verifier: Verifier | None = None  # this prompt's rule (None: AR); batch mates may share one instance
    new_tokens: list[int] = field(default_factory=list)
    accepted_lengths: list[int] = field(default_factory=list)
    block_lengths: list[int] = field(default_factory=list)
    calls: int = 0
    state: Any = None
    draft_pending: list[int] = field(default_factory=list)  # committed tokens not yet in the draft cache

    def emit(self, tokens: Iterable[int], eos: frozenset[int]) -> bool:
        """Append tokens up to the budget or an EOS; True when this prompt is finished."""
        for token in tokens:
            self.new_tokens.append(token)
            self.committed.append(token)
            if token in eos or len(self.new_tokens) >= self.budget:
                return True
        return self.should_stop is not None and self.should_stop(self.new_tokens)

    def output(self, L: int, batch_prompts: int) -> GenerationOutput:
        stats = {
            "accepted_lengths": self.accepted_lengths,
            "block_lengths": self.block_lengths,
            "acceptance_by_position": [] if L == 0 else acceptance_by_position(
                self.accepted_lengths, L, self.block_lengths),
            "num_iterations": self.calls,
            "batch_prompts": batch_prompts,
        }
        return GenerationOutput(self.new_tokens, self.calls, block_efficiency(self.new_tokens, self.calls), stats)


def generate_batch(
    target: torch.nn.Module,
    draft: torch.nn.Module | None,
    prompts: Sequence[torch.Tensor | Sequence[int]],
    method: str | Verifier | Sequence[Verifier] = "ar",
    K: int = 1,
    L: int = 1,
    temperature: float = 0.0,
    max_new_tokens: int | Sequence[int] = 128,
    seeds: Sequence[int] | None = None,
    eos_token_ids: Iterable[int] = (),
    should_stop: Callable[[list[int]], bool] | Sequence[Callable[[list[int]], bool] | None] | None = None,
    verifier_options: dict[str, Any] | None = None,
    vocab_size: int | None = None,
    prefill_chunk: int | None = None,
) -> BatchOutput:
    """Decode every prompt of ``prompts`` as ``engine.generate`` would, all at once.

    Arguments as ``engine.generate``, per prompt where it says so:
    method: "ar", a rule's name or a ``Verifier`` instance, as ``engine.generate``; or a sequence of distinct
        ``Verifier`` instances, one per prompt, for rules that keep per-prompt records on themselves (the
        replay's ``ReplayingReference``): prompt b is verified by ``method[b]`` only. Each prompt's block
        lengths follow its own instance (``common.block_length``: a rule not lossless drafts whole blocks), as
        ``engine.generate`` with that instance would.
    max_new_tokens: one budget for all prompts or one per prompt.
    seeds: one per prompt (default 0, 1, ..., B-1); prompt b draws from its own generator seeded
        with ``seeds[b]``, as ``generate(..., seed=seeds[b])`` does.
    should_stop: one callable for all prompts or one (or None) per prompt.
    """
    if isinstance(prompts, torch.Tensor) or not len(prompts):
        raise ValueError("prompts must be a non-empty sequence of prompts (1-D token ids each)")
    count = len(prompts)
    verifiers = _verifiers_per_prompt(draft, method, count, K, L, temperature,
                                      max_new_tokens if isinstance(max_new_tokens, int) else 0, verifier_options)
    verifier = verifiers[0]  # what every prompt's rule shares: AR or not, the device and vocabulary checks
    budgets, seeds, stops = _prompt_arguments(count, max_new_tokens, seeds, should_stop)
    device, prefill_chunk, vocab_size, eos = check_setup(target, draft, verifier is not None, prefill_chunk, vocab_size,
                                                          eos_token_ids)
    rows = []
    for index, (ids, budget, seed, stop, rule) in enumerate(zip(prompts, budgets, seeds, stops, verifiers)):
        prompt = prompt_tensor(ids, device, [target] if verifier is None else [target, draft])
        rows.append(_Prompt(index, prompt, budget, torch.Generator(device=device).manual_seed(int(seed)), stop,
                            committed=prompt.tolist(), verifier=rule))
    timer = SectionTimer(device, TIME_SECTIONS, events=True)  # as engine.loop: CUDA events, one sync at the end
    timer.sync()
    start = time.perf_counter()
    with torch.inference_mode():
        running = [row for row in rows if row.budget > 0]
        if running and verifier is None:
            _decode_ar(target, running, temperature, eos, vocab_size, timer, prefill_chunk)
        elif running:
            setup = DecodingSetup(K, L, temperature, eos, vocab_size, prefill_chunk)
            steps = batched_steps(target, draft, setup, running, timer, lambda row: _rule_block_length(row, L),
                                  repr(verifier))
            verify_each(steps, lambda index: rows[index].verifier)
    timer.sync()
    timer.seconds["total"] = time.perf_counter() - start
    outputs = [row.output(0 if verifier is None else L, count) for row in rows]
    return BatchOutput(outputs, {"time_s": dict(timer.seconds), "batch_prompts": count})


def _rule_block_length(row: _Prompt, L: int) -> int:
    """The next block's draft length for the row's own rule (``common.block_length``)."""
    return block_length(row.verifier, row.state, L, row.budget - len(row.new_tokens))


def batch_decoding(target, draft, setup: DecodingSetup, prompts: Sequence[torch.Tensor], max_new_tokens: int,
                   seeds: Sequence[int], should_stop: Sequence) -> Decoding:
    """The prompts' decoding together (checked prompt tensors, one seed and stop each) with whole blocks of L and
    the rule left to the caller: the blocks ``generate_batch`` would hand a rule that is not lossless."""
    device = model_device(target)
    rows = [_Prompt(index, prompt, max_new_tokens, torch.Generator(device=device).manual_seed(int(seed)), stop,
                    committed=prompt.tolist()) for index, (prompt, seed, stop) in enumerate(zip(prompts, seeds,
                                                                                              should_stop))]
    timer = SectionTimer(device, TIME_SECTIONS, events=True)
    running = [row for row in rows if row.budget > 0]
    steps = batched_steps(target, draft, setup, running, timer, lambda row: setup.L) if running else iter(())
    return Decoding(steps, lambda _: [row.output(setup.L, len(rows)) for row in rows])


def _prompt_arguments(count: int, max_new_tokens, seeds, should_stop) -> tuple[list[int], list[int], list]:
    """(budgets, seeds, should_stop callables), one of each per prompt, checked."""
    budgets = _per_prompt(max_new_tokens, count, "max_new_tokens")
    if any(isinstance(b, bool) or not isinstance(b, int) or b < 0 for b in budgets):
        raise ValueError(f"max_new_tokens must be integers >= 0, got {budgets}")
    seeds = list(range(count)) if seeds is None else list(seeds)
    if len(seeds) != count:
        raise ValueError(f"{len(seeds)} seeds for {count} prompts")
    stops = list(should_stop) if isinstance(should_stop, Sequence) else [should_stop] * count
    if len(stops) != count:
        raise ValueError(f"{len(stops)} should_stop callables for {count} prompts")
    return budgets, seeds, stops


def _verifiers_per_prompt(draft, method, count: int, K, L, temperature, max_new_tokens, verifier_options
                          ) -> list[Verifier | None]:
    """One verifier per prompt (None for AR), each checked as ``engine.generate`` checks its ``method``: one rule
    (a name or an instance) is shared by every prompt; a sequence gives each prompt its own instance."""
    if isinstance(method, (str, Verifier)) or not isinstance(method, Sequence):
        return [check_arguments(draft, method, K, L, temperature, max_new_tokens, verifier_options)] * count
    if not all(isinstance(rule, Verifier) for rule in method):
        raise ValueError(f"method must be 'ar', a rule's name, a Verifier or a sequence of Verifier instances (one "
                         f"per prompt), got {method!r}")
    if len(method) != count:
        raise ValueError(f"{len(method)} verifiers (method) for {count} prompts")
    if len({id(rule) for rule in method}) != count:
        raise ValueError("method: the per-prompt verifiers must be distinct instances (pass one Verifier to share "
                         "it between prompts)")
    return [check_arguments(draft, rule, K, L, temperature, max_new_tokens, verifier_options) for rule in method]


def _per_prompt(value, count: int, name: str) -> list:
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) != count:
            raise ValueError(f"{len(value)} values of {name} for {count} prompts")
        return list(value)
    return [value] * count


def _prefill(model, rows: list[_Prompt], vocab_size, prefill_chunk, drop_last: bool):
    """Each prompt at batch size 1 into its own cache (as ``engine.loop`` does): the caches stacked into a
    BatchCache, and the logits of each prompt's last fed position ([B, V]; None with ``drop_last``, where
    the prompt's last token is left pending)."""
    caches, last_logits = [], []
    for row in rows:
        cache = DynamicCache()
        ids = row.prompt[:-1] if drop_last else row.prompt
        if ids.numel():
            logits = forward_chunked(model, ids.unsqueeze(0), cache, vocab_size, 1, prefill_chunk)
            last_logits.append(logits[0, -1])
        caches.append(cache)
    stacked = BatchCache.from_caches(caches, model_device(model))
    return stacked, (None if drop_last else torch.stack(last_logits))


def _sample_per_prompt(probs: torch.Tensor, rows: list[_Prompt], draws: Sequence[bool] | None = None,
                       previous: torch.Tensor | None = None) -> torch.Tensor:
    """probs [R*n, V] (n rows per prompt) -> tokens [R*n]: each prompt's rows drawn by the one sampler
    with that prompt's generator (the draws batch 1 makes, in its order). Prompts with ``draws`` False
    draw nothing and keep their ``previous`` tokens (placeholders never verified)."""
    per_prompt = probs.shape[0] // len(rows)
    tokens = []
    for i, row in enumerate(rows):
        part = slice(i * per_prompt, (i + 1) * per_prompt)
        if draws is None or draws[i]:
            tokens.append(sample(probs[part], row.generator))
        else:
            tokens.append(previous[part])
    return torch.cat(tokens)


def _decode_ar(target, rows, temperature, eos, vocab_size, timer, prefill_chunk):
    device = model_device(target)
    with timer("prefill"):
        cache, logits = _prefill(target, rows, vocab_size, prefill_chunk, drop_last=False)
        tokens = _sample_per_prompt(probs_from_logits(logits, temperature), rows)  # [R]
    while True:
        with timer("target"):
            emitted = tokens.tolist()  # the iteration's one host read
            keep = []
            for i, (row, token) in enumerate(zip(rows, emitted)):
                row.calls += 1
                row.accepted_lengths.append(0)
                row.block_lengths.append(0)
                if not row.emit([token], eos):
                    keep.append(i)
            if not keep:
                return
            rows = [rows[i] for i in keep]
            cache.select_rows(keep)
            tokens = tokens[to_device(torch.tensor(keep), device)] if len(keep) < len(emitted) else tokens
            logits = cache.forward(target, tokens.unsqueeze(1), [1] * len(rows), vocab_size, keep_last=1)
            tokens = _sample_per_prompt(probs_from_logits(logits[:, -1], temperature), rows)


def batched_steps(target, draft, setup: DecodingSetup, rows: list[_Prompt], timer: SectionTimer,
                  lengths: Callable[[_Prompt], int], rule: str = "the rule") -> Generator[BlockStep, None, None]:
    """The prompts' speculative decoding, a step per iteration: each yields the R running prompts' blocks, drafted
    and scored in one batch (a ``BlockStep``, block i being prompt ``rows[i].index``'s); whoever drives it sets each
    block's result before the next step. The rows hold each prompt's output at the end. ``lengths(row)``: the
    row's next draft length (``common.block_length``); ``rule``: how contract errors name the rule."""
    K, temperature, eos, vocab_size = setup.K, setup.temperature, setup.eos, setup.vocab_size
    with timer("prefill"):
        draft_cache, first_logits = _prefill(draft, rows, vocab_size, setup.prefill_chunk, drop_last=False)
        first_probs = probs_from_logits(first_logits, temperature)  # [R, V]
        target_cache, _ = _prefill(target, rows, vocab_size, setup.prefill_chunk, drop_last=True)
    first = True
    while rows:
        R = len(rows)
        blocks = [lengths(row) for row in rows]
        width = max(blocks)
        with timer("draft"):
            if not first:
                first_probs = _first_draft_probs(draft, draft_cache, rows, temperature, vocab_size)
            draft_tokens, draft_probs = _draft_blocks(draft, draft_cache, first_probs, rows, K, blocks,
                                                      temperature, vocab_size)
        with timer("target"):
            last = to_device(torch.tensor([row.committed[-1] for row in rows]), target_cache.device)
            inputs = torch.cat([last.repeat_interleave(K).unsqueeze(1), draft_tokens.reshape(R * K, width)], dim=1)
            target_cache.repeat_rows(K)
            logits = target_cache.forward(target, inputs, [width + 1] * (R * K), vocab_size, keep_last=width + 1)
            target_probs = probs_from_logits(logits, temperature).view(R, K, width + 1, -1)
        with timer("verify"):  # the rules run while the step is out (their time is the verify section's)
            step = BlockStep([
                DraftedBlock(row.index, draft_tokens[i, :, :block], draft_probs[i, :, :block],
                             target_probs[i, :, :block + 1], row.generator, row.state, len(row.new_tokens))
                for i, (row, block) in enumerate(zip(rows, blocks))
            ])
            yield step
            results = step.verified()
            emitted = read_outcomes(results, draft_tokens, blocks, K, rule)  # the one host read
        keep_rows, target_lengths, draft_lengths, still = [], [], [], []
        for i, (row, result, block, tokens) in enumerate(zip(rows, results, blocks, emitted)):
            tau, chosen = len(tokens) - 1, int(result.draft_index)
            committed = len(row.committed)
            row.calls += 1
            row.state = result.state
            row.accepted_lengths.append(tau)
            row.block_lengths.append(block)
            if row.emit(tokens, eos):
                continue
            still.append(row)
            keep_rows.append(i * K + chosen)
            target_lengths.append(committed + tau)  # the text but its last token (pending, fed next)
            draft_lengths.append(min(committed + tau, committed + block - 1))  # x_L is never fed to the draft
            row.draft_pending = row.committed[draft_lengths[-1]:]
        rows, first = still, False
        if not rows:
            return
        with timer("target"):
            target_cache.select_rows(keep_rows)
            target_cache.truncate(target_lengths)
        with timer("draft"):
            draft_cache.select_rows(keep_rows)
            draft_cache.truncate(draft_lengths)


def _first_draft_probs(draft, cache: BatchCache, rows, temperature, vocab_size) -> torch.Tensor:
    """q at each prompt's first draft position, [R, V]: one forward feeds every prompt's pending tokens
    (1 or 2: the last emitted token, preceded by x_L when the whole block was accepted)."""
    width = max(len(row.draft_pending) for row in rows)
    tokens = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        tokens[i, width - len(row.draft_pending):] = torch.tensor(row.draft_pending)
    logits = cache.forward(draft, to_device(tokens, cache.device), [len(row.draft_pending) for row in rows],
                           vocab_size, keep_last=1)
    return probs_from_logits(logits[:, -1], temperature)


def _draft_blocks(draft, cache: BatchCache, first_probs, rows, K, blocks, temperature, vocab_size):
    """Every prompt's K drafts, as ``drafting.draft_block`` at batch 1: draft_tokens [R, K, W] and
    draft_probs [R, K, W, V], W = the longest block; prompt i's columns past ``blocks[i]`` are
    placeholders (not drawn, never verified). The cache ends with R*K rows."""
    R, width = len(rows), max(blocks)
    probs = first_probs.repeat_interleave(K, dim=0)  # [R*K, V]
    cache.repeat_rows(K)
    tokens = _sample_per_prompt(probs, rows)
    all_tokens, all_probs = [tokens], [probs]
    for position in range(1, width):
        logits = cache.forward(draft, tokens.unsqueeze(1), [1] * (R * K), vocab_size, keep_last=1)
        probs = probs_from_logits(logits[:, -1], temperature)
        tokens = _sample_per_prompt(probs, rows, [position < block for block in blocks], tokens)
        all_tokens.append(tokens)
        all_probs.append(probs)
    draft_tokens = torch.stack(all_tokens, dim=1).view(R, K, width)
    draft_probs = torch.stack(all_probs, dim=1).view(R, K, width, -1)
    return draft_tokens, draft_probs


__all__ = ["BatchOutput", "batch_decoding", "batched_steps", "generate_batch"]
