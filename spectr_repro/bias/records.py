"""The bias command's records: one folder per (setting, context) holding a JSON per method and the ``done.json``
that vouches for them (``spectr_repro.units``), and the table (``bias.csv``) rebuilt from every finished context.

    bias/contexts/<setting id>/setting.json          the setting's values (``records_integrity``: contexts verified)
    bias/contexts/<setting id>/<context>/<method>.json, done.json
    bias/set_aside/<setting id>/<context>-<stamp>/   a damaged or partial context, moved aside (never deleted)
    bias/bias.csv                                    one row per (setting, method, context) and one pooled
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from spectr_repro.bias import estimators
from spectr_repro.errors import ResourceError
from spectr_repro.files import atomic_write_text
from spectr_repro.units import DONE_FILE, SET_ASIDE, set_aside, unit_state, write_unit

CSV_COLUMNS = ["model_pair", "dataset", "method", "K", "L", "temperature", "draft_temperature", "context",
               "samples", "tv_estimate", "interval", "p_value", "p_value_holm", "detectable_tv", "verdict",
               "estimator", "acceptance", "exact_tv"]  # p_value_holm: per context, Holm-adjusted in its family
INTEGRITY = 1  # setting.json's ``records_integrity``: its contexts have a done.json (absent: written before 2026-12-03)
log = logging.getLogger(__name__)


def start_setting(folder: Path, setting: dict) -> bool:
    """Write setting.json (marking that its contexts get a done.json) unless the folder holds contexts written before
    that; True when the setting's contexts are verified by their done.json."""
    path = folder / "setting.json"
    old = _json_or_none(path) if path.exists() else None
    legacy = path.exists() and not (isinstance(old, dict) and old.get("records_integrity") == INTEGRITY)
    if legacy and any(folder.glob("*/*.json")):
        log.warning(f"{folder} holds contexts measured before done.json recorded their sha256: kept as finished, "
                    f"unverified")
        return False
    try:
        atomic_write_text(path, json.dumps({**setting, "records_integrity": INTEGRITY}))
    except OSError as error:
        raise ResourceError(f"cannot write into {folder}: {error}") from error
    return True


def missing_methods(directory: Path, methods: list[str], verified: bool) -> list[str]:
    """The methods still to measure at a context. Verified settings: all of them unless its done.json vouches for
    its files; a damaged or partial context is named and its files set aside first (never deleted)."""
    if not verified:  # written before done.json: what is there counts
        return [m for m in methods if not (directory / f"{m}.json").exists()]
    state = unit_state(directory)
    if state.status == "finished":
        return [m for m in methods if not (directory / f"{m}.json").exists()]
    if state.status != "absent":
        moved = set_aside(directory, directory.parents[2] / SET_ASIDE / directory.parent.name)
        tqdm.write(f"warning: {state.problem}; its files are set aside in {moved} and the context is measured again",
                   file=sys.stderr)
    return list(methods)


def context_problem(directory: Path) -> str | None:
    """None when the context's done.json vouches for its files, else what is wrong (naming the file)."""
    state = unit_state(directory)
    if state.status == "finished":
        return None
    return state.problem or f"{directory}: no {DONE_FILE} (nothing written yet)"


def write_context(directory: Path, records: dict[str, dict]) -> None:
    """One JSON per method, then done.json with each file's sha256 and line count (last: the context is finished);
    methods added to a finished context join the files its done.json lists."""
    write_unit(directory, {f"{method}.json": json.dumps(record) for method, record in records.items()}, extend=True)


def _json_or_none(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


def safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "+-_." else "_" for c in name)


# --------------------------------------------------------------------------------------------------
# The table


def read_records(folder: Path) -> list[dict]:
    """Every readable (setting, context, method) record under ``folder``; what cannot be read is logged, naming
    the file (:func:`read_records_checked`)."""
    records, left_out = read_records_checked(folder)
    for problem in left_out:
        log.warning(problem)
    return records


