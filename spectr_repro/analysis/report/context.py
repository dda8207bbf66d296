"""The report's one loading step: every file REPORT.md draws on, read once into a :class:`ReportContext`.

Cells and records (``analysis.load``), the shared-block replay (``analysis.replay``), the audit, the bias
estimates, the quality scores and the theory summary. A folder that holds only `replay` or `bias` output (no
``cells/``) feeds those parts beside folders with cells; given alone, the report is of those parts only.
Every ValueError (bad input) is raised here, before anything is written.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from spectr_repro.analysis.load import (
    Audit,
    QualityFiles,
    Results,
    load_audit,
    load_quality,
    load_results,
)
from spectr_repro.analysis.replay import (
    SUMMARY_FILE,
    read_blocks,
    read_summaries,
    reference_setting,
    write_summaries,
)
from spectr_repro.analysis.replay_report import main_cells
from spectr_repro.analysis.speedup import predict_speedups
from spectr_repro.analysis.speedup_cells import cell_agreement, time_breakdown
from spectr_repro.analysis.speedup_report import SpeedupData
from spectr_repro.analysis.versions import MANIFEST_FILE
from spectr_repro.cost.calibration import Calibration, read_calibrations
from spectr_repro.cost.model import CallCosts
from spectr_repro.data import typical_prompt_tokens
from spectr_repro.paper import load_paper_numbers

BIAS_CSV = Path("bias") / "bias.csv"  # written by `python -m spectr_repro bias` (spectr_repro.bias.driver)
REPLAY_SUMMARY = Path("replay") / "replay_summary.csv"  # written by `python -m spectr_repro replay`


@dataclass
class ReplayData:
    """The shared-block replays of the folders: blocks, summary and differences tables, the main (K, L)."""

    roots: list[Path]
    blocks: pd.DataFrame
    table: pd.DataFrame
    differences: pd.DataFrame
    K: int
    L: int
    left_out: list[str] = field(default_factory=list)  # prompts or groups that could not be read, each named
    summary_folders: list[Path] = field(default_factory=list)  # where each root's summary is (committed: scratch)


@dataclass
class BiasData:
    """``bias/bias.csv`` of every folder that has one (concatenated) and the files it came from."""

    table: pd.DataFrame
    csv_paths: list[Path]


@dataclass
class ReportContext:
    """Everything a section renders from; a part that is None has no section. Folders of replay or bias output
    alone have no ``results``, ``paper``, ``quality`` or ``theory``; ``quality`` is the exception raised reading
    its files when they could not be read."""

    folders: list[Path]
    report_path: Path
    results: Results | None = None
    paper: pd.DataFrame | None = None
    audit: Audit | None = None
    replay: ReplayData | None = None
    bias: BiasData | None = None
    quality: QualityFiles | Exception | None = None
    theory: Path | None = None
    speedup: SpeedupData | None = None
    generated: str = field(default_factory=lambda: dt.datetime.now().isoformat(timespec="seconds"))

    @property
    def out_dir(self) -> Path:
        return self.report_path.parent

    @property
    def command(self) -> str:
        return "python -m spectr_repro report " + " ".join(str(f) for f in self.folders)


def find_audit(results_dirs: list[Path]) -> Path | None:
    """audit.json next to or above the results folders (results/audit/audit.json). Never the working directory's:
    a report of results elsewhere would show this checkout's audit as theirs (``--audit`` names one)."""
    candidates = []
    for folder in results_dirs:
        candidates += [folder / "audit" / "audit.json", folder.parent / "audit" / "audit.json", folder / "audit.json"]
    return next((c for c in candidates if c.is_file()), None)


def find_theory(results_dirs: list[Path]) -> Path | None:
    """THEORY.md beside the results folders (results/theory/THEORY.md); never the working directory's."""
    candidates = [folder.parent / "theory" / "THEORY.md" for folder in results_dirs]
    return next((c for c in candidates if c.is_file()), None)


def _merge(results: list[Results]) -> Results:
    cells = pd.concat([r.cells for r in results], ignore_index=True)
    records = pd.concat(
        [r.records for r in results if not r.records.empty] or [results[0].records], ignore_index=True
    )
    return Results(root=results[0].root, cells=cells, records=records)


def _summarised_replay(folder: Path, scratch: Path) -> tuple[Path, Path] | None:
    """(``folder/replay``, the folder holding its summary), or None when it has neither prompts nor a summary.

    The replay writes its summary when the command ends: a replay stopped (or still running) has prompts the summary
    lacks, so the report rebuilds the summary from the records rather than leave them out. Committed results (groups
    sealed with a manifest.json) are never written into: their summary is rebuilt under ``scratch`` (the report's
    own folder), so a report of a fresh clone leaves the committed tree as git has it."""
    root = folder / "replay"
    finished = [path.stat().st_mtime for path in root.glob("*/prompts/*/done.json")]
    sealed = any(root.glob(f"*/{MANIFEST_FILE}"))
    where = scratch / "replay_summaries" / folder.name if sealed else root
    summary = where / SUMMARY_FILE
    if finished and (not summary.is_file() or summary.stat().st_mtime < max(finished)):
        try:
            write_summaries(root, out=where)
        except OSError as error:  # a results folder read-only to this user: the summary it has, else none
            warnings.warn(f"cannot rebuild the replay summary in {where} ({error}); the report reads the one there",
                          stacklevel=2)
    return (root, where) if summary.is_file() else None


