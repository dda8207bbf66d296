"""Block efficiency from batches of prompts; speed-up from prompts decoded alone.

    hardware.batch_prompts=8 hardware.timed_prompts=2

``hardware.batch_prompts`` = B > 1: the first ``hardware.timed_prompts`` prompts of every cell (AR
included) are decoded alone and timed, as every prompt is at B = 1, the paper's setting; speed-ups
and tokens/s come from them only. The other prompts are decoded B at a time by
``engine.generate_batch`` with the seeds they would have alone (so each prompt's law, and in float32
its tokens, are those of batch 1): their records carry tokens, target calls, accepted lengths and
``batch_prompts``, and no wall time (None), so nothing downstream can turn a batched wall time into
a speed-up. The cell's summary records ``batch_prompts``, ``timed_prompts`` and the batches' total
wall time ``batched_wall_time_s`` (a throughput of block-efficiency samples, not a speed-up).

B = 1 (the default): every prompt is decoded alone and timed; ``timed_prompts`` is ignored.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tqdm.auto import tqdm

from spectr_repro.engine import generate_batch
from spectr_repro.engine.timing import SectionTimer
from spectr_repro.settings import RunConfig


@dataclass(frozen=True)
class PromptSplit:
    batch_prompts: int  # the configured B
    timed: tuple[int, ...]  # prompt indices decoded alone and timed
    batches: tuple[tuple[int, ...], ...]  # prompt indices decoded together, B at a time (the last may be fewer)


def split_prompts(batch_prompts: int, timed_prompts: int, num_prompts: int) -> PromptSplit:
    """Which prompts are timed alone and which are batched, from ``hardware.batch_prompts`` (B >= 1) and
    ``hardware.timed_prompts`` (>= 0; checked at the door: settings.HardwareSettings)."""
    if batch_prompts == 1:
        return PromptSplit(1, tuple(range(num_prompts)), ())
    timed = min(timed_prompts, num_prompts)
    rest = list(range(timed, num_prompts))
    batches = tuple(tuple(rest[i:i + batch_prompts]) for i in range(0, len(rest), batch_prompts))
    return PromptSplit(batch_prompts, tuple(range(timed)), batches)


def decode_batches(
    pair,
    run: RunConfig,
    method: str,
    options: dict[str, Any],
    prompts: Sequence[list[int]],
    split: PromptSplit,
    seed_of: Callable[[int], int],
    should_stop_of: Callable[[int], Callable[[list[int]], bool] | None],
    progress: bool = True,
) -> tuple[dict[int, Any], float]:
    """Decode ``split.batches``: {prompt index: GenerationOutput} and the batches' total wall time (s)."""
    outputs: dict[int, Any] = {}
    if not split.batches:
        return outputs, 0.0
    timer = SectionTimer(pair.device)
    bar = tqdm(split.batches, desc=f"{method} batches of {split.batch_prompts}", unit="batch", leave=False,
               file=sys.stderr, disable=not progress, dynamic_ncols=True)
    with timer("batched"):
        for indices in bar:
            out = generate_batch(
                pair.target, pair.draft, [prompts[i] for i in indices], method=method, K=run.K, L=run.L,
                temperature=run.temperature, max_new_tokens=run.max_new_tokens,
                seeds=[seed_of(i) for i in indices], eos_token_ids=pair.eos_token_ids,
                should_stop=[should_stop_of(i) for i in indices], verifier_options=options or None,
                vocab_size=pair.vocab_size, prefill_chunk=run.hardware.prefill_chunk)
            outputs.update(zip(indices, out.outputs))
    bar.close()
    return outputs, timer.seconds["batched"]


__all__ = ["PromptSplit", "decode_batches", "split_prompts"]
