"""KV-cache bookkeeping on transformers' public ``Cache`` API (DynamicCache).

All rows of a cache hold the same committed prefix when an iteration starts; drafting or scoring
K drafts repeats it along the batch, and after verification only the chosen row is kept and it is
cropped back to the committed length.

transformers 5.x: ``Cache.crop(n)`` takes a NEGATIVE n (remove |n| tokens); positive values, the
4.x "crop to this absolute length" form, raise. ``crop_to`` below hides that difference.
"""

from __future__ import annotations

import torch
from transformers import Cache


def crop_to(cache: Cache, length: int) -> None:
    """Keep the first ``length`` positions of every row."""
    excess = cache.get_seq_length() - length
    if excess < 0:
        raise ValueError(f"cannot crop a cache of length {cache.get_seq_length()} to {length}")
    if excess > 0:
        cache.crop(-excess)


def repeat_rows(cache: Cache, repeats: int) -> None:
    """[1, ...] -> [repeats, ...] along the batch (a no-op, and no copy, for repeats == 1)."""
    if repeats > 1:
        cache.batch_repeat_interleave(repeats)


def keep_row(cache: Cache, row: int, num_rows: int, device: torch.device) -> None:
    """[num_rows, ...] -> [1, ...]: keep batch row ``row`` (a no-op when there is one row)."""
    if num_rows > 1:  # index built on the host and sent without a blocking copy (which would sync a GPU)
        cache.batch_select_indices(torch.tensor([row]).to(device, non_blocking=True))


__all__ = ["crop_to", "keep_row", "repeat_rows"]
