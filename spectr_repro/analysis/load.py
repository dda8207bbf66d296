"""Read a results folder into pandas DataFrames.

A results folder is anything holding ``cells/<cell_id>/summary.json`` (one per cell) and, next to
it, ``records.jsonl`` (one JSON line per prompt), as written by the runner. The folder may be one
experiment (``results/cpu_quick``) or a parent of several (``results/``): every ``cells/*/`` folder
below it is read. Analysis never imports the engine or models, so a report can be rebuilt anywhere
from the files alone.

Every cell folder is checked as it is read (the same check the runner uses to decide a cell is
finished, ``records.summary_disagreements``): a summary that does not parse, records cut or missing,
counts, prompt ids or totals that disagree, a folder with records but no summary. By default such
problems refuse the load, listing each file and what is wrong (never a silently different count);
``strict=False`` leaves those cells out with a warning each (the report then lists them).
"""

from __future__ import annotations

import json
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from spectr_repro.data import DATASETS
from spectr_repro.records import (
    CellSummary,
    PromptRecord,
    SchemaError,
    field_names,
    read_records,
    read_summary,
    summary_disagreements,
)
from spectr_repro.records import cell_folders as schema_cell_folders
from spectr_repro.verify import method_labels, method_names, single_draft_methods

# Canonical orders (rows and columns of every table and legend); methods come from the one registry.
METHOD_ORDER = list(method_names())
DATASET_ORDER = list(DATASETS)  # the data registry's order
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
    return read_summary(path)


def _read_jsonl(path: Path) -> list[dict]:
    return read_records(path)[0]


def cell_folders(results_dir: str | Path) -> list[Path]:
    """Every ``cells/<cell_id>/`` folder below ``results_dir`` (with or without a summary), sorted."""
    return schema_cell_folders(results_dir)


@dataclass(frozen=True)
class CellProblem:
    """A cell folder that cannot be counted as it stands: ``path`` names the file, ``problem`` says why."""

    path: Path
    problem: str

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}"


def check_cell(folder: Path) -> tuple[dict | None, CellProblem | None]:
    """The cell's checked summary, or the problem that keeps it out (None, None: an empty folder)."""
    summary_path, records_path = folder / "summary.json", folder / "records.jsonl"
    if not summary_path.is_file():
        claim = _claim_text(folder)
        if records_path.is_file():
            return None, CellProblem(records_path, "records but no summary.json: the cell was interrupted"
                                     + (f" or is being computed ({claim})" if claim else "")
                                     + "; rerun the sweep to compute it")
        if claim:
            return None, CellProblem(folder / "claim.json", f"being computed ({claim}), no results yet")
        return None, None
    try:
        summary = _read_summary(summary_path)
    except (ValueError, OSError) as error:
        return None, CellProblem(summary_path, str(error).replace(f"{summary_path}: ", "", 1))
    if not records_path.is_file():
        return None, CellProblem(records_path, f"missing (the summary counts {summary.get('num_prompts')} prompts)")
    try:
        records, text = read_records(records_path)
    except (SchemaError, OSError, UnicodeDecodeError) as error:
        return None, CellProblem(records_path, str(error).replace(f"{records_path}:", "line ", 1))
    problems = summary_disagreements(summary, records, text)
    if problems:
        return None, CellProblem(records_path, "disagrees with summary.json: " + "; ".join(problems))
    return summary, None


def _claim_text(folder: Path) -> str | None:
    path = folder / "claim.json"
    try:
        claim = json.loads(path.read_text())
        age = time.time() - path.stat().st_mtime
        return f"claimed by {claim.get('host')} pid {claim.get('pid')} since {claim.get('started_at')}, " \
               f"refreshed {age:.0f} s ago"
    except (OSError, ValueError, AttributeError):
        return None


def find_problems(results_dir: str | Path) -> list[CellProblem]:
    """Every cell folder below ``results_dir`` that cannot be counted, and why."""
    return [problem for folder in cell_folders(results_dir) if (problem := check_cell(folder)[1]) is not None]


def problems_message(root: Path, problems: list[CellProblem]) -> str:
    listed = "\n".join(f"  - {problem}" for problem in problems)
    return (f"{len(problems)} cell folder(s) under {str(root)!r} cannot be counted as they stand (a report "
            f"would silently count fewer cells or prompts):\n{listed}\nRerun the same sweep to recompute them "
            "(damaged cells are redone), or report the rest with --allow-incomplete (they are listed in the report).")


