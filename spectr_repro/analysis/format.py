"""Text shared by every table of the analysis: an interval as text, the methods-by-datasets pivot, and the
names every table agrees on (the average column, the comparators)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from spectr_repro.analysis.load import DATASET_ORDER, method_label, order_methods, ordered
from spectr_repro.verify import VERIFIERS, method_labels

AVERAGE = "average"  # the column (or dataset) that averages over a table's datasets
COMPARATORS = ("spectr_gbv", "sd")  # the methods every other method is compared with, prompt by prompt


def missing(value) -> bool:
    """None, NaN or an infinite bound: nothing to show."""
    return value is None or not math.isfinite(float(value))


def bounds_text(low, high, digits: int = 2, signed: bool = False) -> str:
    """"[low, high]", or "" when either bound is missing."""
    if missing(low) or missing(high):
        return ""
    spec = f"{'+' if signed else ''}.{digits}f"
    return f"[{low:{spec}}, {high:{spec}}]"


def interval_text(estimate, low, high, digits: int = 2, signed: bool = False, unit: str = "") -> str:
    """"estimate[unit] [low, high]": the bounds only where both exist, nothing for a missing estimate."""
    spec = f"{'+' if signed else ''}.{digits}f"
    value = "" if missing(estimate) else f"{estimate:{spec}}{unit}"
    bounds = bounds_text(low, high, digits, signed)
    return f"{value} {bounds}" if bounds else value


def methods_by_datasets(long: pd.DataFrame, values: str, aggfunc="first", labels: bool = True,
                        index_name: str | None = "method", columns_name: str | None = None) -> pd.DataFrame:
    """Rows methods (canonical order, display labels unless ``labels=False``), columns datasets (registry order,
    ``AVERAGE`` last) from a long frame with columns method, dataset and ``values``; entries no row gives are
    NaN."""
    wide = long.pivot_table(index="method", columns="dataset", values=values, aggfunc=aggfunc, dropna=False)
    wide = wide.reindex(index=order_methods(wide.index), columns=ordered(wide.columns, DATASET_ORDER + [AVERAGE]))
    if labels:
        wide.index = [method_label(m) for m in wide.index]
    wide.index.name, wide.columns.name = index_name, columns_name
    return wide


def main_cell(method: str, K: int, L: int) -> tuple[str, int, int]:
    """A method's (method, K, L) at the main setting (K, L): a single-draft rule's K is 1."""
    return (method, 1 if VERIFIERS[method].single_draft else K, L)


def main_setting_rows(table: pd.DataFrame, K: int, L: int, text: Callable[[Any], str],
                      extra: Callable[[str], dict[str, Any]] = lambda method: {}) -> pd.DataFrame:
    """Table 1's shape: one row per method of the registry that ``table`` (columns method, K, L, dataset...) holds at
    its main-setting cell (:func:`main_cell`): its label (a rule that carries state across iterations marked
    "(1st iter.)"), K, the columns of ``extra(method)``, then one column per dataset holding ``text`` of the table's
    row (a named tuple), the average last, "-" where a dataset lacks the cell. Empty when no method has its cell."""
    labels = method_labels()
    rows, leading = [], {"method": None, "K": None}
    for method in [m for m in VERIFIERS if m in set(table["method"])]:
        name, cell_K, cell_L = main_cell(method, K, L)
        part = table[(table["method"] == name) & (table["K"] == cell_K) & (table["L"] == cell_L)]
        if part.empty:
            continue
        row = {"method": labels[method] + (" (1st iter.)" if VERIFIERS[method].carries_state else ""), "K": cell_K,
               **extra(method)}
        leading.update(dict.fromkeys(row))
        row.update({r.dataset: text(r) for r in part.itertuples()})
        rows.append(row)
    frame = pd.DataFrame(rows)
    datasets = [c for c in frame.columns if c not in leading and c != AVERAGE]
    return frame[[*leading, *datasets, *([AVERAGE] if AVERAGE in frame else [])]].fillna("-") if rows else frame


def markdown(frame: pd.DataFrame, index: bool = False) -> str:
    """A table as Markdown, its text as given (no number parsing: "1.50" stays "1.50")."""
    return frame.to_markdown(index=index, disable_numparse=True)


def unique_text(values) -> str:
    """The distinct values, sorted and comma-separated ("—" when there are none)."""
    unique = sorted({str(v) for v in values if v is not None and not (isinstance(v, float) and pd.isna(v))})
    return ", ".join(unique) if unique else "—"


def relative(path: Path, start: Path) -> str:
    """``path`` relative to ``start`` (a link in a document written in ``start``), with forward slashes."""
    return Path(os.path.relpath(path, start)).as_posix()
