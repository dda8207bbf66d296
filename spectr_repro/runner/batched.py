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

from omegaconf import DictConfig
from tqdm.auto import tqdm

from spectr_repro.engine import generate_batch
from spectr_repro.engine.timing import SectionTimer


@dataclass(frozen=True)
class PromptSplit:
    batch_prompts: int  # the configured B
    timed: tuple[int, ...]  # prompt indices decoded alone and timed
    batches: tuple[tuple[int, ...], ...]  # prompt indices decoded together, B at a time (the last may be fewer)


def split_prompts(hardware: DictConfig | dict, num_prompts: int) -> PromptSplit:
    """Which prompts are timed alone and which are batched, from ``hardware.batch_prompts`` and
    ``hardware.timed_prompts`` (ValueError naming the key when one is not a valid count)."""
    batch = hardware.get("batch_prompts", 1)
    batch = 1 if batch is None else batch
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"hardware.batch_prompts must be an integer >= 1, got {batch!r}")
    if batch == 1:
        return PromptSplit(1, tuple(range(num_prompts)), ())
    timed = hardware.get("timed_prompts", 0)
    timed = 0 if timed is None else timed
    if isinstance(timed, bool) or not isinstance(timed, int) or timed < 0:
        raise ValueError(f"hardware.timed_prompts must be an integer >= 0, got {timed!r}")
    timed = min(timed, num_prompts)
    rest = list(range(timed, num_prompts))
    batches = tuple(tuple(rest[i:i + batch]) for i in range(0, len(rest), batch))
    return PromptSplit(batch, tuple(range(timed)), batches)


def decode_batches(
    pair,
    cfg: DictConfig,
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
                pair.target, pair.draft, [prompts[i] for i in indices], method=method, K=cfg.K, L=cfg.L,
                temperature=float(cfg.temperature), max_new_tokens=cfg.max_new_tokens,
                seeds=[seed_of(i) for i in indices], eos_token_ids=pair.eos_token_ids,
                should_stop=[should_stop_of(i) for i in indices], verifier_options=options or None,
                vocab_size=pair.vocab_size, prefill_chunk=cfg.hardware.get("prefill_chunk"))
            outputs.update(zip(indices, out.outputs))
    bar.close()
    return outputs, timer.seconds["batched"]


__all__ = ["PromptSplit", "decode_batches", "split_prompts"]
