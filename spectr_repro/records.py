"""The one schema of the results folder: a record per prompt, a summary per cell.

    <output_dir>/<experiment>/cells/<cell_id>/records.jsonl   one PromptRecord per line
    <output_dir>/<experiment>/cells/<cell_id>/config.yaml     the cell's resolved config
    <output_dir>/<experiment>/cells/<cell_id>/summary.json    one CellSummary (written last)

The runner builds these dataclasses and writes them; the analysis and the quality scorer read a cell
folder back through the one reader below (``cell_folders``, ``read_summary``, ``read_records``,
``read_cells``), which checks each file with ``summary_from_json`` / ``record_from_json`` (naming the
file and the missing key when one is missing); W&B logs the same fields. A new field is added here,
once. Plain dataclasses, no torch: a report can be rebuilt from a results folder on any laptop.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from spectr_repro.errors import SchemaError

SCHEMA_VERSION = 2  # 2: prompt_ids, records_sha256, offloaded, contention, speedup_caveats, model_revisions


def _column(table: bool = True, **metadata):
    """A field; ``table=False`` keeps long per-iteration lists out of W&B's per-prompt table."""
    return field(metadata={"table": table, **metadata})


@dataclass
class PromptRecord:
    """One prompt of one cell: what was generated and what it cost."""

    prompt_id: str = _column()
    method: str = _column()
    K: int = _column()
    L: int = _column()
    temperature: float = _column()
    seed: int = _column()
    prompt_tokens: int = _column()
    new_tokens: int = _column()
    target_calls: int = _column()
    block_efficiency: float = _column()  # new_tokens / target_calls
    wall_time_s: float | None = _column()  # None: decoded in a batch of prompts (BE only, never timed)
    ar_wall_time_s: float | None = _column()  # the AR baseline's wall time on the same prompt (None if untimed)
    completion: str = _column()  # decoded text, cut at the first stop string
    reference: str | None = _column()  # the dataset's reference answer (math) or task id
    accepted_lengths: list[int] = _column(table=False)  # tau of each iteration
    block_lengths: list[int] = _column(table=False)  # drafted length of each block (the last may be shorter)
    dataset: str = _column()
    model_pair: str = _column()
    batch_prompts: int = _column()  # prompts decoded together with this one (1: alone and timed)


@dataclass
class CellSummary:
    """One cell (method x setting x prompt set): pooled metrics, where and how it was measured."""

    experiment: str
    cell_id: str
    method: str
    method_options: dict[str, Any]
    dataset: str
    model_pair: str
    hardware: str
    K: int
    L: int
    temperature: float
    seed: int
    num_prompts: int
    max_new_tokens: int
    tokens: int  # total new tokens over the prompts
    target_calls: int
    block_efficiency: float  # pooled: tokens / target_calls
    block_efficiency_std: float  # standard deviation of the per-prompt block efficiencies
    wall_time_s: float  # sum of the timed prompts' wall times (each decoded alone)
    ar_wall_time_s: float  # sum of the AR baseline's wall times on the same prompts
    speedup: float  # ar_wall_time_s / wall_time_s (timed prompts only; NaN when none was timed)
    tokens_per_s: float  # over the timed prompts
    acceptance_by_position: list[float | None]  # P(position i accepted | reached), i = 1..L
    time_split: dict[str, float]  # seconds per engine section (prefill, draft, target, verify, total)
    ar_cell_id: str
    ar_same_process: bool  # the AR baseline was timed in this process (else read from its cell)
    environment: dict[str, Any]
    created_at: str
    # Integrity: what the summary was computed from (a cell is finished only when its records agree).
    prompt_ids: list[str]  # the records' prompt ids, in order
    records_sha256: str  # sha256 of records.jsonl as written
    # Conditions of the timing; any caveat makes the speed-up not comparable (the report marks it).
    offloaded: bool  # some modules of the pair sat on CPU/disk while the rest was on the accelerator
    contention: dict[str, Any]  # other runners computing on this machine while timed, load average, CPUs
    speedup_caveats: list[str]  # why this speed-up is not comparable ([] = comparable); includes the AR's
    model_revisions: dict[str, Any] | None  # hub checkpoints: role -> {hub_id, revision, commit}; None offline
    # Batched block efficiency (hardware.batch_prompts > 1, runner.batched): prompts past the first
    # timed_prompts were decoded batch_prompts at a time; their wall time is batched_wall_time_s (a
    # throughput of BE samples, never a speed-up: speed-ups come from the timed prompts only).
    batch_prompts: int = 1
    timed_prompts: int | None = None  # prompts decoded alone and timed (None: read from the records)
    batched_wall_time_s: float = 0.0
    schema_version: int = SCHEMA_VERSION


