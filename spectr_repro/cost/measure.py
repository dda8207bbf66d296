"""Measuring what a decoding call costs here, at the shapes a run calls (what ``check`` and the bench calibrate).

- :func:`measure_forward_costs`: seconds per forward of one model at (rows, tokens, logits) shapes, each on top of
  a cached context of the given length(s), as in decoding (``CONTEXT_TOKENS`` by default);
- :func:`record_blocks` and :func:`measure_rule_seconds`: seconds per rule call at (rule, K, L), timed on real
  blocks the engine drafted and scored on the pair (every (K, L) a slice of blocks drafted at K_max x L_max);
- :func:`measure_section_residuals`: what a real decode spends per call in each engine section beyond the
  forwards and the rule (sampling, cache bookkeeping, the host read), from which ``cost.model.SectionOverheads``
  fits the overhead of every section at any (K, L).
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable, Iterable, Sequence

import torch
from tqdm.auto import tqdm
from transformers import DynamicCache

from spectr_repro.cost.calibration import ForwardCosts
from spectr_repro.cost.model import section_residual
from spectr_repro.engine import generate, generate_batch
from spectr_repro.engine.cache import crop_to, keep_row, repeat_rows
from spectr_repro.engine.forward import forward_logits, head_size
from spectr_repro.engine.timing import SectionTimer
from spectr_repro.verify import Verifier, get_verifier

CONTEXT_TOKENS = 64  # cached tokens below each timed forward (a prompt's worth, as in decoding)
AR_DECODES = 3  # measure_section_residuals: AR's decodes per context, their median kept
PREFILL_PIECE = 2048  # the cached context is fed in pieces this long (a long-input bucket's 16K at once needs far more
# activation memory than any forward that is timed on top of it)


def plan_shapes(Ks: Sequence[int], Ls: Sequence[int], prefill_chunks: Sequence[int],
                batch_sizes: Sequence[int] = (1,)) -> dict[str, list[tuple[int, int, str]]]:
    """The (rows, tokens, logits) shapes a run of these K, L, prefill chunks and prompt batch sizes calls, per
    role (see ``engine.loop``): with B prompts at once, the target scores B*K rows x (L+1) tokens (every
    position's logits) after feeding the last emitted token of each prompt (B x 1); the draft feeds the 1-2
    pending tokens (B x 2) and then steps B*K rows x 1 token; both read each prompt in chunks (1 x chunk,
    the last position's logits only)."""
    target, draft = set(), set()
    for chunk in prefill_chunks:
        target.add((1, int(chunk), "last"))
        draft.add((1, int(chunk), "last"))
    for batch in batch_sizes:
        target.add((int(batch), 1, "last"))
        draft.add((int(batch), 2, "last"))
        for K in Ks:
            rows = int(batch) * int(K)
            draft.add((rows, 1, "last"))
            for L in Ls:
                target.add((rows, int(L) + 1, "all"))
    return {"target": sorted(target), "draft": sorted(draft)}


def measure_forward_costs(model: torch.nn.Module, shapes: Sequence[tuple[int, int, str]], repeats: int = 2,
                          context_tokens: int | Sequence[int] = CONTEXT_TOKENS,
                          vocab_size: int | None = None) -> ForwardCosts:
    """Median seconds of one cached forward of ``model`` at each (rows, tokens, logits) shape, at each context
    length of ``context_tokens`` (one or several), and each shape's relative spread over the repeats.

    A context of ``context_tokens`` is cached once; before each timed forward the cache is cut back to it
    and repeated over the rows, as the engine repeats the committed prefix over K drafts. The forward is
    the engine's (``engine.forward.forward_logits``, the head on the last position or on all). Two untimed
    forwards first (threads, allocator), one per shape (kernel selection), then ``repeats`` rounds that time
    every shape once each, in turn, each forward between two synchronisations (the one timing helper,
    ``SectionTimer``). Rounds rather than one shape's repeats back to back: on a machine whose speed drifts
    (a shared VM measured 120 ms, then 207 ms, for the same decode forward 50 minutes apart) every shape
    sees the same drift, so the costs stay consistent with each other.
    """
    contexts = [int(context_tokens)] if isinstance(context_tokens, int) else [int(c) for c in context_tokens]
    points, measured_contexts, spreads = [], [], []
    for context, times in zip(contexts, _time_shapes(model, shapes, repeats, contexts, vocab_size)):
        for (rows, tokens, logits), seconds in zip(shapes, times):
            median = float(statistics.median(seconds))
            points.append((int(rows), int(tokens), str(logits), median))
            measured_contexts.append(context)
            spreads.append((max(seconds) - min(seconds)) / 2 / median if median > 0 else 0.0)
    return ForwardCosts(tuple(points), tuple(measured_contexts), tuple(spreads))


def _time_shapes(model, shapes, repeats: int, contexts: Sequence[int], vocab_size: int | None
                 ) -> list[list[list[float]]]:
    """Seconds of every repeat of every shape on a cached context of each of ``contexts`` tokens, [context][shape]
    (see the caller). The contexts take turns within each round, as the shapes do: measured one after the other,
    the machine's drift between them read as a cost of context (2026-12-03: a decode forward 252 ms on 75 cached
    tokens, then 228 ms on 552)."""
    device = next(model.parameters()).device
    vocab = int(vocab_size or head_size(model))
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        caches = []
        for context_tokens in contexts:
            cache = DynamicCache()
            context = torch.randint(0, vocab, (1, context_tokens), generator=generator).to(device)
            for start in range(0, context_tokens, PREFILL_PIECE):  # a long context in pieces: no 16K-token forward
                forward_logits(model, context[:, start:start + PREFILL_PIECE], cache, vocab, keep_last=1)
            for _ in range(2):
                forward_logits(model, context[:, :1], cache, vocab, keep_last=1)
                crop_to(cache, context_tokens)
            caches.append(cache)
        inputs = [torch.randint(0, vocab, (rows, tokens), generator=generator).to(device)
                  for rows, tokens, _ in shapes]
        times: list[list[list[float]]] = [[[] for _ in shapes] for _ in contexts]
        # a calibration at batch shapes runs for half an hour on a 2-core CPU: show how far it is
        bar = tqdm(total=(repeats + 1) * len(contexts) * len(shapes), desc=f"timing forwards [{type(model).__name__}]",
                   unit="forward", leave=False, dynamic_ncols=True)
        for attempt in range(repeats + 1):  # attempt 0 warms every shape up (kernel selection)
            for which, (cache, context_tokens) in enumerate(zip(caches, contexts)):
                for index, ((rows, tokens, logits), ids) in enumerate(zip(shapes, inputs)):
                    repeat_rows(cache, rows)
                    timer = SectionTimer(device)
                    with timer("forward"):
                        forward_logits(model, ids, cache, vocab, keep_last=tokens if logits == "all" else 1)
                    crop_to(cache, context_tokens)
                    keep_row(cache, 0, rows, device)
                    if attempt:
                        times[which][index].append(timer.seconds["forward"])
                    bar.update()
        bar.close()
    return times


# --------------------------------------------------------------------------------------------------
# Rule calls on real blocks


def record_blocks(target, draft, prompt: torch.Tensor, K: int, L: int, count: int, temperature: float,
                  vocab_size: int | None = None, prefill_chunk: int | None = None) -> list[tuple]:
    """``count`` real (draft_tokens [K, L], draft_probs [K, L, V], target_probs [K, L+1, V]) blocks: the engine
    drafts K x L on the pair and scores them, under a lossless rule (sd at K = 1, spectr above) that advances the
    text. Real blocks, not synthetic ones: a multi-draft rule's cost depends on how long its drafts stay together
    (on code the Qwen pair's drafts often coincide for many tokens)."""
    class Recorder(Verifier):
        def __init__(self) -> None:
            super().__init__(check_inputs=False)
            self.inner = get_verifier("sd" if K == 1 else "spectr", check_inputs=False)
            self.name, self.single_draft, self.lossless = self.inner.name, self.inner.single_draft, True
            self.blocks: list[tuple] = []

        def _sample(self, draft_tokens, draft_probs, target_probs, generator, state):
            if len(self.blocks) < count and draft_tokens.shape[-1] == L:
                self.blocks.append((draft_tokens.clone(), draft_probs.clone(), target_probs.clone()))
            return self.inner(draft_tokens, draft_probs, target_probs, generator=generator, state=state)

    recorder = Recorder()
    generate(target, draft, prompt, method=recorder, K=K, L=L, temperature=temperature,
             max_new_tokens=(count + 1) * (L + 1) + 1, seed=0, vocab_size=vocab_size, eos_token_ids=(),
             should_stop=lambda tokens: len(recorder.blocks) >= count, prefill_chunk=prefill_chunk)
    return recorder.blocks


def measure_rule_seconds(blocks: Sequence[tuple], grid: Iterable[tuple[str, int, int]],
                         repeats: int = 1) -> dict[tuple[str, int, int], float]:
    """Median seconds of one call of each (rule, K, L) of ``grid`` on the first K drafts and L tokens of each of
    ``blocks`` (drafted at least that wide and long): one untimed call per block first (buffers, memos), then
    ``repeats`` timed calls per block. Rules that carry state (gbv) are timed on their first call."""
    seconds = {}
    for rule, K, L in grid:
        verifier = get_verifier(rule, check_inputs=False)
        device = blocks[0][1].device
        generator = torch.Generator(device=device).manual_seed(0)
        times = []
        for tokens, q, p in blocks:
            inputs = (tokens[:K, :L], q[:K, :L], p[:K, :L + 1])
            verifier(*inputs, generator=generator)
            for _ in range(repeats):
                call = functools.partial(verifier, *inputs, generator=generator)
                times.append(_timed(device, call))
        seconds[(rule, int(K), int(L))] = float(statistics.median(times))
    return seconds


def _timed(device: torch.device, call: Callable[[], object]) -> float:
    timer = SectionTimer(device)
    with timer("call"):
        call()
    return timer.seconds["call"]


# --------------------------------------------------------------------------------------------------
# Engine sections beyond the forwards and the rule


def measure_section_residuals(target, draft, prompt: torch.Tensor, shapes: Iterable[tuple[int, int]],
                              target_costs: ForwardCosts, draft_costs: ForwardCosts,
                              rule_seconds: dict[tuple[str, int, int], float], temperature: float,
                              calls: int = 4, vocab_size: int | None = None,
                              prefill_chunk: int | None = None, ar: bool = True, batched: bool = False,
                              batch: int = 1) -> list[dict]:
    """Per (K, L) of ``shapes``: one real decode of ``calls`` iterations (sd at K = 1, spectr above; EOS off),
    and per call what each engine section spent beyond what the forwards (``target_costs``, ``draft_costs``,
    measured at the prompt's context) and the rule (``rule_seconds``) explain; plus AR's per token. The first
    iteration's scoring runs in the prefill section, so the target's per call is over ``calls - 1``.

    ``batched``: decode with ``engine.generate_batch`` (a batch of this one prompt), the path a batch bench times.
    Its sections are not ``generate``'s: it scores the first block in the target section (per call over ``calls``)
    and feeds the draft's first pending token in the prefill, which is put back here (the model charges that
    forward to every call). Its overheads differ too: on the Qwen pair (2026-12-07, Intel Xeon) a K = 3 call of
    ``generate_batch`` at B = 1 cost ~0.02 s beyond its forwards in the target section. ``batch`` (batched only):
    decode that many copies of the prompt together (their own seeds, all running every call), and take the forwards
    and rules of that many prompts out of each call (see ``SectionOverheads`` for why)."""
    if batch != 1 and not batched:
        raise ValueError("copies of the prompt are decoded together by generate_batch only: pass batched=True")
    context = int(prompt.numel())
    decode = functools.partial(functools.partial(_decode_batch, copies=batch) if batched else _decode_alone, target,
                               prompt=prompt, temperature=temperature, vocab_size=vocab_size,
                               prefill_chunk=prefill_chunk)
    rows = []
    for K, L in shapes:
        rule = "sd" if K == 1 else "spectr"
        n, sections = decode(draft, method=rule, K=K, L=L, max_new_tokens=calls * (L + 1) + 1,
                             should_stop=[_stop_after(calls) for _ in range(batch)])
        timed = sum(v for key, v in sections.items() if key != "total")
        draft_s = sections.get("draft", 0.0) + (draft_costs.seconds(batch, 2, context=context) if batched else 0.0)
        target_calls = n if batched else max(1, n - 1)
        measured = {"draft": draft_s / n, "target": sections.get("target", 0.0) / target_calls,
                    "verify": sections.get("verify", 0.0) / n, "other": (sections["total"] - timed) / n}
        rows.append({"K": int(K), "L": int(L), "calls": n, "rule": rule, "context": context, "batch": batch,
                     "measured": measured, **section_residual(measured, target_costs, draft_costs, rule_seconds,
                                                              rule, K, L, context, batch)})
    if not ar:
        return rows
    # AR's token: the median of three decodes. One decode once read 532 ms a token on a 552-token context where four
    # more read 258-263 (Qwen pair, 2026-12-03), and AR's token divides every predicted speed-up.
    runs = []
    for _ in range(AR_DECODES):
        calls_made, sections = decode(None, method="ar", max_new_tokens=calls * 4)
        tokens = max(1, calls_made - 1)
        runs.append({"target": sections.get("target", 0.0) / tokens,
                     "other": (sections["total"] - sum(v for k, v in sections.items() if k != "total")) / tokens})
    measured = {key: float(statistics.median(run[key] for run in runs)) for key in ("target", "other")}
    rows.append({"K": 0, "L": 0, "calls": calls_made, "rule": "ar", "context": context, "batch": batch,
                 "measured": measured, "decodes": runs,
                 "target": measured["target"] - target_costs.seconds(batch, 1, context=context),
                 "other": measured["other"]})
    return rows


def _stop_after(calls: int) -> Callable[[list[int]], bool]:
    """A stop for one prompt: true at its ``calls``-th call (each prompt of a batch counts its own)."""
    done = [0]

    def stop(tokens) -> bool:
        done[0] += 1
        return done[0] >= calls

    return stop


def _decode_alone(target, draft, *, prompt, temperature, vocab_size, prefill_chunk, method, max_new_tokens,
                  K: int = 1, L: int = 1, should_stop=None) -> tuple[int, dict[str, float]]:
    """One ``generate`` (seed 0, EOS off): its target calls and seconds per section."""
    out = generate(target, draft, prompt, method=method, K=K, L=L, temperature=temperature,
                   max_new_tokens=max_new_tokens, seed=0, vocab_size=vocab_size, eos_token_ids=(),
                   should_stop=should_stop[0] if should_stop else None, prefill_chunk=prefill_chunk)
    return out.target_calls, out.stats["time_s"]


def _decode_batch(target, draft, *, prompt, copies, temperature, vocab_size, prefill_chunk, method, max_new_tokens,
                  K: int = 1, L: int = 1, should_stop=None) -> tuple[int, dict[str, float]]:
    """The same decode by ``generate_batch`` with ``copies`` of the prompt (seeds 0, 1, ...): the first prompt's
    target calls, and the batch's seconds per section."""
    out = generate_batch(target, draft, [prompt] * copies, method=method, K=K, L=L, temperature=temperature,
                         max_new_tokens=max_new_tokens, seeds=list(range(copies)), vocab_size=vocab_size,
                         eos_token_ids=(), should_stop=should_stop, prefill_chunk=prefill_chunk)
    return out.outputs[0].target_calls, out.stats["time_s"]


def measure_memory_bandwidth(size_bytes: int = 1 << 30, repeats: int = 5, device: str | torch.device = "cpu") -> float:
    """This machine's memory read bandwidth in bytes/s: a float32 tensor of ``size_bytes`` (1 GiB: far beyond any
    cache) summed, the median of ``repeats`` timed reads after one untimed one (the pages are touched, the
    threads started). A sum reads every byte once and writes nothing, as a decode forward streams its weights;
    a copy would also write (and, on most CPUs, read the destination first), mixing in other traffic."""
    data = torch.ones(max(1, size_bytes // 4), dtype=torch.float32, device=device)
    seconds = []
    for attempt in range(repeats + 1):
        timer = SectionTimer(data.device)
        with timer("read"):
            data.sum()
        if attempt:
            seconds.append(timer.seconds["read"])
    return data.numel() * 4 / statistics.median(seconds)


def measure_matmul_flops(size: int | None = None, dtype: torch.dtype = torch.bfloat16, repeats: int = 3,
                         device: str | torch.device = "cpu", min_seconds: float = 0.1, max_size: int = 8192) -> float:
    """This machine's matmul rate in FLOP/s in ``dtype``: a ``size`` x ``size`` product (2 size^3 FLOPs), the median
    of ``repeats`` after one untimed (kernel selection). The compute roof of this machine's roofline.

    ``size=None`` sizes the product to the machine: from 256, doubled until one product takes ``min_seconds``
    (its fixed overheads then negligible) or reaches ``max_size``. A fixed 2048 took ~25 s a product in bfloat16
    on this project's 2-core CPU (no native bf16: ~0.7 GFLOP/s), which made every `check` pay ~100 s for it; a
    GPU reaches 8192 in milliseconds."""
    generator = torch.Generator().manual_seed(0)

    def operands(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return tuple(torch.randn(n, n, generator=generator).to(device=device, dtype=dtype) for _ in range(2))

    def product_seconds(a: torch.Tensor, b: torch.Tensor) -> float:
        timer = SectionTimer(a.device)
        with timer("matmul"):
            a @ b
        return timer.seconds["matmul"]

    if size is None:
        size = 256
        a, b = operands(size)
        product_seconds(a, b)  # kernel selection, threads
        while size < max_size and product_seconds(a, b) < min_seconds:
            size *= 2
            a, b = operands(size)
    else:
        a, b = operands(size)
    seconds = [product_seconds(a, b) for _ in range(repeats + 1)][1:]
    return 2.0 * size**3 / statistics.median(seconds)


def machine_roofline_figures(device: str | torch.device = "cpu",
                             dtype: torch.dtype = torch.bfloat16) -> dict[str, float]:
    """The two roofs of this machine, as a calibration entry's extra fields (``Calibration.extra``): read bandwidth
    in GB/s and matmul rate in TFLOP/s in ``dtype``. ``check`` stores them beside its forward costs so that the
    report can set the roofline of this machine against the forwards it calibrated."""
    return {"memory_bandwidth_gbs": measure_memory_bandwidth(device=device) / 1e9,
            "matmul_tflops": measure_matmul_flops(dtype=dtype, device=device) / 1e12}


__all__ = ["CONTEXT_TOKENS", "machine_roofline_figures", "measure_forward_costs", "measure_matmul_flops",
           "measure_memory_bandwidth", "measure_rule_seconds", "measure_section_residuals", "plan_shapes",
           "record_blocks"]
