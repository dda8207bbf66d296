"""Measured per-forward costs of a pair's target and draft on this machine, and the file that keeps them.

``python -m spectr_repro check`` times one forward of each model at the shapes a run uses (K rows x
(L+1) tokens for a target call, K rows x 1 token for a draft step, one row of a prompt chunk for a
prefill, and the same at B x K rows for batches of prompts), each on top of a cached context as in
decoding (``spectr_repro.cost.measure``). ``plan`` (and the best-configuration prediction) then take these
seconds in place of the assumed cost model of ``hardware.estimate`` (``spectr_repro.cost.model``).

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

from spectr_repro.files import atomic_write_text
from spectr_repro.settings import RunConfig

CALIBRATION_ENV_VAR = "SPECTR_REPRO_CALIBRATION"


def calibration_path() -> Path:
    """This machine's calibration file (``$SPECTR_REPRO_CALIBRATION`` overrides)."""
    configured = os.environ.get(CALIBRATION_ENV_VAR)
    if configured:
        return Path(configured).expanduser()
    from spectr_repro.models.offline import cache_root  # models: report imports cost without them

    return cache_root() / "calibration" / f"{platform.node() or 'this-machine'}.json"


def entry_key(hardware: str, model_pair: str, dtype: str) -> str:
    return f"{hardware}/{model_pair}/{dtype}"


DEFAULT_CONTEXT = 64  # cached tokens below a forward measured before calibrations recorded their context


@dataclass(frozen=True)
class ForwardCosts:
    """Seconds of one forward of one model, measured at (rows, tokens per row, logits) shapes on a cached context.

    ``logits``: "last" when the head runs on each row's last position only (prefill chunks, draft steps:
    ``engine.forward``'s keep_last), "all" when every position is scored (the target call over K drafts);
    at a 152k vocabulary the head is a large share of a small model's forward, so the two are kept apart.
    ``contexts``: the cached tokens below each point (empty: all ``DEFAULT_CONTEXT``); a calibration at several
    context lengths is interpolated linearly in the context (attention reads the whole KV cache). ``spreads``:
    each point's relative spread over its repeats (half the range over the median), what a prediction's interval
    carries for the cost side (empty: none measured).
    """

    points: tuple[tuple[int, int, str, float], ...]  # (rows, tokens per row, logits, median seconds)
    contexts: tuple[int, ...] = ()
    spreads: tuple[float, ...] = ()

    def _context_of(self, index: int) -> int:
        return self.contexts[index] if self.contexts else DEFAULT_CONTEXT

    @property
    def measured_contexts(self) -> list[int]:
        return sorted({self._context_of(i) for i in range(len(self.points))})

    @property
    def spread(self) -> float:
        """The typical relative spread of a measured forward (median over the points; 0 when none recorded)."""
        return float(statistics.median(self.spreads)) if self.spreads else 0.0

    def seconds(self, rows: int, tokens: int, logits: str = "last", context: int | None = None) -> float:
        """Seconds of a forward over ``rows`` x ``tokens`` on ``context`` cached tokens (None: the measured one,
        the smallest when several): the measured shape, else interpolated in rows x tokens among the shapes of
        the same ``logits`` (one token per row: "last" and "all" are the same call); between measured contexts
        linear in the context, beyond the largest the slope of the last two, below the smallest its cost."""
        measured = self.measured_contexts
        if context is None or len(measured) == 1:
            return self._seconds_at(measured[0], rows, tokens, logits)
        costs = [(c, self._seconds_at(c, rows, tokens, logits)) for c in measured]
        return _interpolate(costs, int(context))

    def _seconds_at(self, context: int, rows: int, tokens: int, logits: str) -> float:
        kind = "last" if tokens == 1 else logits
        points = [p for i, p in enumerate(self.points) if self._context_of(i) == context]
        for r, t, k, s in points:
            if (r, t) == (rows, tokens) and (k == kind or t == 1):
                return s
        same = [(r * t, s) for r, t, k, s in points if k == kind or t == 1]
        return _interpolate(same or [(r * t, s) for r, t, _, s in points], rows * tokens)

    def by_shape(self) -> dict[tuple[int, int, str, int], float]:
        """{(rows, tokens per row, logits, context): median seconds} of every measured point (two runs' forwards
        compared shape by shape)."""
        return {(r, t, k, self._context_of(i)): s for i, (r, t, k, s) in enumerate(self.points)}

    def to_json(self) -> list[dict[str, Any]]:
        rows = [{"rows": r, "tokens": t, "logits": k, "seconds": s} for r, t, k, s in self.points]
        for i, row in enumerate(rows):
            if self.contexts:
                row["context"] = self.contexts[i]
            if self.spreads:
                row["spread"] = self.spreads[i]
        return rows

    @classmethod
    def from_json(cls, rows: Iterable[dict[str, Any]]) -> ForwardCosts:
        rows = list(rows)
        points = tuple((int(p["rows"]), int(p["tokens"]), str(p.get("logits", "last")), float(p["seconds"]))
                       for p in rows)
        contexts = tuple(int(p["context"]) for p in rows) if rows and all("context" in p for p in rows) else ()
        spreads = tuple(float(p["spread"]) for p in rows) if rows and all("spread" in p for p in rows) else ()
        return cls(points, contexts, spreads)


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
    path = path or calibration_path()
    entries = {key: value.to_json() for key, value in read_calibrations(path).items()}
    entries[entry_key(calibration.hardware, calibration.model_pair, calibration.dtype)] = calibration.to_json()
    text = json.dumps({"machine": platform.node(), "entries": entries}, indent=2) + "\n"
    atomic_write_text(path, text)
    return path


def today() -> str:
    return _dt.date.today().isoformat()


def calibration_for(run: RunConfig) -> Calibration | None:
    """This machine's calibration of the cell's hardware, pair and dtype (``check`` writes it), or None."""
    return find_calibration(run.hardware_name, run.model_pair, run.dtype)


__all__ = ["CALIBRATION_ENV_VAR", "DEFAULT_CONTEXT", "Calibration", "ForwardCosts",
           "calibration_for", "calibration_path", "entry_key", "find_calibration", "read_calibrations", "today",
           "write_calibration"]
