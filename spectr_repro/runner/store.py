"""The results folder: one directory per cell, written atomically, checked when read.

    <output_dir>/<experiment>/cells/<cell_id>/records.jsonl   one JSON line per prompt (records.PromptRecord)
    <output_dir>/<experiment>/cells/<cell_id>/config.yaml     the cell's resolved config
    <output_dir>/<experiment>/cells/<cell_id>/summary.json    the cell's metrics (records.CellSummary, last)
    <output_dir>/<experiment>/cells/<cell_id>/claim.json      while a runner computes the cell (launch.claims)

records.jsonl, then config.yaml, then summary.json, each through a temporary file and ``os.replace``
(:func:`spectr_repro.units.write_last`: a cell is a unit of the one store, whose done file is its summary; the
units module says why a cell keeps summary.json rather than a done.json). A cell is finished only when its summary
parses and agrees with its records (count, prompt ids, totals, the records' sha256: :func:`cell_state`); a cell
interrupted before its summary, or damaged later, is redone from scratch (never half-counted).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from spectr_repro.files import atomic_write_text
from spectr_repro.records import (
    SchemaError,
    iter_records,
    records_digest,
    summary_disagreements,
    summary_from_json,
)
from spectr_repro.settings import RunConfig
from spectr_repro.units import write_last


def cell_identity(run: RunConfig) -> dict[str, Any]:
    """Everything that changes what a cell measures (not where it is written or logged)."""
    values = run.values
    return {
        "method": values["method"],
        "model_pair": _without_sizes(values.get("model_pair")),
        "dataset": values["dataset"],
        # The plan's cost model and the offload switch do not change what is measured (offload is recorded).
        "hardware": {k: v for k, v in values["hardware"].items() if k not in ("estimate", "allow_offload")},
        "choices": {k: run.choices[k] for k in ("model_pair", "dataset", "hardware")},
        **{k: values[k] for k in ("K", "L", "temperature", "num_prompts", "max_new_tokens", "seed")},
    }


def _without_sizes(pair: dict | None) -> dict | None:
    """The pair config minus ``params_b`` (metadata for the plan's estimates, not what is measured)."""
    if not isinstance(pair, dict):
        return pair
    return {key: ({k: v for k, v in value.items() if k != "params_b"} if isinstance(value, dict) else value)
            for key, value in pair.items()}


def cell_id(run: RunConfig) -> str:
    """Readable and unique: method-pair-dataset-K-L-T-n-m-s plus a hash of the full identity.

    The hash covers method options, dataset/pair configs and hardware, so changing any of them
    gives a new cell instead of silently reusing an old one.
    """
    identity = json.dumps(cell_identity(run), sort_keys=True, default=str)
    digest = hashlib.sha1(identity.encode()).hexdigest()[:8]
    return (f"{run.method}-{run.model_pair}-{run.dataset}-K{run.K}-L{run.L}"
            f"-T{run.temperature:g}-n{run.num_prompts}-m{run.max_new_tokens}-s{run.seed}-{digest}")


def experiment_dir(run: RunConfig) -> Path:
    return Path(run.output_dir).expanduser() / run.experiment


def cell_dir(run: RunConfig, identifier: str) -> Path:
    return experiment_dir(run) / "cells" / identifier


@dataclass(frozen=True)
class CellState:
    """What a cell folder holds: ``finished`` (summary and records agree), ``absent`` (nothing yet),
    ``unfinished`` (records or a claim but no summary: interrupted or in progress) or ``damaged``
    (``problem`` names the file and what is wrong)."""

    status: str
    problem: str | None = None
    summary: dict[str, Any] | None = None
    records: list[dict[str, Any]] | None = None

    @property
    def finished(self) -> bool:
        return self.status == "finished"


def cell_state(directory: Path) -> CellState:
    """Read and check one cell folder (never raises for bad content: a damaged cell says why)."""
    summary_path, records_path = directory / "summary.json", directory / "records.jsonl"
    if not summary_path.is_file():
        return CellState("unfinished" if records_path.is_file() else "absent")
    try:
        summary = read_summary(directory)
    except (SchemaError, OSError, UnicodeDecodeError) as error:
        return CellState("damaged", _one_line(error))
    if summary.get("cell_id") not in (None, directory.name):
        return CellState("damaged", f"{summary_path}: summary of cell {summary['cell_id']!r}, not {directory.name!r}")
    if not records_path.is_file():
        return CellState("damaged", f"{records_path}: missing (the summary counts {summary.get('num_prompts')} "
                                    "prompts)")
    try:
        text = records_path.read_text(encoding="utf-8")
        records = list(iter_records(text.splitlines(keepends=True), str(records_path)))
    except (SchemaError, OSError, UnicodeDecodeError) as error:
        return CellState("damaged", _one_line(error))
    problems = summary_disagreements(summary, records, text)
    if problems:
        return CellState("damaged", f"{records_path} disagrees with summary.json: {'; '.join(problems)}")
    return CellState("finished", None, summary, records)


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


def read_summary(directory: Path) -> dict[str, Any]:
    """The cell's summary, checked against the schema (SchemaError naming the file otherwise)."""
    path = directory / "summary.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise SchemaError(f"{path}: not valid JSON ({error.msg} at line {error.lineno})") from None
    return summary_from_json(data, str(path))


def read_records(directory: Path) -> list[dict[str, Any]]:
    path = directory / "records.jsonl"
    with open(path, encoding="utf-8") as handle:
        return list(iter_records(handle, str(path)))


def records_text(records: list[dict[str, Any]]) -> str:
    """records.jsonl exactly as written (the summary stores its sha256)."""
    return "".join(json.dumps(r) + "\n" for r in records)


def write_cell(directory: Path, records: list[dict[str, Any]], summary: dict[str, Any],
               config: RunConfig | None = None) -> None:
    """Records first, then the resolved config, summary last: the summary's presence marks the cell finished (a
    forced rerun is unfinished until done: its old summary goes first)."""
    files = {"records.jsonl": records_text(records)}
    if config is not None:
        files["config.yaml"] = OmegaConf.to_yaml(OmegaConf.create(config.values))
    write_last(directory, files, "summary.json", json.dumps(summary, indent=2) + "\n")


__all__ = ["CellState", "atomic_write_text", "cell_dir", "cell_id", "cell_identity", "cell_state", "experiment_dir",
           "read_records", "read_summary", "records_digest", "records_text", "write_cell"]
