"""One model's KV cache during a ``generate`` call, seen as rows of one batch: eager or compiled.

The loop (``engine.loop``) drives every model through four operations:
    feed_shared(ids)       text every row shares (the prompt; the pending committed tokens); q or p after it
    expand(K)              from here on the rows differ (K drafts)
    feed_rows(tokens, n)   [rows, W] tokens, one row per draft; logits of the last n positions
    keep(row, length)      row ``row`` won: every row becomes it, cut to ``length`` tokens

``DynamicRows`` (default): a ``DynamicCache`` of one row between iterations, repeated K times by
``expand`` and cut back to the chosen row by ``keep``; every forward eager. The prompt rides on the
first forward, as in transformers' generate.

``StaticRows`` (``compile=True``, ``hardware.compile``): a ``StaticCache`` of a fixed number of rows
(K; 1 for AR) whose forwards run under ``torch.compile`` (CUDA graphs via mode "reduce-overhead" on
CUDA). Nothing changes shape: ``expand`` is a no-op (all rows hold the shared text), ``keep`` copies
the winning row's new columns into the other rows and moves the cache length back (``Cache.crop``).
Every compiled call has one of three shapes, all met in a prompt's first iteration (so a runner's
warm-up compiles them before anything is timed): the pending text [rows, 2] (the prompt is prefilled
eagerly at batch 1 up to its last two tokens and copied into every row; afterwards the draft always
re-feeds the last two committed tokens, one of them already cached, which computes the same keys),
one draft step [rows, 1] and a target block [rows, L+1] (a shorter last block is padded; the padding
is cut). Applied to AR and to every speculative method alike, so speed-ups compare like with like.
Exactness: the same model on the same tokens at the same positions; compiled kernels round
differently, so greedy tokens match the eager path's except at near-ties (a slow test checks them).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from transformers import DynamicCache, StaticCache

from spectr_repro.engine.cache import crop_to, keep_row, repeat_rows
from spectr_repro.engine.forward import _cache_argument, forward_chunked

CACHE_LENGTH_STEP = 256  # static caches are sized in steps, so that prompt lengths share compiled graphs


class DynamicRows:
    compiled = False
    pending_width = 1  # the draft re-feeds nothing it already cached

    def __init__(self, model: torch.nn.Module, vocab_size: int, prefill_chunk: int | None) -> None:
        self.model, self.vocab_size, self.prefill_chunk = model, vocab_size, prefill_chunk
        self.cache = DynamicCache()
        self.num_rows = 1

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    def feed_shared(self, ids: torch.Tensor) -> torch.Tensor:
        """Feed ``ids`` (1-D) to the single row; logits [V] after its last token."""
        return forward_chunked(self.model, ids.unsqueeze(0), self.cache, self.vocab_size, 1, self.prefill_chunk)[0, -1]

    def expand(self, K: int) -> None:
        repeat_rows(self.cache, K)
        self.num_rows = K

    def feed_rows(self, tokens: torch.Tensor, keep_last: int) -> torch.Tensor:
        """[rows, W] tokens on top of the cache; logits [rows, keep_last, V]."""
        return forward_chunked(self.model, tokens, self.cache, self.vocab_size, keep_last, self.prefill_chunk)

    def keep(self, row: int, length: int) -> None:
        keep_row(self.cache, row, self.num_rows, tokens_device(self.model))
        self.num_rows = 1
        crop_to(self.cache, min(length, self.length))


class StaticRows:
    compiled = True
    pending_width = 2  # the draft always re-feeds the last two committed tokens: one compiled shape

    def __init__(self, model: torch.nn.Module, role: str, vocab_size: int, prefill_chunk: int | None, rows: int,
                 max_length: int, options: dict[str, Any]) -> None:
        self.model, self.vocab_size, self.prefill_chunk = model, vocab_size, prefill_chunk
        self.num_rows = rows
        self.cache = _static_cache(model, role, rows, max_length)
        self.forward = compiled_forward(model, options)
        self._length = 0  # tokens held by every row (host copy of the cache's length: no reads)
        self._shared = 0  # columns all rows hold alike (the text before the rows diverged)

    @property
    def length(self) -> int:
        return self._length

    def feed_shared(self, ids: torch.Tensor) -> torch.Tensor:
        """Feed ``ids`` (1-D) to every row; logits [V] after its last token.

        On an empty cache (the prompt) all but the last two tokens are prefilled eagerly at batch 1
        (chunked) and copied into every row; the rest, like every later shared text, is a compiled
        [rows, 2] call (a single-token prompt: [rows, 1])."""
        if self._length == 0 and ids.numel() > 2:
            self._prefill(ids[:-2])
            ids = ids[-2:]
        logits = self._call(ids.unsqueeze(0).expand(self.num_rows, -1), keep_last=1)
        self._shared = self._length
        return logits[0, -1]

    def expand(self, K: int) -> None:
        if K != self.num_rows:
            raise ValueError(f"a static cache of {self.num_rows} rows cannot hold {K} drafts")

    def feed_rows(self, tokens: torch.Tensor, keep_last: int) -> torch.Tensor:
        return self._call(tokens, keep_last)

    def keep(self, row: int, length: int) -> None:
        """Every row becomes row ``row``'s first ``length`` tokens."""
        length = min(length, self._length)
        if self.num_rows > 1 and length > self._shared:
            columns = slice(self._shared, length)
            for layer in self.cache.layers:  # in place: the compiled graphs hold these addresses
                for tensor in (layer.keys, layer.values):  # [rows, H, max_length, D]
                    tensor[:, :, columns] = tensor[row:row + 1, :, columns].clone()  # (source and target overlap)
        if length < self._length:
            self.cache.crop(length - self._length)
            self._length = length
        self._shared = self._length

    def _call(self, tokens: torch.Tensor, keep_last: int) -> torch.Tensor:
        output = self.forward(input_ids=tokens, use_cache=True, logits_to_keep=keep_last,
                              **{_cache_argument(type(self.model)): self.cache})
        self._length += tokens.shape[1]
        return output.logits[..., :self.vocab_size]

    def _prefill(self, ids: torch.Tensor) -> None:
        """Eager batch-1 forward of ``ids`` into a dynamic cache, copied into every row of the static one."""
        prefix = DynamicCache()
        forward_chunked(self.model, ids.unsqueeze(0), prefix, self.vocab_size, 1, self.prefill_chunk)
        for layer, (keys, values, _) in enumerate(prefix):
            self.cache.update(keys.expand(self.num_rows, -1, -1, -1), values.expand(self.num_rows, -1, -1, -1), layer)
        self._length = ids.numel()


