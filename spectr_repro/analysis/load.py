"""Read a results folder into pandas DataFrames.

A results folder is anything holding ``cells/<cell_id>/summary.json`` (one per cell) and, next to
it, ``records.jsonl`` (one JSON line per prompt), as written by the runner. The folder may be one
experiment (``results/cpu_quick``) or a parent of several (``results/``): every ``cells/*/summary.json``
below it is read. Analysis never imports the engine or models, so a report can be rebuilt anywhere
from the files alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from spectr_repro.records import CellSummary, PromptRecord, field_names, iter_records, summary_from_json
from spectr_repro.verify import method_labels, method_names, single_draft_methods

# Canonical orders (rows and columns of every table and legend); methods come from the one registry.
METHOD_ORDER = list(method_names())
DATASET_ORDER = ["humaneval", "gsm8k", "mgsm", "lm1b", "alpaca"]
METHOD_LABELS = method_labels()
# Methods that draft a single sequence (K = 1 always); their values do not depend on K.
SINGLE_DRAFT_METHODS = single_draft_methods()

# The columns come from the one schema (spectr_repro.records).
SUMMARY_KEYS = field_names(CellSummary)
RECORD_KEYS = field_names(PromptRecord)
# Summary columns copied onto each record row so records can be grouped like cells.
_CELL_COLUMNS_FOR_RECORDS = ["experiment", "cell_id", "dataset", "model_pair", "max_new_tokens"]


def base_method(name: str) -> str:
    """The rule behind a method name: "gbv[carry_over=False]" -> "gbv"."""
    return str(name).split("[", 1)[0]


def method_label(name: str) -> str:
    """Display name: the paper's spelling, options kept ("GBV[carry_over=False]")."""
    base = base_method(name)
    return METHOD_LABELS.get(base, base) + str(name)[len(base) :]


def order_methods(names) -> list[str]:
    """Method names in the canonical order of their rules, variants of one rule side by side."""
    names = list(dict.fromkeys(names))
    rank = {m: i for i, m in enumerate(METHOD_ORDER)}
    return sorted(names, key=lambda n: (rank.get(base_method(n), len(rank)), base_method(n), str(n)))


def _options_text(options) -> str:
    if not isinstance(options, dict) or not options:
        return ""
    return ",".join(f"{key}={options[key]}" for key in sorted(options))


def _name_variants(cells: pd.DataFrame) -> pd.Series:
    """A rule run with several option sets (e.g. gbv with and without carry-over) would otherwise be
    averaged into one row: each option set becomes its own method, "gbv[carry_over=False]"."""
    options = cells["method_options"].map(_options_text)
    several = options.groupby(cells["method"]).transform("nunique") > 1
    return cells["method"].where(~several | (options == ""), cells["method"] + "[" + options + "]")


def ordered(values, order: list[str]) -> list[str]:
    """``values`` sorted by ``order``; unknown names keep their sorted order after the known ones."""
    values = list(dict.fromkeys(values))
    known = [v for v in order if v in values]
    return known + sorted(v for v in values if v not in order)


@dataclass
class Results:
    """Everything in one results folder.

    ``cells``: one row per cell (summary keys as columns; ``time_split`` also flattened into
    ``time_<part>_s`` columns; ``rule`` is the verification rule and ``method`` the rule plus its
    options when one rule was run with several option sets). ``records``: one row per prompt per
    cell, with the cell's experiment, cell_id, dataset, model_pair and max_new_tokens attached.
    """

    root: Path
    cells: pd.DataFrame
    records: pd.DataFrame


def _read_summary(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from err
    return summary_from_json(data, str(path))


def _read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return list(iter_records(handle, str(path)))


def summary_paths(results_dir: str | Path) -> list[Path]:
    """Every ``cells/<cell_id>/summary.json`` below ``results_dir``, sorted."""
    root = Path(results_dir)
    return sorted(p for p in root.rglob("summary.json") if p.parent.parent.name == "cells")


def load_cells(results_dir: str | Path) -> pd.DataFrame:
    """One row per cell. Raises ValueError when the folder is missing or holds no cells."""
    root = Path(results_dir)
    if not root.is_dir():
        raise ValueError(f"results folder {str(root)!r} does not exist")
    paths = summary_paths(root)
    if not paths:
        raise ValueError(
            f"no cells found under {str(root)!r} (expected cells/<cell_id>/summary.json); "
            "run an experiment first, e.g. `make reproduce`"
        )
    rows = []
    for path in paths:
        summary = _read_summary(path)
        summary["cell_id"] = summary.get("cell_id") or path.parent.name
        summary["experiment"] = summary.get("experiment") or path.parent.parent.parent.name
        summary["cell_dir"] = str(path.parent)
        rows.append(summary)
    cells = pd.DataFrame(rows)
    for key in SUMMARY_KEYS:
        if key not in cells:
            cells[key] = None
    cells["rule"] = cells["method"]
    cells["method"] = _name_variants(cells)
    for part in _time_parts(cells["time_split"]):
        cells[f"time_{part}_s"] = [
            (split or {}).get(part, np.nan) if isinstance(split, dict) else np.nan
            for split in cells["time_split"]
        ]
    cells["K"] = cells["K"].astype(int)
    cells["L"] = cells["L"].astype(int)
    cells["temperature"] = cells["temperature"].astype(float)
    return cells.reset_index(drop=True)


def _time_parts(splits: pd.Series) -> list[str]:
    parts: dict[str, None] = {}
    for split in splits:
        if isinstance(split, dict):
            parts.update(dict.fromkeys(split))
    return list(parts)


def load_records(cells: pd.DataFrame) -> pd.DataFrame:
    """One row per prompt of every cell that has a ``records.jsonl`` (cells without one are skipped)."""
    frames = []
    for cell in cells.itertuples(index=False):
        path = Path(cell.cell_dir) / "records.jsonl"
        if not path.is_file():
            continue
        rows = _read_jsonl(path)
        if not rows:
            continue
        frame = pd.DataFrame(rows)
        for column in _CELL_COLUMNS_FOR_RECORDS:
            frame[column] = getattr(cell, column)
        frame["method"] = cell.method  # the cell's name, option variants included
        for column in ("K", "L", "temperature", "seed"):
            if column not in frame:
                frame[column] = getattr(cell, column)
        frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=RECORD_KEYS + _CELL_COLUMNS_FOR_RECORDS)
    records = pd.concat(frames, ignore_index=True)
    for key in RECORD_KEYS:
        if key not in records:
            records[key] = None
    return records


def load_results(results_dir: str | Path) -> Results:
    """Cells and records of ``results_dir`` (see module docstring)."""
    cells = load_cells(results_dir)
    return Results(root=Path(results_dir), cells=cells, records=load_records(cells))