def load_cells(results_dir: str | Path, strict: bool = True) -> pd.DataFrame:
    """One row per cell whose summary agrees with its records.

    ValueError when the folder is missing or holds no cells, and (``strict``) when any cell folder has a
    problem (each named, see :func:`check_cell`); ``strict=False`` warns per problem and leaves those out.
    """
    root = Path(results_dir)
    if not root.is_dir():
        raise ValueError(f"results folder {str(root)!r} does not exist")
    checked = [(folder, *check_cell(folder)) for folder in cell_folders(root)]
    problems = [problem for _, _, problem in checked if problem is not None]
    if problems and strict:
        raise ValueError(problems_message(root, problems))
    for problem in problems:
        warnings.warn(f"left out of the results: {problem}", stacklevel=2)
    paths = [(folder / "summary.json", summary) for folder, summary, _ in checked if summary is not None]
    if not paths:
        raise ValueError(
            f"no cells found under {str(root)!r} (expected cells/<cell_id>/summary.json); "
            "run an experiment first, e.g. `make reproduce`"
        )
    rows = []
    for path, summary in paths:
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
    # A speed-up measured with part of the pair offloaded, or while other runners computed on the machine
    # (its own or its AR baseline's), is not comparable with a clean one (summaries before schema 2: no caveats).
    cells["speedup_caveats"] = [list(c) if isinstance(c, list) else [] for c in cells["speedup_caveats"]]
    cells["speedup_comparable"] = [not c for c in cells["speedup_caveats"]]
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


def load_results(results_dir: str | Path, strict: bool = True) -> Results:
    """Cells and records of ``results_dir`` (see module docstring; ``strict`` as in :func:`load_cells`)."""
    cells = load_cells(results_dir, strict=strict)
    return Results(root=Path(results_dir), cells=cells, records=load_records(cells))


def integrity_markdown(results_dirs: list[Path], cells: pd.DataFrame) -> str | None:
    """A report section listing cells left out (problems) and speed-ups that are not comparable; None if
    there are neither."""
    problems = [problem for folder in results_dirs for problem in find_problems(folder)]
    flagged = cells[~cells["speedup_comparable"]] if "speedup_comparable" in cells else cells.iloc[:0]
    if not problems and flagged.empty:
        return None
    lines = ["## Results integrity", ""]
    if problems:
        lines += [f"{len(problems)} cell folder(s) were left out of every table and figure:", ""]
        lines += [f"- `{problem.path}`: {problem.problem}" for problem in problems]
        lines.append("")
    if not flagged.empty:
        lines += [f"{len(flagged)} cell(s) have speed-ups that are **not comparable** with a clean measurement "
                  "(their wall times were taken under the conditions below; block efficiency is unaffected):", "",
                  "| cell | speed-up | why |", "|---|---|---|"]
        for cell in flagged.itertuples():
            reasons = "; ".join(cell.speedup_caveats).replace("|", "/")
            lines.append(f"| {cell.cell_id} | {cell.speedup:.2f}× | {reasons} |")
        lines.append("")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Files beside the cells: quality scores and the audit
# --------------------------------------------------------------------------------------------------

QUALITY_FILE = "quality.csv"  # one row per scored cell, written by `python -m spectr_repro quality`
# One row per scored prompt per cell (columns stats.QUALITY_OUTCOME_COLUMNS, + seed, max_new_tokens, K, L when
# known), written by the same command beside quality.csv: what the report pairs with AR.
QUALITY_OUTCOMES_FILE = "quality_prompts.csv"


@dataclass
class QualityFiles:
    """The quality command's files of some results folders: ``scores`` (quality.csv of every folder that has
    one, concatenated; None if none has), ``outcomes`` (the per-prompt files, likewise) and ``unscored`` (the
    folders without quality.csv)."""

    scores: pd.DataFrame | None
    outcomes: pd.DataFrame | None
    unscored: list[Path]


def _read_csvs(paths: list[Path]) -> pd.DataFrame | None:
    return pd.concat([pd.read_csv(path) for path in paths], ignore_index=True) if paths else None


def load_quality(results_dirs: list[Path]) -> QualityFiles:
    """quality.csv and the per-prompt outcomes of ``results_dirs``; reads only, scores nothing."""
    scored = [folder / QUALITY_FILE for folder in results_dirs if (folder / QUALITY_FILE).is_file()]
    outcomes = [folder / QUALITY_OUTCOMES_FILE for folder in results_dirs if (folder / QUALITY_OUTCOMES_FILE).is_file()]
    unscored = [folder for folder in results_dirs if not (folder / QUALITY_FILE).is_file()]
    return QualityFiles(_read_csvs(scored), _read_csvs(outcomes), unscored)


@dataclass
class Audit:
    """``audit.json`` as `python -m spectr_repro audit` writes it (spectr_repro.theory.cli): ``rows`` (one per
    rule, K and option variant), ``peers`` (the peer implementations' rows) and ``settings`` (its scalar
    entries: quick, seconds, thresholds)."""

    path: Path
    rows: list[dict]
    peers: list[dict]
    settings: dict


def load_audit(path: Path) -> Audit:
    """The audit file at ``path``; ValueError when it is not the object the audit command writes."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise ValueError(f"{path}: not an audit (expected the object `python -m spectr_repro audit` writes, "
                         "with a list of rows)")
    settings = {key: value for key, value in data.items() if not isinstance(value, list | dict)}
    return Audit(path, data["rows"], data.get("peers") or [], settings)