def make_rows(model: torch.nn.Module, role: str, vocab_size: int, prefill_chunk: int | None, compile: bool | dict,
              rows: int, max_length: int) -> DynamicRows | StaticRows:
    """The rows of ``model`` (``role``: "target" or "draft") for one generate call: eager by default, static
    and compiled with ``compile`` (True: torch.compile's defaults, mode "reduce-overhead" on CUDA; a dict:
    torch.compile's arguments). ``rows``: K (1 for AR); ``max_length``: the most tokens a row will hold."""
    if not compile:
        return DynamicRows(model, vocab_size, prefill_chunk)
    return StaticRows(model, role, vocab_size, prefill_chunk, rows, max_length, compile_options(compile, model))


def compile_options(compile: bool | dict, model: torch.nn.Module) -> dict[str, Any]:
    if isinstance(compile, dict):
        return dict(compile)
    if compile is not True:
        raise ValueError(f"compile must be a bool or a dict of torch.compile arguments, got {compile!r}")
    return {"mode": "reduce-overhead"} if tokens_device(model).type == "cuda" else {}


def tokens_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


# One compiled forward and one static cache per model (and options / rows), reused across prompts:
# compiling is slow, and CUDA graphs are recorded on the cache's fixed addresses.
_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_STATIC_CACHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


# Compiled graphs per code object: target and draft of one architecture share the forward's code, and
# each needs a graph per shape (pending text, draft step, target block; AR's token): more than dynamo's
# default limit of 8, past which it would silently fall back to eager.
RECOMPILE_LIMIT = 64


def compiled_forward(model: torch.nn.Module, options: dict[str, Any]):
    per_model = _COMPILED.setdefault(model, {})
    key = repr(sorted(options.items()))
    if key not in per_model:
        dynamo = torch._dynamo.config
        dynamo.recompile_limit = max(dynamo.recompile_limit, RECOMPILE_LIMIT)
        per_model[key] = torch.compile(model.forward, **options)
    return per_model[key]


def _static_cache(model: torch.nn.Module, role: str, rows: int, max_length: int) -> StaticCache:
    """A reset static cache of ``rows`` rows holding at least ``max_length`` tokens (reused when it fits; one per
    role, so that a model drafting for itself never shares its target's cache)."""
    per_model = _STATIC_CACHES.setdefault(model, {})
    cache = per_model.get((role, rows))
    if cache is None or cache.get_max_length() < max_length:
        size = -(-max_length // CACHE_LENGTH_STEP) * CACHE_LENGTH_STEP
        cache = per_model[role, rows] = StaticCache(config=model.config, max_cache_len=size)
    else:
        cache.reset()
    return cache


__all__ = ["CACHE_LENGTH_STEP", "DynamicRows", "StaticRows", "compile_options", "compiled_forward", "make_rows"]
