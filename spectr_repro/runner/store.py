"""The results folder: one directory per cell, written atomically, finished iff summary.json exists.

    <output_dir>/<experiment>/cells/<cell_id>/records.jsonl   one JSON line per prompt (records.PromptRecord)
    <output_dir>/<experiment>/cells/<cell_id>/config.yaml     the cell's resolved config
    <output_dir>/<experiment>/cells/<cell_id>/summary.json    the cell's metrics (records.CellSummary, last)

records.jsonl, then config.yaml, then summary.json, each through a temporary file and ``os.replace``;
a cell interrupted before its summary is redone from scratch (never half-counted).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from spectr_repro.records import SchemaError, iter_records, summary_from_json


def cell_identity(cfg: DictConfig) -> dict[str, Any]:
    """Everything that changes what a cell measures (not where it is written or logged)."""
    return {
        "method": OmegaConf.to_container(cfg.method, resolve=True),
        "model_pair": OmegaConf.to_container(cfg.model_pair, resolve=True),
        "dataset": OmegaConf.to_container(cfg.dataset, resolve=True),
        "hardware": OmegaConf.to_container(cfg.hardware, resolve=True),
        "choices": {k: cfg.choices[k] for k in ("model_pair", "dataset", "hardware")},
        **{k: cfg[k] for k in ("K", "L", "temperature", "num_prompts", "max_new_tokens", "seed")},
    }


def cell_id(cfg: DictConfig) -> str:
    """Readable and unique: method-pair-dataset-K-L-T-n-m-s plus a hash of the full identity.

    The hash covers method options, dataset/pair configs and hardware, so changing any of them
    gives a new cell instead of silently reusing an old one.
    """
    identity = json.dumps(cell_identity(cfg), sort_keys=True, default=str)
    digest = hashlib.sha1(identity.encode()).hexdigest()[:8]
    return (f"{cfg.method.name}-{cfg.choices.model_pair}-{cfg.choices.dataset}-K{cfg.K}-L{cfg.L}"
            f"-T{float(cfg.temperature):g}-n{cfg.num_prompts}-m{cfg.max_new_tokens}-s{cfg.seed}-{digest}")


def experiment_dir(cfg: DictConfig) -> Path:
    return Path(cfg.output_dir).expanduser() / cfg.experiment


def cell_dir(cfg: DictConfig, identifier: str) -> Path:
    return experiment_dir(cfg) / "cells" / identifier


def is_finished(directory: Path) -> bool:
    return (directory / "summary.json").is_file()


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


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_cell(directory: Path, records: list[dict[str, Any]], summary: dict[str, Any],
               config: DictConfig | None = None) -> None:
    """Records first, then the resolved config, summary last: the summary's presence marks the cell finished."""
    (directory / "summary.json").unlink(missing_ok=True)  # a forced rerun is unfinished until done
    _atomic_write(directory / "records.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    if config is not None:
        _atomic_write(directory / "config.yaml", OmegaConf.to_yaml(config, resolve=True))
    _atomic_write(directory / "summary.json", json.dumps(summary, indent=2) + "\n")


__all__ = ["cell_dir", "cell_id", "cell_identity", "experiment_dir", "is_finished", "read_records",
           "read_summary", "write_cell"]
