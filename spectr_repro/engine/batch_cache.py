"""KV cache of a batch of texts of different lengths, for ``engine.batched``.

One transformers ``DynamicCache`` holds every row. Each forward appends the same number of columns W
to every row; a row's real tokens among them are right-aligned and get explicit position ids that
continue that row's own text. Every other column is a *hole*, masked out of attention (the 2-D
``attention_mask``) for every later query: the padding on the left of a row's real tokens, the left
padding that aligns rows of different lengths, and, after verification, the columns of rejected
draft tokens. Nothing is cropped per row; ``Cache.crop`` drops only columns that are holes in every
row, and ``compact`` re-packs the rows when holes pile up.

Why this is exact: transformers 5 builds the causal mask by cache *column* (the query offset is the
cache length, ``masking_utils._preprocess_mask_arguments``) and combines it with the 2-D mask, and it
uses ``position_ids`` only for the rotary embedding. So a real token attends to exactly the real
tokens of its own row that precede it, in order, each keyed at its own text position: the
computation of a batch-1 forward on that row's text, up to the float rounding of other shapes
(masked scores are -inf, so a hole's weight is exactly 0). Every query has at least one real key
(its row's text so far, or itself), so no attention row is fully masked (NaN) and no hole holds a
NaN that a zero weight could turn into one (0 * NaN).

Host bookkeeping: ``columns[r]`` lists the cache column of each text token of row r. A token's
position id is its index there, truncating row r to n tokens deletes the tail of that list and
masks those columns, and compaction gathers those columns.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache

from spectr_repro.engine.cache import crop_to
from spectr_repro.engine.forward import _cache_argument

# Compact when the holes that every row carries exceed this many columns and this many per token of
# the longest row's text (a gather of the whole cache: worth it only when it halves the width).
MIN_HOLES_TO_COMPACT = 64
HOLES_PER_TOKEN_TO_COMPACT = 1.0


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host-built index/mask tensor -> ``device`` without waiting for the device's queue (a blocking
    host-to-GPU copy synchronises the stream); a no-op on the CPU."""
    return host.to(device, non_blocking=True)