def load_replay(results_dirs: list[Path], scratch: Path) -> ReplayData | None:
    """The replays under ``results_dirs`` (``<folder>/replay``); None when none has finished blocks. ``scratch``:
    where the summaries of committed results are rebuilt (:func:`_summarised_replay`)."""
    found = [pair for folder in results_dirs if (pair := _summarised_replay(folder, scratch)) is not None]
    if not found:
        return None
    roots = [root for root, _ in found]
    read = [read_blocks(root) for root in roots]
    blocks = pd.concat([frame for frame, _ in read], ignore_index=True)
    left_out = [problem for _, problems in read for problem in problems]
    tables = [read_summaries(where) for _, where in found]
    table = pd.concat([t for t, _ in tables], ignore_index=True)
    differences = [d for _, d in tables if not d.empty]
    if blocks.empty or table.empty:
        return None
    K, L = main_cells(table, reference_setting(roots))
    return ReplayData(roots, blocks, table, pd.concat(differences, ignore_index=True) if differences
                      else pd.DataFrame(), K, L, left_out, [where for _, where in found])


def find_costs(results_dirs: list[Path], model_pair: str, dtype: str | None) -> CallCosts | None:
    """The call costs of ``model_pair`` (and ``dtype`` when known): the calibration a ``check`` beside the results
    wrote (``<folder>/check/check.json`` or one level up: ``make reproduce``'s ``results/check``), else this machine's
    calibration file (``cost.calibration``); the newest with rule timings first. None when neither has the pair."""
    candidates = []
    paths = [c for folder in results_dirs for c in (folder / "check" / "check.json",
                                                    folder.parent / "check" / "check.json")]
    for path in dict.fromkeys(paths):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            candidates.append((Calibration.from_json(data["calibration"]), f"`{path}`"))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    candidates += [(calibration, "this machine's calibration file") for calibration in read_calibrations().values()]
    matching = [(c, where) for c, where in candidates if c.model_pair == model_pair
                and (dtype in (None, "None") or c.dtype == dtype)]
    if not matching:
        return None
    calibration, where = max(matching, key=lambda item: ("rule_seconds" in item[0].extra, item[0].date,
                                                         not item[0].random_weights))
    costs = CallCosts.from_calibration(calibration)
    return dataclasses.replace(costs, source=f"{costs.source}, from {where}")


def load_speedup(results_dirs: list[Path], replay: ReplayData | None, results: Results | None
                 ) -> SpeedupData | None:
    """Predicted speed-ups of the replay (when this pair has call costs), checked against the timed cells."""
    if replay is None or replay.blocks.empty:
        return None
    metas = [json.loads(path.read_text()) for root in replay.roots for path in sorted(root.glob("*/replay.json"))]
    pair = str(replay.blocks["model_pair"].iloc[0])
    dtypes = {str(meta.get("dtype")) for meta in metas if meta.get("model_pair") == pair}
    costs = find_costs(results_dirs, pair, dtypes.pop() if len(dtypes) == 1 else None)
    if costs is None:
        return None
    contexts = {str(meta["dataset"]): typical_prompt_tokens(str(meta["dataset"])) + int(meta["max_new_tokens"]) // 2
                for meta in metas if meta.get("model_pair") == pair}
    prediction = predict_speedups(replay.blocks[replay.blocks["model_pair"] == pair], costs, contexts)
    cells = results.cells if results is not None else pd.DataFrame()
    records = results.records if results is not None else pd.DataFrame()
    if not cells.empty and "model_pair" in cells:
        cells = cells[cells["model_pair"] == pair]
    agreement = cell_agreement(cells, records, costs, prediction) if not cells.empty else pd.DataFrame()
    breakdown = time_breakdown(cells, records, costs, replay.K, replay.L) if not cells.empty else pd.DataFrame()
    return SpeedupData(costs, prediction, agreement, breakdown, replay.K, replay.L)


def load_bias(results_dirs: list[Path]) -> BiasData | None:
    paths = [folder / BIAS_CSV for folder in results_dirs if (folder / BIAS_CSV).is_file()]
    return BiasData(pd.concat([pd.read_csv(path) for path in paths], ignore_index=True), paths) if paths else None


def _quality(results_dirs: list[Path]) -> QualityFiles | Exception:
    try:
        return load_quality(results_dirs)
    except Exception as error:  # an optional section must not lose the report's tables and figures
        return error


def load_context(
    results_dirs: list[str | Path],
    output: str | Path | None = None,
    paper_csv: str | Path | None = None,
    audit: str | Path | None = None,
    allow_incomplete: bool = False,
) -> ReportContext:
    """Read every file the report needs. ValueError on bad input: damaged or unfinished cell folders (each
    named) unless ``allow_incomplete``, a folder with neither cells nor replay nor bias output, an audit
    file given but missing or not an audit."""
    folders = [Path(d) for d in results_dirs]
    without_cells = [f for f in folders if not (f / "cells").is_dir()
                     and ((f / BIAS_CSV).is_file() or (f / "replay").is_dir())]
    alone = bool(folders) and len(without_cells) == len(folders)  # bias or replay output alone
    results = None
    if not alone:
        cell_folders = [f for f in folders if f not in without_cells] or folders
        results = _merge([load_results(folder, strict=not allow_incomplete) for folder in cell_folders])
    audit_path = Path(audit) if audit is not None else find_audit(folders)
    if audit is not None and not audit_path.is_file():
        raise ValueError(f"audit file {str(audit_path)!r} not found")
    report_path = Path(output) if output is not None else folders[0] / "REPORT.md"
    replay = load_replay(folders, report_path.parent)
    return ReportContext(
        folders=folders,
        report_path=report_path,
        results=results,
        paper=None if alone else load_paper_numbers(paper_csv),
        audit=load_audit(audit_path) if audit_path is not None else None,
        replay=replay,
        bias=load_bias(folders),
        quality=None if alone else _quality(folders),
        theory=None if alone else find_theory(folders),
        speedup=load_speedup(folders, replay, results),
    )
