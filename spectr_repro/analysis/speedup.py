"""Speed-up predicted from shared blocks and measured costs: every (rule, K, L, T, dataset) of a replay.

    speed-up = tokens per call (replayed) x AR seconds per token / seconds per call (``cost.model.CallCosts``)

Block efficiency does not depend on the machine; a call's cost does, and it is measured in minutes (``check``).
The speed-up here is the decoding loop's, in steady state (no prefill; it is what K and L change); a timed
cell's, prefill included, is predicted by :func:`cell_agreement` for the cell's own prompts.

Intervals (95 %) carry both sources of error, by one bootstrap: prompts are resampled within each dataset (the
same resample for every cell, so differences are paired on the same blocks), and each (rule, K, L)'s cost is
multiplied by a log-normal draw whose spread is the calibration's (``CallCosts.relative_spread``, the relative
half-range of the repeated forwards). Rules that carry state across calls (gbv) are replayed on their first
iteration, which overstates them (their carry-over target only gets narrower after a rejection): their speed-up
is an upper bound, flagged ``first_iteration``, and never picked as the fastest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from spectr_repro.analysis.format import AVERAGE
from spectr_repro.cost.model import CallCosts
from spectr_repro.verify import VERIFIERS

RESAMPLES = 2000  # bootstrap replicates: the 2.5 and 97.5 % quantiles move by < 1 % of the interval beyond this
LEVEL = 0.95
SEED = 0
CELL = tuple[str, int, int]  # (method, K, L)
COLUMNS = ["model_pair", "temperature", "dataset", "method", "K", "L", "tokens_per_call", "seconds_per_call",
           "ar_seconds_per_token", "speedup", "ci_low", "ci_high", "prompts", "lossless", "first_iteration",
           "context_tokens", "cost_source"]


def _quantiles(values: np.ndarray) -> tuple[float, float]:
    low, high = np.quantile(values, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return float(low), float(high)


@dataclass
class SpeedupPrediction:
    """The predictions of a replay (``table``, one row per group, dataset and cell, the average over datasets
    included) and their bootstrap replicates, aligned across cells, for paired questions (:meth:`difference`,
    :meth:`curve`)."""

    table: pd.DataFrame
    replicates: dict[tuple, np.ndarray] = field(default_factory=dict)  # (model_pair, T, dataset, cell) -> [R]

    def default_dataset(self) -> str:
        """The average over datasets where the replay had several, else its one dataset."""
        datasets = set(self.table["dataset"])
        return AVERAGE if AVERAGE in datasets or not datasets else sorted(datasets)[0]

    def group(self) -> tuple[str, float]:
        """The (model_pair, temperature) the verdicts read: the only one, else the first in the table."""
        row = self.table.iloc[0]
        return str(row["model_pair"]), float(row["temperature"])

    def estimate(self, cell: CELL, dataset: str | None = None, group: tuple | None = None) -> float | None:
        pair, T = group or self.group()
        dataset = dataset or self.default_dataset()
        rows = self.table[(self.table["model_pair"] == pair) & (self.table["temperature"] == T)
                          & (self.table["dataset"] == dataset) & (self.table["method"] == cell[0])
                          & (self.table["K"] == cell[1]) & (self.table["L"] == cell[2])]
        return None if rows.empty else float(rows.iloc[0]["speedup"])

    def samples(self, cell: CELL, dataset: str | None = None, group: tuple | None = None) -> np.ndarray | None:
        pair, T = group or self.group()
        dataset = dataset or self.default_dataset()
        return self.replicates.get((pair, T, dataset, cell))

    def difference(self, a: CELL, b: CELL, dataset: str | None = None, group: tuple | None = None
                   ) -> tuple[float, float, float] | None:
        """(estimate, low, high) of speed-up(a) - speed-up(b), paired on the same prompts; None if either is
        missing."""
        ea, eb = self.estimate(a, dataset, group), self.estimate(b, dataset, group)
        ra, rb = self.samples(a, dataset, group), self.samples(b, dataset, group)
        if ea is None or eb is None or ra is None or rb is None:
            return None
        return (ea - eb, *_quantiles(ra - rb))

    def curve(self, cells: Sequence[CELL], dataset: str | None = None, group: tuple | None = None
              ) -> tuple[np.ndarray, np.ndarray] | None:
        """(estimates [n], replicates [R, n]) of ``cells`` in order (None if one is missing)."""
        estimates = [self.estimate(cell, dataset, group) for cell in cells]
        samples = [self.samples(cell, dataset, group) for cell in cells]
        if any(e is None for e in estimates) or any(s is None for s in samples):
            return None
        return np.array(estimates, dtype=float), np.stack(samples, axis=1)


def _per_prompt(blocks: pd.DataFrame) -> pd.DataFrame:
    keys = ["model_pair", "temperature", "dataset", "method", "K", "L", "prompt_id"]
    return blocks.groupby(keys, sort=False).agg(tokens=("tokens", "sum"), blocks=("tokens", "size")).reset_index()


def predict_speedups(blocks: pd.DataFrame, costs: CallCosts, contexts: Mapping[str, int] | None = None,
                     resamples: int = RESAMPLES, seed: int = SEED) -> SpeedupPrediction:
    """Predicted speed-up of every (method, K, L) of a replay's ``blocks`` (``analysis.replay.load_blocks``), per
    model pair, temperature and dataset and on the average over datasets (each dataset alike), with ``costs``
    taken at each dataset's mean context of a call (``contexts``; None: the costs' measured context)."""
    rng = np.random.default_rng(seed)
    per_prompt = _per_prompt(blocks)
    rows, replicates = [], {}
    for (pair, T), group in per_prompt.groupby(["model_pair", "temperature"], sort=False):
        cells = list(dict.fromkeys(zip(group["method"], group["K"].astype(int), group["L"].astype(int))))
        noise = {cell: np.exp(costs.relative_spread * rng.standard_normal(resamples)) for cell in cells}
        by_dataset: dict[CELL, list[tuple[float, np.ndarray]]] = {cell: [] for cell in cells}
        for dataset, part in group.groupby("dataset", sort=False):
            tokens = part.pivot_table(index="prompt_id", columns=["method", "K", "L"], values="tokens", aggfunc="sum")
            counts = part.pivot_table(index="prompt_id", columns=["method", "K", "L"], values="blocks", aggfunc="sum")
            prompts = len(tokens)
            index = rng.integers(0, prompts, size=(resamples, prompts))  # one resample of prompts for every cell
            context = None if contexts is None else contexts.get(dataset)
            ar_seconds = costs.ar_token_seconds(context)
            for cell in cells:
                if cell not in tokens.columns:
                    continue
                t, n = tokens[cell].to_numpy(float), counts[cell].to_numpy(float)
                keep = ~np.isnan(t)
                t, n = np.where(keep, t, 0.0), np.where(keep, n, 0.0)
                tokens_per_call = t.sum() / n.sum()
                sampled = t[index].sum(axis=1) / np.maximum(n[index].sum(axis=1), 1e-12)
                call = costs.call_seconds(cell[0], cell[1], cell[2], context)
                estimate = tokens_per_call * ar_seconds / call
                samples = sampled * ar_seconds / call / noise[cell]
                by_dataset[cell].append((estimate, samples))
                replicates[(pair, float(T), dataset, cell)] = samples
                rows.append(_row(pair, T, dataset, cell, tokens_per_call, call, ar_seconds, estimate, samples,
                                 int(keep.sum()), context, costs.source))
        if len(set(group["dataset"])) > 1:
            for cell, values in by_dataset.items():
                if not values:
                    continue
                estimate = float(np.mean([v for v, _ in values]))
                samples = np.mean(np.stack([s for _, s in values]), axis=0)
                replicates[(pair, float(T), AVERAGE, cell)] = samples
                row = _row(pair, T, AVERAGE, cell, float("nan"), float("nan"), float("nan"), estimate, samples,
                           0, None, costs.source)
                average = [r for r in rows if (r["model_pair"], r["temperature"], r["method"], r["K"], r["L"])
                           == (pair, float(T), *cell) and r["dataset"] != AVERAGE]
                row["tokens_per_call"] = float(np.mean([r["tokens_per_call"] for r in average]))
                row["seconds_per_call"] = float(np.mean([r["seconds_per_call"] for r in average]))
                row["ar_seconds_per_token"] = float(np.mean([r["ar_seconds_per_token"] for r in average]))
                row["prompts"] = int(sum(r["prompts"] for r in average))
                rows.append(row)
    return SpeedupPrediction(pd.DataFrame(rows, columns=COLUMNS), replicates)


def _row(pair, T, dataset, cell, tokens_per_call, call, ar_seconds, estimate, samples, prompts, context, source):
    method, K, L = cell
    spec = VERIFIERS.get(method)
    low, high = _quantiles(samples)
    return {"model_pair": pair, "temperature": float(T), "dataset": dataset, "method": method, "K": int(K),
            "L": int(L), "tokens_per_call": float(tokens_per_call), "seconds_per_call": float(call),
            "ar_seconds_per_token": float(ar_seconds), "speedup": float(estimate), "ci_low": low, "ci_high": high,
            "prompts": prompts, "lossless": bool(spec and spec.lossless),
            "first_iteration": bool(spec and spec.carries_state), "context_tokens": context, "cost_source": source}


def fastest_lossless(prediction: SpeedupPrediction, dataset: str | None = None) -> dict | None:
    """The lossless (method, K, L) with the highest predicted speed-up on ``dataset`` (rules replayed on their
    first iteration excluded: an upper bound is not a pick), with the share of bootstrap replicates in which it
    is the fastest (how sure the pick is)."""
    pair, T = prediction.group()
    dataset = dataset or prediction.default_dataset()
    table = prediction.table
    rows = table[(table["model_pair"] == pair) & (table["temperature"] == T) & (table["dataset"] == dataset)
                 & table["lossless"] & ~table["first_iteration"]]
    if rows.empty:
        return None
    cells = [(r.method, int(r.K), int(r.L)) for r in rows.itertuples()]
    curve = prediction.curve(cells, dataset)
    best = rows.loc[rows["speedup"].idxmax()]
    result = {key: (value.item() if hasattr(value, "item") else value) for key, value in best.items()}
    if curve is not None:
        winners = np.argmax(curve[1], axis=1)
        result["share_fastest"] = float(np.mean(winners == cells.index((best.method, int(best.K), int(best.L)))))
    return result


# --------------------------------------------------------------------------------------------------
# Verdicts on curves (pure: estimates and aligned replicates in, verdict out)


@dataclass(frozen=True)
class CurveVerdict:
    verdict: str  # "holds", "does not hold", "undecided"
    note: str
    peak: int | None = None  # the x of the estimated peak
    peak_low: int | None = None  # 95 % interval of the peak's position over the replicates
    peak_high: int | None = None


def rise_then_fall(xs: Sequence[int], estimates: np.ndarray, replicates: np.ndarray) -> CurveVerdict:
    """Does the curve rise, peak and fall? Holds when the estimated peak is inside the range and it is above
    both ends with paired 95 % intervals that exclude 0; does not hold when the curve is monotone, i.e. the
    peak sits at an end and that end is above the other one significantly; else undecided (within noise).
    The peak's interval: the 2.5 and 97.5 % quantiles of the peak's position over the replicates."""
    xs = list(xs)
    if len(xs) < 3:
        return CurveVerdict("undecided", f"{len(xs)} values of the axis: a peak needs at least 3")
    peak = int(np.argmax(estimates))
    positions = np.argmax(replicates, axis=1)
    low, high = np.quantile(positions, [(1 - LEVEL) / 2, (1 + LEVEL) / 2], method="nearest")
    found = CurveVerdict("", "", xs[peak], xs[int(low)], xs[int(high)])

    def above(i: int, j: int) -> bool:
        return _quantiles(replicates[:, i] - replicates[:, j])[0] > 0

    first, last = 0, len(xs) - 1
    if first < peak < last:
        if above(peak, first) and above(peak, last):
            return CurveVerdict("holds", f"peak at {xs[peak]} (95 % {xs[int(low)]}–{xs[int(high)]}), above both "
                                f"ends", *_peak(found))
        side = "the rise" if not above(peak, first) else "the fall"
        return CurveVerdict("undecided", f"peak at {xs[peak]}, but {side} is within noise", *_peak(found))
    end, other = (first, last) if peak == first else (last, first)
    if above(end, other):
        shape = "falls" if peak == first else "rises"
        return CurveVerdict("does not hold", f"{shape} throughout {xs[0]}–{xs[-1]} (peak at the end, {xs[peak]})",
                            *_peak(found))
    return CurveVerdict("undecided", f"flat within noise over {xs[0]}–{xs[-1]}", *_peak(found))


def _peak(found: CurveVerdict) -> tuple[int | None, int | None, int | None]:
    return found.peak, found.peak_low, found.peak_high


def greater_verdict(difference: tuple[float, float, float] | None, upper_bound: bool = False) -> tuple[str, str]:
    """a > b from the paired interval of a - b. ``upper_bound``: b is an upper bound of the rule it stands for
    (first-iteration replay of a rule that carries state), so a significant a > b holds for the rule, and a < b
    decides nothing."""
    if difference is None:
        return "undecided", "not both replayed"
    estimate, low, high = difference
    if low > 0:
        return "holds", ""
    if high < 0:
        if upper_bound:
            return "undecided", "below the first-iteration upper bound, which says nothing of the rule itself"
        return "does not hold", "significantly slower"
    return "undecided", "within noise"


__all__ = ["COLUMNS", "CurveVerdict", "RESAMPLES", "SpeedupPrediction", "fastest_lossless", "greater_verdict",
           "predict_speedups", "rise_then_fall"]