REQUIRED_SUMMARY_KEYS = ("method", "dataset", "model_pair", "K", "L", "temperature")


def field_names(cls) -> list[str]:
    return [f.name for f in fields(cls)]


def table_columns() -> list[str]:
    """The per-prompt columns shown in tables (W&B): every record field but the per-iteration lists."""
    return [f.name for f in fields(PromptRecord) if f.metadata.get("table", True)]



def summary_from_json(data: Mapping[str, Any], where: str = "summary") -> dict[str, Any]:
    """A summary read from disk, checked: every required key present; absent optional keys become None.

    Older summaries (before a field existed) load with that field None rather than failing.
    """
    if not isinstance(data, Mapping):
        raise SchemaError(f"{where}: expected a JSON object, got {type(data).__name__}")
    missing = [key for key in REQUIRED_SUMMARY_KEYS if key not in data]
    if missing:
        raise SchemaError(f"{where}: summary lacks required keys {missing}")
    out = {name: data.get(name) for name in field_names(CellSummary)}
    out.update({key: value for key, value in data.items() if key not in out})  # keep unknown extras
    return out


def record_from_json(data: Mapping[str, Any], where: str = "record") -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise SchemaError(f"{where}: expected a JSON object, got {type(data).__name__}")
    if "prompt_id" not in data:
        raise SchemaError(f"{where}: record lacks 'prompt_id'")
    out = {name: data.get(name) for name in field_names(PromptRecord)}
    out.update({key: value for key, value in data.items() if key not in out})
    return out


@dataclass(frozen=True)
class RecordTotals:
    """What a summary must agree with: the totals of its records."""

    num_prompts: int
    prompt_ids: tuple[str, ...]
    tokens: int
    target_calls: int
    wall_time_s: float  # timed records only
    ar_wall_time_s: float  # timed records only
    timed_prompts: int = 0
    timed_tokens: int = 0

    @property
    def block_efficiency(self) -> float:
        return self.tokens / self.target_calls if self.target_calls else 0.0


def is_timed(record: Mapping[str, Any]) -> bool:
    """Decoded alone and timed (a batched prompt's wall_time_s is None)."""
    return record.get("wall_time_s") is not None


def record_totals(records: Sequence[Mapping[str, Any]]) -> RecordTotals:
    timed = [r for r in records if is_timed(r)]
    return RecordTotals(
        num_prompts=len(records),
        prompt_ids=tuple(str(r["prompt_id"]) for r in records),
        tokens=sum(int(r["new_tokens"]) for r in records),
        target_calls=sum(int(r["target_calls"]) for r in records),
        wall_time_s=sum(float(r["wall_time_s"]) for r in timed),
        ar_wall_time_s=sum(float(r["ar_wall_time_s"] or 0.0) for r in timed),
        timed_prompts=len(timed),
        timed_tokens=sum(int(r["new_tokens"]) for r in timed),
    )


