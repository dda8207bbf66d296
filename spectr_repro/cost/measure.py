"""Measuring a model's seconds per forward at the shapes a run calls (what ``check`` and the bench calibrate).

Each forward runs on top of a cached context, as in decoding: ``CONTEXT_TOKENS`` tokens, the same for every
shape (the costs do not depend on the context length in this model).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import torch

from spectr_repro.cost.calibration import ForwardCosts

CONTEXT_TOKENS = 64  # cached tokens below each timed forward (a prompt's worth, as in decoding)


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
                          context_tokens: int = CONTEXT_TOKENS, vocab_size: int | None = None) -> ForwardCosts:
    """Median seconds of one cached forward of ``model`` at each (rows, tokens, logits) shape.

    A context of ``context_tokens`` is cached once; before each timed forward the cache is cut back to it
    and repeated over the rows, as the engine repeats the committed prefix over K drafts. The forward is
    the engine's (``engine.forward.forward_logits``, the head on the last position or on all). Two untimed
    forwards first (threads, allocator), one per shape (kernel selection), then ``repeats`` rounds that time
    every shape once each, in turn, each forward between two synchronisations (the one timing helper,
    ``SectionTimer``). Rounds rather than one shape's repeats back to back: on a machine whose speed drifts
    (a shared VM measured 120 ms, then 207 ms, for the same decode forward 50 minutes apart) every shape
    sees the same drift, so the costs stay consistent with each other.
    """
    from transformers import DynamicCache

    from spectr_repro.engine.cache import crop_to, keep_row, repeat_rows
    from spectr_repro.engine.forward import forward_logits, head_size
    from spectr_repro.engine.timing import SectionTimer

    device = next(model.parameters()).device
    vocab = int(vocab_size or head_size(model))
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        cache = DynamicCache()
        context = torch.randint(0, vocab, (1, context_tokens), generator=generator).to(device)
        forward_logits(model, context, cache, vocab, keep_last=1)
        for _ in range(2):
            forward_logits(model, context[:, :1], cache, vocab, keep_last=1)
            crop_to(cache, context_tokens)
        inputs = [torch.randint(0, vocab, (rows, tokens), generator=generator).to(device)
                  for rows, tokens, _ in shapes]
        times: list[list[float]] = [[] for _ in shapes]
        for attempt in range(repeats + 1):  # attempt 0 warms every shape up (kernel selection)
            for index, ((rows, tokens, logits), ids) in enumerate(zip(shapes, inputs)):
                repeat_rows(cache, rows)
                timer = SectionTimer(device)
                with timer("forward"):
                    forward_logits(model, ids, cache, vocab, keep_last=tokens if logits == "all" else 1)
                crop_to(cache, context_tokens)
                keep_row(cache, 0, rows, device)
                if attempt:
                    times[index].append(timer.seconds["forward"])
        points = [(int(rows), int(tokens), str(logits), float(statistics.median(seconds)))
                  for (rows, tokens, logits), seconds in zip(shapes, times)]
    return ForwardCosts(tuple(points))


def measure_memory_bandwidth(size_bytes: int = 1 << 30, repeats: int = 5, device: str | torch.device = "cpu") -> float:
    """This machine's memory read bandwidth in bytes/s: a float32 tensor of ``size_bytes`` (1 GiB: far beyond any
    cache) summed, the median of ``repeats`` timed reads after one untimed one (the pages are touched, the
    threads started). A sum reads every byte once and writes nothing, as a decode forward streams its weights;
    a copy would also write (and, on most CPUs, read the destination first), mixing in other traffic."""
    from spectr_repro.engine.timing import SectionTimer

    data = torch.ones(max(1, size_bytes // 4), dtype=torch.float32, device=device)
    seconds = []
    for attempt in range(repeats + 1):
        timer = SectionTimer(data.device)
        with timer("read"):
            data.sum()
        if attempt:
            seconds.append(timer.seconds["read"])
    return data.numel() * 4 / statistics.median(seconds)


def measure_matmul_flops(size: int = 2048, dtype: torch.dtype = torch.bfloat16, repeats: int = 3,
                         device: str | torch.device = "cpu") -> float:
    """This machine's matmul rate in FLOP/s in ``dtype``: a ``size`` x ``size`` product (2 size^3 FLOPs), the median
    of ``repeats`` after one untimed (kernel selection). The compute roof of this machine's roofline."""
    from spectr_repro.engine.timing import SectionTimer

    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randn(size, size, generator=generator).to(device=device, dtype=dtype) for _ in range(2))
    seconds = []
    for attempt in range(repeats + 1):
        timer = SectionTimer(a.device)
        with timer("matmul"):
            a @ b
        if attempt:
            seconds.append(timer.seconds["matmul"])
    return 2.0 * size**3 / statistics.median(seconds)


def machine_roofline_figures(device: str | torch.device = "cpu",
                             dtype: torch.dtype = torch.bfloat16) -> dict[str, float]:
    """The two roofs of this machine, as a calibration entry's extra fields (``Calibration.extra``): read bandwidth
    in GB/s and matmul rate in TFLOP/s in ``dtype``. ``check`` stores them beside its forward costs so that the
    report can set the roofline of this machine against the forwards it calibrated."""
    return {"memory_bandwidth_gbs": measure_memory_bandwidth(device=device) / 1e9,
            "matmul_tflops": measure_matmul_flops(dtype=dtype, device=device) / 1e12}


__all__ = ["CONTEXT_TOKENS", "machine_roofline_figures", "measure_forward_costs", "measure_matmul_flops",
           "measure_memory_bandwidth", "plan_shapes"]
