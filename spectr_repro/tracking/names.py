"""The names of what each command logs to W&B beyond its tables, and what the dashboard's panels plot.

One function per command turns its result tables into scalars (the run's summary: filter, compare, bar charts)
and curves (history rows, each carrying its own x: tokens per call against K, speed-up against L). The loggers
(``tracking.runs``) and the dashboard (``tracking.dashboard``) both call these functions on the same tables, so a
panel names exactly what a run holds; ``tests/tracking`` reads the offline runs back to check it.

Names are ``/``-separated (W&B groups a workspace's panels by their first part) and hold no ``.`` (W&B reads a
dot as nesting): a temperature 0.4 is ``T0_4``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

# The x of each family of curves (history rows carry it beside their y values).
REPLAY_K, REPLAY_L, SPEEDUP_L, BATCH_B = "replay/K", "replay/L", "speedup/L", "batch_speedup/B"
# The verdicts REPORT.md gives a claim (analysis.replay_report): each always has a count, 0 included.
VERDICTS = ("holds", "does not hold", "undecided")


@dataclass
class Derived:
    """What a command logs beside its tables: summary scalars, history rows, and the x of each curve family."""

    summary: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)
    x_axes: dict[str, str] = field(default_factory=dict)  # metric glob -> its x metric (W&B define_metric)


def slug(value: Any) -> str:
    """A name part: letters, digits, ``_``, ``+`` and ``-`` only (``P/1+0`` -> ``P_1+0``)."""
    return re.sub(r"[^A-Za-z0-9_+-]+", "_", str(value)).strip("_") or "none"


def temperature_part(temperature: Any) -> str:
    return "T" + slug(f"{float(temperature):g}")


def setting(dataset: Any, temperature: Any) -> str:
    return f"{slug(dataset)}/{temperature_part(temperature)}"


def verdict_part(verdict: Any) -> str:
    """``no bias detected (TV < 0.200 at 90 % power)`` -> ``no_bias_detected``: the verdict without its numbers."""
    return slug(str(verdict).split(" (")[0].strip().lower())


# --------------------------------------------------------------------------------------------------
# replay: tokens per call of every (method, K, L) at every (dataset, T)


def replay_tokens(dataset, temperature, method, K, L) -> str:
    return f"replay/tokens_per_call/{setting(dataset, temperature)}/{slug(method)}/K{int(K)}_L{int(L)}"


def replay_vs_K(dataset, temperature, L, method) -> str:
    return f"replay_vs_K/{setting(dataset, temperature)}/L{int(L)}/{slug(method)}"


def replay_vs_L(dataset, temperature, K, method) -> str:
    return f"replay_vs_L/{setting(dataset, temperature)}/K{int(K)}/{slug(method)}"


def _curves(table: pd.DataFrame, value: str, x: str, x_key: str, fixed: str,
            name: Callable[[Any, Any, Any, Any], str]) -> list[dict[str, float]]:
    """History rows of ``value`` against ``x`` (one row per x value of each (dataset, T, fixed)), x ascending, so
    that every curve's points come in order."""
    rows = []
    for (dataset, temperature, fixed_value), part in table.groupby(["dataset", "temperature", fixed], sort=True):
        for x_value, at_x in part.groupby(x, sort=True):
            row = {x_key: float(x_value)}
            row.update({name(dataset, temperature, fixed_value, r["method"]): float(r[value])
                        for _, r in at_x.iterrows() if finite(r[value])})
            if len(row) > 1:
                rows.append(row)
    return rows


def replay_metrics(tables: Mapping[str, pd.DataFrame], results: Mapping[str, Any]) -> Derived:
    table = tables.get("summary")
    if table is None or table.empty:
        return Derived()
    summary = {replay_tokens(r["dataset"], r["temperature"], r["method"], r["K"], r["L"]): float(r["tokens_per_call"])
               for _, r in table.iterrows() if finite(r["tokens_per_call"])}
    history = (_curves(table, "tokens_per_call", "K", REPLAY_K, "L", replay_vs_K)
               + _curves(table, "tokens_per_call", "L", REPLAY_L, "K", replay_vs_L))
    return Derived(summary, history, {"replay_vs_K/*": REPLAY_K, "replay_vs_L/*": REPLAY_L})


# --------------------------------------------------------------------------------------------------
# report: the verdicts, and the predicted speed-ups beside the timed cells' measured ones


def verdict_count(verdict: Any) -> str:
    return f"verdicts/{verdict_part(verdict)}"


def speedup_vs_L(dataset, temperature, K, method, which: str) -> str:
    """``which``: ``predicted`` (replay x measured costs) or ``measured`` (a timed cell)."""
    return f"speedup_vs_L/{setting(dataset, temperature)}/K{int(K)}/{slug(method)}/{which}"


def speedup_predicted(dataset, temperature, method, K, L) -> str:
    return f"speedup/predicted/{setting(dataset, temperature)}/{slug(method)}/K{int(K)}_L{int(L)}"