def pooled_metrics(records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The summary's pooled numbers from its records (one definition for the runner and the checks).

    Tokens, target calls and block efficiency pool every record; wall times, speed-up and tokens/s
    pool the timed records only (batched prompts have no wall time of their own)."""
    totals = record_totals(records)
    per_prompt = [float(r["block_efficiency"]) for r in records]
    wall = totals.wall_time_s
    return {
        "num_prompts": totals.num_prompts,
        "tokens": totals.tokens,
        "target_calls": totals.target_calls,
        "block_efficiency": totals.block_efficiency,
        "block_efficiency_std": statistics.stdev(per_prompt) if len(per_prompt) > 1 else 0.0,
        "wall_time_s": wall,
        "ar_wall_time_s": totals.ar_wall_time_s,
        "speedup": totals.ar_wall_time_s / wall if wall > 0 else math.nan,
        "tokens_per_s": totals.timed_tokens / wall if wall > 0 else math.nan,
        "timed_prompts": totals.timed_prompts,
    }


def records_digest(text: str) -> str:
    """sha256 of a records.jsonl text, as stored in the summary's ``records_sha256``."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# ---- integrity of a finished unit's files (a replay prompt, a bias context): its done.json lists them -------------
def file_integrity(text: str) -> dict[str, Any]:
    """What a done.json records of one file it vouches for: its sha256 and its number of lines."""
    return {"sha256": records_digest(text), "lines": text.count("\n")}


def first_bad_line(text: str) -> tuple[int, str] | None:
    """(line number, why) of the first line of a JSON-lines text that is not one JSON value, or None."""
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            return number, "empty line"
        try:
            json.loads(line)
        except json.JSONDecodeError as error:
            return number, f"not valid JSON ({error.msg})"
    if text and not text.endswith("\n"):
        return text.count("\n") + 1, "cut before its end of line"
    return None


COMPRESSED_SUFFIX = ".gz"  # committed results hold their record files gzip'd (results/README.md)


def compressed_path(path: Path) -> Path:
    """Where the gzip'd copy of a record file lives (``blocks.jsonl`` -> ``blocks.jsonl.gz``)."""
    return path.with_name(path.name + COMPRESSED_SUFFIX)


def record_file_exists(path: Path) -> bool:
    """The record file is there, as written or as its gzip'd committed copy."""
    return path.exists() or compressed_path(path).exists()


def read_record_text(path: Path) -> str:
    """The text of a record file: the file as written, else its gzip'd copy (a fresh clone of committed results
    holds only that); FileNotFoundError naming the plain path when neither exists. done.json vouches for the text,
    so the same sha256 checks either copy."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        packed = compressed_path(path)
        if not packed.exists():
            raise
    try:
        return gzip.decompress(packed.read_bytes()).decode("utf-8")
    except (EOFError, gzip.BadGzipFile, OSError) as error:  # a truncated or edited .gz: unreadable, named
        raise OSError(f"{packed} is not a whole gzip file ({error})") from error


def integrity_problems(directory: Path, files: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """How the files of ``directory`` differ from what its done.json vouches for (``files``: name -> its
    :func:`file_integrity`); [] when every one is there as written. Each problem names the file (and the line)."""
    problems = []
    for name, expected in files.items():
        path = Path(directory) / name
        try:
            text = read_record_text(path)
        except FileNotFoundError:
            problems.append(f"{path}: missing (done.json lists it)")
            continue
        except (OSError, UnicodeDecodeError) as error:
            problems.append(f"{path}: unreadable ({type(error).__name__}: {error})")
            continue
        actual = file_integrity(text)
        if actual == {"sha256": expected.get("sha256"), "lines": expected.get("lines")}:
            continue
        bad = first_bad_line(text) if name.endswith((".jsonl", ".json")) else None
        where = f"{path}:{bad[0]}: {bad[1]}; " if bad else f"{path}: "
        problems.append(f"{where}{actual['lines']} line(s) where done.json records {expected.get('lines')}"
                        if actual["lines"] != expected.get("lines") else
                        f"{where}not the file done.json vouches for (sha256 differs)")
    return problems


def summary_disagreements(summary: Mapping[str, Any], records: Sequence[Mapping[str, Any]],
                          records_text: str | None = None) -> list[str]:
    """How a summary disagrees with its records ([] when they agree): count, prompt ids, totals, digest.

    Summaries written before a field existed (None) skip that check; the totals are checked always.
    """
    problems: list[str] = []
    ids = [str(r.get("prompt_id")) for r in records]
    duplicated = sorted({i for i in ids if ids.count(i) > 1})
    if duplicated:
        problems.append(f"prompt ids repeated in the records: {duplicated[:5]}")
    expected = summary.get("num_prompts")
    if expected is not None and expected != len(records):
        problems.append(f"the summary counts {expected} prompts, the records hold {len(records)}")
    summary_ids = summary.get("prompt_ids")
    if summary_ids is not None and [str(i) for i in summary_ids] != ids:
        missing = [i for i in summary_ids if str(i) not in ids]
        extra = [i for i in ids if i not in {str(j) for j in summary_ids}]
        problems.append(f"prompt ids differ from the summary's (missing {missing[:5]}, unexpected {extra[:5]})"
                        if missing or extra else "prompt ids are in another order than the summary's")
    try:
        totals = record_totals(records)
    except (KeyError, TypeError, ValueError) as error:
        return [*problems, f"a record lacks a numeric field ({type(error).__name__}: {error})"]
    for key in ("tokens", "target_calls"):
        if summary.get(key) is not None and int(summary[key]) != getattr(totals, key):
            problems.append(f"{key}: the summary says {summary[key]}, the records sum to {getattr(totals, key)}")
    for key in ("wall_time_s", "ar_wall_time_s"):
        value = summary.get(key)
        if value is not None and not math.isclose(float(value), getattr(totals, key), rel_tol=1e-9, abs_tol=1e-12):
            problems.append(f"{key}: the summary says {value}, the records sum to {getattr(totals, key)}")
    digest = summary.get("records_sha256")
    if digest is not None and records_text is not None and records_digest(records_text) != digest:
        problems.append("records.jsonl is not the file the summary was written with (sha256 differs)")
    return problems


def as_json(item: PromptRecord | CellSummary) -> dict[str, Any]:
    return asdict(item)


def flatten_numbers(summary: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Scalars of a summary with nested dicts flattened to ``key/sub`` (W&B summary, CSV columns)."""
    flat: dict[str, Any] = {}
    for key, value in summary.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_numbers(value, prefix=f"{name}/"))
        elif isinstance(value, int | float | str | bool) or value is None:
            flat[name] = value
    return flat


