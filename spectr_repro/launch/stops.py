"""Stop strings: when generation ends (``stop_checker``) and where the completion is cut (``truncate_at_stop``).

The engine calls ``should_stop(new_tokens)`` after every iteration with all the tokens generated so far; an
iteration appends one token (AR) or up to L+1 (a verified block). Generation ends at the first iteration
after which the generated text contains a stop string.

The matching is transformers' :class:`~transformers.StopStringCriteria`, which works on token ids (its tables
are built once per tokenizer and stop strings) instead of decoding the text again at every step. It fires
only when a stop string ends inside the *last* token of the ids it is given, so it is given, in one batch,
the ids ending at every token appended since the previous call: a stop string completed anywhere in a block
is caught at that block, as with the decoded text.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

import torch
from transformers import StopStringCriteria

# tokenizer -> stop strings -> criteria: building one scans the whole vocabulary, so it is done once per pair
_CRITERIA: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def stop_checker(tokenizer, stop_strings: Sequence[str]) -> Callable[[list[int]], bool] | None:
    """should_stop(new_tokens) for one generation: True once the generated text contains a stop string.

    The checker remembers how many tokens it has seen (it looks only at the new ones), so use a fresh one for
    every generation.
    """
    stops = tuple(s for s in stop_strings if s)
    if not stops:
        return None
    criteria = _criteria(tokenizer, stops)
    # A stop string spans at most one token per byte: the criteria never reads further back than that.
    window = max(len(stop.encode("utf-8")) for stop in stops)
    special = frozenset(tokenizer.all_special_ids)
    text_tokens: list[int] = []  # the generated tokens that reach the text: special ones are skipped, as in decode
    seen = 0

    def should_stop(new_tokens: list[int]) -> bool:
        nonlocal seen
        start = len(text_tokens)
        text_tokens.extend(token for token in new_tokens[seen:] if token not in special)
        seen = len(new_tokens)
        ends = range(start + 1, len(text_tokens) + 1)  # the tokens appended since the last call
        return any(bool(criteria(ids, None).any()) for ids in _windows(text_tokens, ends, window))

    return should_stop


def _criteria(tokenizer, stops: tuple[str, ...]) -> StopStringCriteria:
    by_stops = _CRITERIA.setdefault(tokenizer, {})
    if stops not in by_stops:
        by_stops[stops] = StopStringCriteria(tokenizer, list(stops))
    return by_stops[stops]


def _windows(tokens: list[int], ends: range, window: int) -> list[torch.Tensor]:
    """The ids ending at each of ``ends`` (their last ``window`` tokens) as [rows, length] batches: one batch
    of full windows, and one row each for the first tokens of the generation (shorter than ``window``)."""
    short = [torch.tensor([tokens[:end]]) for end in ends if end < window]
    full = [end for end in ends if end >= window]
    if not full:
        return short
    span = torch.tensor(tokens[full[0] - window:full[-1]])
    return [*short, span.unfold(0, window, 1)]  # row i: the window ending at full[i]


def truncate_at_stop(text: str, stop_strings: Sequence[str]) -> str:
    """The completion up to (not including) the earliest stop string."""
    cut = min((i for i in (text.find(s) for s in stop_strings if s) if i >= 0), default=len(text))
    return text[:cut]


__all__ = ["stop_checker", "truncate_at_stop"]