def speedup_points(predictions: pd.DataFrame | None, agreement: pd.DataFrame | None) -> pd.DataFrame:
    """(dataset, temperature, K, L, method, which, value): the predicted speed-ups of the replay's grid and the
    measured ones of the timed cells, one frame (either may be missing)."""
    parts = []
    for frame, column, which in ((predictions, "speedup", "predicted"), (agreement, "measured", "measured")):
        if frame is not None and not frame.empty and column in frame:
            part = frame[["dataset", "temperature", "K", "L", "method", column]].rename(columns={column: "value"})
            parts.append(part.assign(which=which))
    if not parts:
        return pd.DataFrame(columns=["dataset", "temperature", "K", "L", "method", "value", "which"])
    points = pd.concat(parts, ignore_index=True)
    return points[points["value"].map(finite)]


def report_metrics(tables: Mapping[str, pd.DataFrame], results: Mapping[str, Any]) -> Derived:
    derived = Derived(x_axes={"speedup_vs_L/*": SPEEDUP_L})
    verdicts = tables.get("verdicts")
    if verdicts is not None and "verdict" in verdicts:
        counts = verdicts["verdict"].map(verdict_part).value_counts()
        derived.summary.update({verdict_count(v): int(counts.get(verdict_part(v), 0)) for v in VERDICTS})
        derived.summary.update({verdict_count(v): int(n) for v, n in counts.items()})
    predictions = tables.get("speedup_predictions")
    if predictions is not None and not predictions.empty:
        derived.summary.update({speedup_predicted(r["dataset"], r["temperature"], r["method"], r["K"], r["L"]):
                                float(r["speedup"]) for _, r in predictions.iterrows() if finite(r["speedup"])})
    points = speedup_points(predictions, tables.get("speedup_agreement"))
    for (dataset, temperature, K), part in points.groupby(["dataset", "temperature", "K"], sort=True):
        for L, at_L in part.groupby("L", sort=True):
            row = {SPEEDUP_L: float(L)}
            row.update({speedup_vs_L(dataset, temperature, K, r["method"], r["which"]): float(r["value"])
                        for _, r in at_L.iterrows()})
            derived.history.append(row)
    return derived


# --------------------------------------------------------------------------------------------------
# bias: the TV estimate and p-value of each rule at each setting and context


def bias_setting(row: Mapping[str, Any]) -> str:
    return f"{setting(row['dataset'], row['temperature'])}/K{int(row['K'])}_L{int(row['L'])}/{slug(row['context'])}"


def bias_value(row: Mapping[str, Any], quantity: str) -> str:
    """``quantity``: tv_estimate, p_value or exact_tv."""
    return f"bias/{quantity}/{bias_setting(row)}/{slug(row['method'])}"


BIAS_QUANTITIES = ("tv_estimate", "p_value", "exact_tv")


def bias_metrics(tables: Mapping[str, pd.DataFrame], results: Mapping[str, Any]) -> Derived:
    rows = tables.get("rows")
    if rows is None or rows.empty:
        return Derived()
    summary = {bias_value(r, q): float(r[q]) for _, r in rows.iterrows() for q in BIAS_QUANTITIES
               if q in r and finite(r[q])}
    summary.update({f"bias/verdicts/{v}": int(n) for v, n in rows["verdict"].map(verdict_part).value_counts().items()})
    return Derived(summary)


# --------------------------------------------------------------------------------------------------
# excursions: the share of the release's test slots (and blocks) where h leaves [0, 1]


def excursion_share(temperature, K, L, unit: str) -> str:
    """``unit``: ``slots`` (of the K L test slots of every block) or ``blocks`` (with at least one such slot)."""
    return f"excursions/{unit}_outside/{temperature_part(temperature)}/K{int(K)}_L{int(L)}"


def excursions_metrics(tables: Mapping[str, pd.DataFrame], results: Mapping[str, Any]) -> Derived:
    counts = tables.get("counts")
    if counts is None or counts.empty:
        return Derived()
    summary = {}
    for _, row in counts.iterrows():
        for unit, total in (("slots", "slots"), ("blocks", "blocks")):
            if row[total] > 0:
                summary[excursion_share(row["T"], row["K"], row["L"], unit)] = float(row[f"{unit}_outside"] /
                                                                                   row[total])
    return Derived(summary)


# --------------------------------------------------------------------------------------------------
# audit and theory: exact TVs, verdicts, the paper's claimed properties


def audit_rule(row: Mapping[str, Any]) -> str:
    options = row.get("options") or {}
    if isinstance(options, str):
        options = {"options": options}
    extra = "".join(f"_{slug(k)}-{slug(v)}" for k, v in sorted(options.items()))
    return f"{slug(row['rule'])}_K{int(row['K'])}{extra}"


def audit_tv(row: Mapping[str, Any]) -> str:
    return f"audit/exact_tv/{audit_rule(row)}"