def iter_records(lines: Iterable[str], where: str) -> Iterable[dict[str, Any]]:
    """Parse JSONL lines into checked records; a bad line is a SchemaError naming ``where`` and the line."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as error:
            raise SchemaError(f"{where}:{number}: not valid JSON ({error.msg})") from None
        yield record_from_json(data, f"{where}:{number}")


# ---- reading a results folder: the one reader of a cell folder (analysis.load and quality use it) ----------
SUMMARY_FILE = "summary.json"
RECORDS_FILE = "records.jsonl"


def cell_folders(results_dir: str | Path) -> list[Path]:
    """Every ``cells/<cell_id>/`` folder below ``results_dir`` (with or without a summary), sorted; ``results_dir``
    may itself be a ``cells`` folder."""
    root = Path(results_dir)
    holders = [root] if root.name == "cells" else sorted(root.rglob("cells"))
    return sorted(p for cells in holders if cells.is_dir() for p in cells.iterdir() if p.is_dir())


def read_summary(path: Path) -> dict[str, Any]:
    """A summary.json, checked (SchemaError naming ``path``: not JSON, or a required key missing; OSError)."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except json.JSONDecodeError as err:
        raise SchemaError(f"{path}: not valid JSON ({err})") from err
    return summary_from_json(data, str(path))


def read_records(path: Path) -> tuple[list[dict[str, Any]], str]:
    """A records.jsonl's checked records and the text they were parsed from (its sha256 is the summary's
    ``records_sha256``); SchemaError naming ``path`` and the line, OSError, UnicodeDecodeError."""
    text = Path(path).read_text(encoding="utf-8")
    return list(iter_records(text.splitlines(keepends=True), str(path))), text


@dataclass(frozen=True)
class CellFiles:
    """What one cell folder holds: its checked summary and records (None: no records.jsonl)."""

    folder: Path
    summary: dict[str, Any]
    records: list[dict[str, Any]] | None


def read_cells(results_dir: str | Path) -> list[CellFiles]:
    """Every cell folder below ``results_dir`` that has a summary.json, read as it stands (a damaged file raises;
    whether a summary agrees with its records is ``summary_disagreements``'s question, asked by the analysis)."""
    cells = []
    for folder in cell_folders(results_dir):
        if not (folder / SUMMARY_FILE).is_file():
            continue
        summary = read_summary(folder / SUMMARY_FILE)
        records_path = folder / RECORDS_FILE
        cells.append(CellFiles(folder, summary, read_records(records_path)[0] if records_path.is_file() else None))
    return cells


__all__ = [
    "COMPRESSED_SUFFIX", "RECORDS_FILE", "REQUIRED_SUMMARY_KEYS", "SCHEMA_VERSION", "SUMMARY_FILE", "CellFiles",
    "CellSummary", "PromptRecord", "RecordTotals", "SchemaError", "as_json", "cell_folders", "compressed_path",
    "field_names", "file_integrity", "first_bad_line", "flatten_numbers", "integrity_problems", "is_timed",
    "iter_records", "pooled_metrics", "read_cells", "read_record_text", "read_records", "read_summary",
    "record_file_exists", "record_from_json", "record_totals", "records_digest", "summary_disagreements",
    "summary_from_json", "table_columns",
]
