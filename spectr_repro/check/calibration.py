"""Measured per-forward costs of a pair's target and draft on this machine, and the file that keeps them.

``python -m spectr_repro check`` times one forward of each model at the shapes a run uses (K rows x
(L+1) tokens for a target call, K rows x 1 token for a draft step, one row of a prompt chunk for a
prefill, and the same at B x K rows for batches of prompts), each on top of a cached context as in
decoding. ``plan`` (and the best-configuration prediction) then take these seconds in place of the
assumed cost model of ``hardware.estimate``.

The file is per machine: ``<cache root>/calibration/<hostname>.json`` (``$SPECTR_REPRO_CACHE`` or
``~/.cache/spectr_repro``; ``$SPECTR_REPRO_CALIBRATION`` names another file). It holds one entry per
(hardware config, model pair, dtype); a later ``check`` replaces its entry and keeps the others.

Between measured shapes the cost is interpolated linearly in the number of tokens of the call
(rows x tokens per row), and extrapolated with the slope of the last two points beyond the largest:
a forward costs a fixed part (weights read once, Python and kernel launches) plus a part that grows
with the tokens, and the measured points follow that shape closely on CPU and GPU alike.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

CALIBRATION_ENV_VAR = "SPECTR_REPRO_CALIBRATION"
CONTEXT_TOKENS = 64  # cached tokens below each timed forward (a prompt's worth, as in decoding)


def calibration_path() -> Path:
    """This machine's calibration file (``$SPECTR_REPRO_CALIBRATION`` overrides)."""
    configured = os.environ.get(CALIBRATION_ENV_VAR)
    if configured:
        return Path(configured).expanduser()
    from spectr_repro.models.offline import cache_root

    return cache_root() / "calibration" / f"{platform.node() or 'this-machine'}.json"


def entry_key(hardware: str, model_pair: str, dtype: str) -> str:
    return f"{hardware}/{model_pair}/{dtype}"


@dataclass(frozen=True)
class ForwardCosts:
    """Seconds of one forward of one model, measured at (rows, tokens per row, logits) shapes.

    ``logits``: "last" when the head runs on each row's last position only (prefill chunks, draft steps:
    ``engine.forward``'s keep_last), "all" when every position is scored (the target call over K drafts);
    at a 152k vocabulary the head is a large share of a small model's forward, so the two are kept apart.
    """

    points: tuple[tuple[int, int, str, float], ...]  # (rows, tokens per row, logits, median seconds)

    def seconds(self, rows: int, tokens: int, logits: str = "last") -> float:
        """Seconds of a forward over ``rows`` x ``tokens``: the measured shape, else interpolated in rows x tokens
        among the shapes of the same ``logits`` (one token per row: "last" and "all" are the same call)."""
        kind = "last" if tokens == 1 else logits
        for r, t, k, s in self.points:
            if (r, t) == (rows, tokens) and (k == kind or t == 1):
                return s
        same = [(r * t, s) for r, t, k, s in self.points if k == kind or t == 1]
        return _interpolate(same or [(r * t, s) for r, t, _, s in self.points], rows * tokens)

    def to_json(self) -> list[dict[str, Any]]:
        return [{"rows": r, "tokens": t, "logits": k, "seconds": s} for r, t, k, s in self.points]

    @classmethod
    def from_json(cls, rows: Iterable[dict[str, Any]]) -> ForwardCosts:
        return cls(tuple((int(p["rows"]), int(p["tokens"]), str(p.get("logits", "last")), float(p["seconds"]))
                         for p in rows))


def _interpolate(points: Sequence[tuple[int, float]], wanted: int) -> float:
    """Linear in the number of tokens between measured sizes (median per size); below the smallest its cost,
    beyond the largest the slope of the last two."""
    by_size: dict[int, list[float]] = {}
    for size, seconds in points:
        by_size.setdefault(size, []).append(seconds)
    sizes = sorted(by_size)
    costs = [statistics.median(by_size[n]) for n in sizes]
    if len(sizes) == 1 or wanted <= sizes[0]:
        return costs[0]
    for n0, c0, n1, c1 in zip(sizes, costs, sizes[1:], costs[1:]):
        if wanted <= n1:
            return c0 + (c1 - c0) * (wanted - n0) / (n1 - n0)
    n0, c0, n1, c1 = sizes[-2], costs[-2], sizes[-1], costs[-1]
    return c1 + max(0.0, (c1 - c0) / (n1 - n0)) * (wanted - n1)


@dataclass(frozen=True)
class Calibration:
    """One entry of the calibration file: what was measured, where and when."""

    hardware: str
    model_pair: str
    dtype: str
    device: str  # the device's name (GPU model or CPU model)
    date: str  # ISO date of the measurement
    random_weights: bool  # built from the configs (same shapes and cost, no download)
    target: ForwardCosts
    draft: ForwardCosts
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def note(self) -> str:
        weights = ", random weights" if self.random_weights else ""
        return f"calibrated on {self.device}, {self.date}{weights}"

    def costs(self, role: str) -> ForwardCosts:
        return self.target if role == "target" else self.draft

    def to_json(self) -> dict[str, Any]:
        return {"hardware": self.hardware, "model_pair": self.model_pair, "dtype": self.dtype,
                "device": self.device, "date": self.date, "random_weights": self.random_weights,
                "target": self.target.to_json(), "draft": self.draft.to_json(), **self.extra}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Calibration:
        known = {"hardware", "model_pair", "dtype", "device", "date", "random_weights", "target", "draft"}
        return cls(hardware=data["hardware"], model_pair=data["model_pair"], dtype=data["dtype"],
                   device=data["device"], date=data["date"], random_weights=bool(data.get("random_weights")),
                   target=ForwardCosts.from_json(data["target"]), draft=ForwardCosts.from_json(data["draft"]),
                   extra={k: v for k, v in data.items() if k not in known})


def read_calibrations(path: Path | None = None) -> dict[str, Calibration]:
    """Every entry of the calibration file ({} when there is none, or it cannot be read: the plan then says
    it uses the assumed cost model)."""
    path = path or calibration_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return {key: Calibration.from_json(value) for key, value in data.get("entries", {}).items()}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def find_calibration(hardware: str, model_pair: str, dtype: str, path: Path | None = None) -> Calibration | None:
    return read_calibrations(path).get(entry_key(hardware, model_pair, dtype))


def write_calibration(calibration: Calibration, path: Path | None = None) -> Path:
    """Add or replace ``calibration``'s entry in the file (atomically, with the user's umask)."""
    from spectr_repro.runner.store import atomic_write_text

    path = path or calibration_path()
    entries = {key: value.to_json() for key, value in read_calibrations(path).items()}
    entries[entry_key(calibration.hardware, calibration.model_pair, calibration.dtype)] = calibration.to_json()
    text = json.dumps({"machine": platform.node(), "entries": entries}, indent=2) + "\n"
    atomic_write_text(path, text)
    return path


def today() -> str:
    return _dt.date.today().isoformat()


# --------------------------------------------------------------------------------------------------
# Measuring


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


__all__ = ["CALIBRATION_ENV_VAR", "Calibration", "ForwardCosts", "calibration_path", "entry_key",
           "find_calibration", "measure_forward_costs", "plan_shapes", "read_calibrations", "today",
           "write_calibration"]