def audit_metrics(tables: Mapping[str, pd.DataFrame], results: Mapping[str, Any]) -> Derived:
    rows = list(results.get("rows") or [])
    summary: dict[str, Any] = {audit_tv(r): float(r["exact_tv"]) for r in rows if finite(r.get("exact_tv"))}
    summary.update({f"audit/p_value/{audit_rule(r)}": float(r["p_value"]) for r in rows if finite(r.get("p_value"))})
    verdicts = pd.Series([verdict_part(r.get("verdict")) for r in rows], dtype=object).value_counts()
    summary.update({f"audit/verdicts/{v}": int(n) for v, n in verdicts.items()})
    summary.update({f"audit/{key}": results[key] for key in ("exact_tv_threshold", "p_value_threshold")
                    if finite(results.get(key))})
    return Derived(summary)


def theory_metrics(tables: Mapping[str, pd.DataFrame], results: Mapping[str, Any]) -> Derived:
    claims = tables.get("claims")
    if claims is None or "verdict" not in claims:
        return Derived()
    counts = claims["verdict"].map(verdict_part).value_counts()
    return Derived({f"theory/claims/{v}": int(n) for v, n in counts.items()})


# --------------------------------------------------------------------------------------------------
# check and bench: the machine


def check_metrics(tables: Mapping[str, pd.DataFrame], results: Mapping[str, Any]) -> Derived:
    summary: dict[str, Any] = {"check/passed": int(bool(results.get("passed")))}
    items = tables.get("items")
    if items is not None and "status" in items:
        summary.update({f"check/items/{slug(s)}": int(n) for s, n in items["status"].value_counts().items()})
    calibration = results.get("calibration") or {}
    summary.update({f"check/calibration/{key}": value for key, value in _numbers(calibration).items()})
    if finite(results.get("wall_time_s")):
        summary["check/wall_time_s"] = float(results["wall_time_s"])
    return Derived(summary)


def batch_speedup(method, K, L, which: str) -> str:
    """``which``: ``measured`` (the batch bench's timed groups) or ``predicted`` (the cost model on the same groups)."""
    return f"batch_speedup/{slug(method)}/K{int(K)}_L{int(L)}/{which}"


def batch_curves(cells: list[Mapping[str, Any]]) -> list[dict[str, float]]:
    """History rows of the batch bench: one per B, each rule's measured and predicted speed-up over AR at that B."""
    rows: dict[int, dict[str, float]] = {}
    for cell in cells:
        row = rows.setdefault(int(cell["B"]), {BATCH_B: float(cell["B"])})
        for which, key in (("measured", "speedup"), ("predicted", "predicted")):
            if finite(cell.get(key)):
                row[batch_speedup(cell["method"], cell["K"], cell["L"], which)] = float(cell[key])
    return [rows[B] for B in sorted(rows)]


def bench_metrics(tables: Mapping[str, pd.DataFrame], results: Mapping[str, Any]) -> Derived:
    skip = {"settings", "environment", "date", "command"}
    cells = (results.get("batches") or {}).get("cells") or []
    return Derived({f"bench/{key}": value for key, value in
                    _numbers({k: v for k, v in results.items() if k not in skip}).items()},
                   batch_curves(cells), {"batch_speedup/*": BATCH_B} if cells else {})


def _numbers(data: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The finite numbers of a nested mapping, keys joined with ``/`` (lists and strings left to the tables)."""
    flat: dict[str, float] = {}
    for key, value in data.items():
        name = f"{prefix}{slug(key)}"
        if isinstance(value, Mapping):
            flat.update(_numbers(value, f"{name}/"))
        elif isinstance(value, int | float) and not isinstance(value, bool) and finite(value):
            flat[name] = value
    return flat


def finite(value: Any) -> bool:
    try:
        return value is not None and not isinstance(value, bool) and math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


# command -> what it logs beside its tables (a command without an entry logs its tables, config and summary)
DERIVATIONS: dict[str, Callable[[Mapping[str, pd.DataFrame], Mapping[str, Any]], Derived]] = {
    "replay": replay_metrics, "report": report_metrics, "bias": bias_metrics, "excursions": excursions_metrics,
    "audit": audit_metrics,
    "theory": theory_metrics, "check": check_metrics, "bench": bench_metrics,
}


def derive(command: str, tables: Mapping[str, pd.DataFrame], results: Mapping[str, Any] | None = None) -> Derived:
    function = DERIVATIONS.get(command)
    return function(tables, results or {}) if function is not None else Derived()


__all__ = ["BATCH_B", "BIAS_QUANTITIES", "DERIVATIONS", "Derived", "REPLAY_K", "REPLAY_L", "SPEEDUP_L", "VERDICTS",
           "audit_rule", "audit_tv", "batch_curves", "batch_speedup", "bias_setting", "bias_value", "derive",
           "excursion_share", "excursions_metrics", "finite", "replay_tokens", "replay_vs_K", "replay_vs_L",
           "setting", "slug", "speedup_points", "speedup_predicted", "speedup_vs_L", "temperature_part",
           "verdict_count", "verdict_part"]