def read_records_checked(folder: Path) -> tuple[list[dict], list[str]]:
    """(records, what was left out): a context whose done.json does not vouch for its files (damaged, or stopped
    before it finished) is left out whole; in settings written before done.json, each unreadable file."""
    records, left_out = [], []
    for setting_folder in sorted(p for p in Path(folder).glob("contexts/*") if p.is_dir()):
        setting = _json_or_none(setting_folder / "setting.json")  # absent or without the marker: written before
        verified = isinstance(setting, dict) and setting.get("records_integrity") == INTEGRITY
        for directory in sorted(p for p in setting_folder.iterdir() if p.is_dir()):
            problem = context_problem(directory) if verified else None
            if problem is not None:
                left_out.append(f"left out context {directory.name}: {problem}")
                continue
            for path in sorted(directory.glob("*.json")):
                if path.name == DONE_FILE:
                    continue
                record = _json_or_none(path)
                if isinstance(record, dict):
                    records.append(record)
                else:
                    left_out.append(f"left out {path}: not valid JSON")
    return records, left_out


def bias_table(folder: Path) -> pd.DataFrame:
    """One row per (setting, method, context) and a pooled row per (setting, method) (Fisher over contexts)."""
    records = read_records(folder)
    rows = []
    keys = ("model_pair", "dataset", "method", "K", "L", "temperature", "draft_temperature")
    by_cell: dict[tuple, list[dict]] = {}
    for record in records:
        by_cell.setdefault(tuple(record[k] for k in keys), []).append(record)
    for group in by_cell.values():
        # Per-context verdicts of one family with Holm's correction (16 contexts at a nominal 5 % each would read
        # "bias detected" somewhere for a lossless rule about half the time); the pooled row is the rule's verdict.
        verdicts = estimators.context_verdicts([r["p_value"] for r in group], [r["power_model"] for r in group])
        for record, (holm_p, detectable, text) in zip(group, verdicts, strict=True):
            row = _row(record, record["context"], record["p_value"], detectable, record["tv_estimate"],
                       record["interval"], record["samples"])
            rows.append({**row, "verdict": text, "p_value_holm": holm_p})
    for group in by_cell.values():
        p_value, detectable = estimators.pooled([r["p_value"] for r in group], [r["power_model"] for r in group])
        estimate = sum(r["tv_estimate"] for r in group) / len(group)
        low = sum(r["interval"][0] for r in group) / len(group)
        high = sum(r["interval"][1] for r in group) / len(group)
        rows.append(_row(group[0], f"pooled ({len(group)} contexts)", p_value, detectable, estimate, [low, high],
                         sum(r["samples"] for r in group), exact=_mean([r["exact_tv"] for r in group]),
                         acceptance=_mean([r["acceptance"] for r in group])))
    frame = pd.DataFrame(rows, columns=CSV_COLUMNS)
    return frame


def _mean(values) -> float:
    return sum(values) / len(values) if values else math.nan


def _row(record: dict, context: str, p_value: float, detectable: float, estimate: float, interval, samples: int,
         exact: float | None = None, acceptance: float | None = None) -> dict:
    return {
        **{k: record[k] for k in ("model_pair", "dataset", "method", "K", "L", "temperature", "draft_temperature")},
        "context": context, "samples": samples, "tv_estimate": round(estimate, 5),
        "interval": f"[{interval[0]:.4f}, {interval[1]:.4f}]", "p_value": p_value,
        "detectable_tv": detectable, "verdict": estimators.verdict(p_value, detectable),
        "estimator": record["estimator"], "acceptance": round(record["acceptance"] if acceptance is None
                                                               else acceptance, 4),
        "exact_tv": record["exact_tv"] if exact is None else exact,
    }


def write_csv(folder: Path) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "bias.csv"
    temporary = path.with_suffix(".tmp")
    bias_table(folder).to_csv(temporary, index=False)
    os.replace(temporary, path)
    return path


__all__ = ["CSV_COLUMNS", "bias_table", "context_problem", "missing_methods", "read_records", "read_records_checked",
           "safe_name", "start_setting", "write_context", "write_csv"]