class BatchCache:
    def __init__(self, cache: DynamicCache, columns: list[list[int]], num_columns: int, device: torch.device):
        self.cache = cache
        self.columns = columns  # per row: the cache column of each of its text tokens, in text order
        self.device = torch.device(device)
        self.mask = torch.zeros(len(columns), num_columns, dtype=torch.bool)  # host copy: True = attended
        for row, cols in enumerate(columns):
            self.mask[row, cols] = True
        self._check()

    # -- construction -------------------------------------------------------------------------------
    @classmethod
    def from_caches(cls, caches: Sequence[DynamicCache], device: torch.device) -> BatchCache:
        """Stack batch-1 caches (any lengths, empty ones included) into one, left-padded with holes."""
        lengths = [cache.get_seq_length() for cache in caches]
        width = max(lengths, default=0)
        columns = [list(range(width - n, width)) for n in lengths]
        if width == 0:
            return cls(DynamicCache(), columns, 0, device)
        per_cache = [list(cache) if n else None for cache, n in zip(caches, lengths)]
        reference = next(layers for layers in per_cache if layers is not None)
        data = []
        for index, (keys, values, sliding) in enumerate(reference):
            if sliding is not None:
                raise ValueError("batched decoding needs full-attention caches (this model has sliding-window "
                                 "layers, whose windows count cache columns, holes included)")
            stacked = []
            for kind, tensor in enumerate((keys, values)):  # kind 0: keys, 1: values
                out = tensor.new_zeros(len(caches), tensor.shape[1], width, tensor.shape[3])  # [B, H, C, D]
                for row, (layers, n) in enumerate(zip(per_cache, lengths)):
                    if n:
                        out[row, :, width - n:] = layers[index][kind][0]
                stacked.append(out)
            data.append(tuple(stacked))
        return cls(DynamicCache(ddp_cache_data=data), columns, width, device)

    # -- shape --------------------------------------------------------------------------------------
    @property
    def num_rows(self) -> int:
        return len(self.columns)

    @property
    def num_columns(self) -> int:
        return self.mask.shape[1]

    def lengths(self) -> list[int]:
        """Text length of each row."""
        return [len(cols) for cols in self.columns]

    # -- forward ------------------------------------------------------------------------------------
    def forward(
        self,
        model: torch.nn.Module,
        tokens: torch.Tensor,
        num_real: Sequence[int],
        vocab_size: int,
        keep_last: int,
    ) -> torch.Tensor:
        """Append ``tokens`` [R, W] to every row and return logits [R, keep_last, vocab_size].

        Row r's real tokens are its last ``num_real[r]`` (>= 1) columns; the columns before them are
        padding (any valid id) and become holes. Logits are those of the last ``keep_last`` columns,
        so every row's last real token has logits.
        """
        rows, width = tokens.shape
        if rows != self.num_rows or len(num_real) != rows:
            raise ValueError(f"{rows} rows of tokens and {len(num_real)} counts for a cache of {self.num_rows} rows")
        start = self.num_columns
        positions = torch.empty(rows, width, dtype=torch.long)
        new_mask = torch.zeros(rows, width, dtype=torch.bool)
        for row, (cols, real) in enumerate(zip(self.columns, num_real)):
            if not 1 <= real <= width:
                raise ValueError(f"row {row}: {real} real tokens in a block of {width}")
            first = len(cols)
            positions[row, :width - real] = first  # padding: any position (its outputs are never read)
            positions[row, width - real:] = torch.arange(first, first + real)
            new_mask[row, width - real:] = True
            cols.extend(range(start + width - real, start + width))
        self.mask = torch.cat([self.mask, new_mask], dim=1)
        output = model(
            input_ids=tokens,
            attention_mask=to_device(self.mask, self.device),
            position_ids=to_device(positions, self.device),
            use_cache=True,
            logits_to_keep=keep_last,
            **{_cache_argument(type(model)): self.cache},
        )
        return output.logits[..., :vocab_size]

    # -- rows ---------------------------------------------------------------------------------------
    def repeat_rows(self, repeats: int) -> None:
        """Row r -> rows r*repeats .. r*repeats + repeats-1 (identical copies)."""
        if repeats == 1:
            return
        if self.num_columns:
            self.cache.batch_repeat_interleave(repeats)
        self.columns = [list(cols) for cols in self.columns for _ in range(repeats)]
        self.mask = self.mask.repeat_interleave(repeats, dim=0)

    def select_rows(self, rows: Sequence[int]) -> None:
        """Keep ``rows`` (in that order): the chosen draft of each prompt, finished prompts dropped."""
        rows = list(rows)
        if rows == list(range(self.num_rows)):
            return
        if self.num_columns:
            self.cache.batch_select_indices(to_device(torch.tensor(rows, dtype=torch.long), self.device))
        self.columns = [self.columns[row] for row in rows]
        self.mask = self.mask[rows]

    def truncate(self, lengths: Sequence[int]) -> None:
        """Keep the first ``lengths[r]`` text tokens of each row r (the rest become holes), then drop
        the trailing columns that are holes in every row, and compact when holes pile up."""
        if len(lengths) != self.num_rows:
            raise ValueError(f"{len(lengths)} lengths for {self.num_rows} rows")
        for row, (cols, n) in enumerate(zip(self.columns, lengths)):
            if not 0 <= n <= len(cols):
                raise ValueError(f"row {row}: cannot keep {n} of its {len(cols)} tokens")
            if n < len(cols):
                self.mask[row, cols[n:]] = False
                del cols[n:]
        used = max((cols[-1] + 1 for cols in self.columns if cols), default=0)
        if used < self.num_columns:
            crop_to(self.cache, used)
            self.mask = self.mask[:, :used]
        longest = max(self.lengths(), default=0)
        holes = self.num_columns - longest
        if holes > MIN_HOLES_TO_COMPACT and holes > HOLES_PER_TOKEN_TO_COMPACT * longest:
            self.compact()

    def compact(self) -> None:
        """Re-pack every row's tokens into the last columns (left-padded with holes): the cache becomes
        as wide as the longest row. The same keys and values, gathered: exact."""
        lengths = self.lengths()
        width = max(lengths, default=0)
        if width == self.num_columns:
            return
        index = torch.zeros(self.num_rows, width, dtype=torch.long)  # padding gathers column 0: finite
        for row, cols in enumerate(self.columns):
            if cols:
                index[row, width - len(cols):] = torch.tensor(cols)
        index = to_device(index, self.device)
        data = []
        for keys, values, _ in self.cache:
            gather = index[:, None, :, None].expand(-1, keys.shape[1], -1, keys.shape[3])
            data.append((keys.gather(2, gather), values.gather(2, gather)))
        self.cache = DynamicCache(ddp_cache_data=data) if width else DynamicCache()
        self.columns = [list(range(width - n, width)) for n in lengths]
        self.mask = torch.zeros(self.num_rows, width, dtype=torch.bool)
        for row, n in enumerate(lengths):
            self.mask[row, width - n:] = True

    def _check(self) -> None:
        if self.cache.get_seq_length() != self.num_columns:
            raise RuntimeError(f"cache holds {self.cache.get_seq_length()} columns, bookkeeping {self.num_columns}")


__all__ = ["HOLES_PER_TOKEN_TO_COMPACT", "MIN_HOLES_TO_COMPACT", "BatchCache", "to_device"]
