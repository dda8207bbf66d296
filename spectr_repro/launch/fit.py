"""Will a long input fit? The context window and the memory a bucket of input length needs, before any model loads.

A dataset config that fixes its prompt length (a long-input bucket, ``conf/dataset/longcode_<n>k.yaml``) is checked
by :func:`check_context_fits`, which ``launch.config.check_before_loading`` calls for every command that loads
models:

- positions: prompt + max_new_tokens + the block's L + 1 must fit the pair's ``max_position_embeddings``;
- memory: both models' weights + the KV caches of both at that many positions on ``rows`` rows, plus one layer of
  each model's cache again (transformers replaces a layer's keys and values when the one-prompt engine repeats the
  committed cache over the K drafts or extends it, so only the layer being replaced is held twice:
  ``scripts/kv_peak_memory.py``, docs/context.md), plus the logits of one target call, must fit
  ``hardware.memory_gb`` when set (the device's whole memory, as for a batch), else the free memory of the device
  now (``psutil`` on a CPU, ``torch.cuda.mem_get_info`` on a GPU), less ``HEADROOM`` for the activations of a forward
  and the allocator.

A bucket that does not fit is one UsageError naming the largest packaged bucket that does (exit 2, nothing written).
Datasets whose prompts are only known once tokenized are not checked here (their prompts are short).
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil
import torch
from omegaconf import OmegaConf

from spectr_repro.conf import conf_dir
from spectr_repro.cost.shapes import batch_memory_bytes, largest_batch, model_shape, width_of
from spectr_repro.data import declared_prompt_tokens, get_dataset, typical_prompt_tokens
from spectr_repro.errors import UsageError
from spectr_repro.models import pair_config
from spectr_repro.settings import RunConfig

HEADROOM = 0.15  # of the free memory, kept for activations, the allocator and the rest of the process


@dataclass(frozen=True)
class ContextNeed:
    """What one (pair, input length, rows) needs: positions of the longest sequence, and bytes in memory."""

    positions: int
    weight_bytes: int
    cache_bytes: int  # KV caches of target and draft on ``rows`` rows, one layer of each again, the call's logits

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.cache_bytes


def context_need(pair: dict, prompt_tokens: int, max_new_tokens: int, block_L: int, rows: int, width: int
                 ) -> ContextNeed | None:
    """The positions and bytes a run of ``rows`` drafts of ``block_L`` tokens after a ``prompt_tokens`` prompt needs
    (``width``: bytes per weight and cache entry); None when the pair's architecture is not known here."""
    positions = int(prompt_tokens) + int(max_new_tokens) + int(block_L) + 1
    try:
        target, draft = model_shape(pair, "target"), model_shape(pair, "draft")
    except (ValueError, OSError, KeyError):
        return None
    weights = target.params * width + draft.params * width
    cache = rows * positions * (target.kv_bytes_per_token(width) + draft.kv_bytes_per_token(width))
    cache += rows * positions * sum(m.kv_bytes_per_token(width) // m.layers for m in (target, draft))  # replaced
    logits = rows * (block_L + 1) * target.vocab * 4  # one target call's logits in float32
    return ContextNeed(positions, weights, cache + logits)


def free_bytes(device) -> int:
    """Free memory of ``device`` (bytes): the GPU's for cuda, the machine's available memory otherwise."""
    if device is not None and str(device).startswith("cuda"):
        return int(torch.cuda.mem_get_info(torch.device(str(device)))[0])

    return int(psutil.virtual_memory().available)


def packaged_buckets() -> list[tuple[str, int]]:
    """(dataset config, input tokens) of every packaged config that fixes its prompt length, shortest first."""
    buckets = []
    for path in sorted((conf_dir() / "dataset").glob("*.yaml")):
        config = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
        try:
            get_dataset(str(config.get("name")))
            tokens = declared_prompt_tokens(config)
        except ValueError:
            continue
        if tokens is not None:
            buckets.append((path.stem, tokens))
    return sorted(buckets, key=lambda item: (item[1], item[0]))


def check_context_fits(run: RunConfig, rows: int, block_L: int, window: tuple[int, str] | None,
                       free: int | None = None) -> None:
    """UsageError (one message naming the largest packaged bucket that fits) when ``run``'s dataset fixes a prompt
    length that the pair's context ``window`` ((positions, which model): ``launch.config.context_window``; None:
    unknown) or the device's memory (``hardware.memory_gb`` when set, else its free memory: ``free`` bytes, None:
    measured) cannot hold at ``rows`` drafts of ``block_L`` tokens and ``run.max_new_tokens``; nothing for other
    datasets."""
    try:
        prompt = declared_prompt_tokens(run.dataset_values)
    except ValueError as error:
        raise UsageError(str(error)) from None
    if prompt is None:
        return
    pair = pair_config(run.named_pair_values)
    width = width_of(str(run.hardware.dtype or pair.get("dtype") or "float32"))
    new_tokens = run.max_new_tokens
    memory_gb = run.hardware.memory_gb
    available, whose = (memory_gb * 1e9, "hardware.memory_gb") if memory_gb else (None, "free")

    def fits(tokens: int) -> tuple[bool, str]:
        nonlocal available
        need = context_need(pair, tokens, new_tokens, block_L, rows, width)
        positions = tokens + new_tokens + block_L + 1
        if window is not None and positions > window[0]:
            return False, (f"{positions:,} positions (prompt {tokens:,} + max_new_tokens {new_tokens} + a block of "
                           f"L={block_L} + 1) but the context window of {window[1]} is {window[0]:,} positions "
                           f"(max_position_embeddings)")
        if need is None:
            return True, ""
        if available is None:
            available = free if free is not None else free_bytes(run.hardware.device)
        usable = int(available * (1 - HEADROOM))
        if need.total_bytes > usable:
            return False, (f"{need.total_bytes / 2**30:.1f} GiB (weights {need.weight_bytes / 2**30:.1f} + KV caches "
                           f"of {rows} drafts at {positions:,} positions {need.cache_bytes / 2**30:.1f}) but "
                           f"{usable / 2**30:.1f} GiB are usable ({100 * (1 - HEADROOM):.0f} % of "
                           f"{available / 2**30:.1f} GiB, {whose})")
        return True, ""

    ok, why = fits(prompt)
    if ok:
        return
    fitting = [name for name, tokens in packaged_buckets() if fits(tokens)[0]]
    instead = (f"the largest bucket that fits is dataset={fitting[-1]}" if fitting
               else "no packaged bucket fits: use fewer rows (K), a shorter L or max_new_tokens, or a larger device")
    raise UsageError(f"dataset {run.dataset} ({prompt:,}-token prompts) does not fit model pair "
                     f"{run.model_pair} at K={rows}: it needs {why}; {instead}")


def check_batch_fits(run: RunConfig, batch: int, K: int, L: int, key: str, free: int | None = None) -> None:
    """UsageError naming the largest batch that fits when ``batch`` prompts decoded together at K drafts of L tokens
    (``cost.shapes.batch_memory_bytes``: weights, both KV caches on B x (K + 1) rows, a target call's logits and
    activations) need more than the device's memory: ``hardware.memory_gb`` when set (the device's whole memory,
    e.g. a GPU's), else its free memory now (``free``: bytes, for tests), less ``HEADROOM``. ``key``: the setting
    named in the message (``hardware.batch_prompts`` or ``replay.batch_prompts``). Nothing for B = 1 (the context
    check covers it) or a pair whose architecture is not known here."""
    if int(batch) <= 1:
        return

    pair = pair_config(run.named_pair_values)
    try:
        target, draft = model_shape(pair, "target"), model_shape(pair, "draft")
    except (ValueError, OSError, KeyError):
        return
    width = width_of(str(run.hardware.dtype or pair.get("dtype") or "float32"))
    prompt, new_tokens = typical_prompt_tokens(run.dataset), run.max_new_tokens
    memory_gb = run.hardware.memory_gb
    available = memory_gb * 1e9 if memory_gb else (free if free is not None else free_bytes(run.hardware.device))
    usable = int(available * (1 - HEADROOM))

    def need(size: int) -> int:
        return batch_memory_bytes(target, draft, prompt, new_tokens, int(K), int(L), size, width)

    if need(int(batch)) <= usable:
        return
    best = largest_batch(lambda size: need(size) <= usable, int(batch))
    instead = f"the largest that fits is {key}={best}" if best else "not even one prompt fits"
    raise UsageError(f"{key}={batch} does not fit: {batch} prompts of ~{prompt:,} tokens + {new_tokens} new at K={K} "
                     f"L={L} need {need(int(batch)) / 2**30:.1f} GiB (weights, KV caches on {batch} x {K + 1} rows, "
                     f"a target call's logits) but {usable / 2**30:.1f} GiB are usable ({100 * (1 - HEADROOM):.0f} % "
                     f"of {available / 2**30:.1f} GiB); {instead}")


__all__ = ["HEADROOM", "ContextNeed", "check_batch_fits", "check_context_fits", "context_need", "free_bytes",
           "packaged_buckets"]
