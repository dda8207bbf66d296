"""Reading offline W&B runs back: what a run holds (group, job type, config, summary and history keys).

An offline run is ``<folder>/wandb/offline-run-<time>-<id>/run-<id>.wandb``: W&B's record log (LevelDB-style
blocks of 32 KiB, each record a ``wandb_internal_pb2.Record`` protobuf, possibly split across blocks). W&B ships
no reader for it in Python since its Go core, so this is the smallest one: the dashboard uses it to find the runs of
a results folder, and the tests to check that the runs hold what the dashboard's panels plot.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BLOCK, HEADER = 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


@dataclass
class OfflineRun:
    path: Path  # the run-<id>.wandb file
    name: str = ""
    group: str = ""
    job_type: str = ""
    project: str = ""
    tags: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)  # nested keys joined with "." (W&B's runs table)
    summary: dict[str, Any] = field(default_factory=dict)
    history_keys: set[str] = field(default_factory=set)

    @property
    def folder(self) -> Path:
        return self.path.parent

    @property
    def metrics(self) -> set[str]:
        """Every key a panel can plot from this run: summary and history."""
        return set(self.summary) | self.history_keys


def records(path: Path) -> Iterator[Any]:
    """The protobuf records of one ``run-*.wandb`` file, in order. ValueError for a file that is not one."""
    from wandb.proto import wandb_internal_pb2  # wandb (~0.5 s): only a W&B run pays

    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B run file")
    position, pending = HEADER, b""
    while position + HEADER <= len(data):
        left = BLOCK - position % BLOCK
        if left < HEADER:  # a block's trailing padding
            position += left
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[position:position + HEADER])
        if kind == 0:  # zero fill to the end of the block
            position += left
            continue
        chunk = data[position + HEADER:position + HEADER + length]
        position += HEADER + length
        if kind in (FIRST, MIDDLE):
            pending = chunk if kind == FIRST else pending + chunk
            continue
        payload = pending + chunk if kind == LAST else chunk
        pending = b""
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        yield record


def _key(item) -> str:
    """The logged name: a table or image is stored as its fields (``nested_key`` = [name, field])."""
    return item.key or item.nested_key[0]


def _set(summary: dict[str, Any], item) -> None:
    value = json.loads(item.value_json)
    if item.key:
        summary[item.key] = value
        return
    *path, last = item.nested_key
    inner = summary
    for part in path:
        inner = inner.setdefault(part, {}) if isinstance(inner.get(part, {}), dict) else inner
    inner[last] = value


def _flatten(prefix: str, value: Any, into: dict[str, Any]) -> None:
    """Nested config dicts as W&B's runs table shows them: ``method.name``."""
    if isinstance(value, dict) and value:
        for key, sub in value.items():
            _flatten(f"{prefix}.{key}", sub, into)
    else:
        into[prefix] = value


def read_run(path: Path) -> OfflineRun:
    run = OfflineRun(path)
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.name, run.group, run.job_type = record.run.display_name, record.run.run_group, record.run.job_type
            run.project, run.tags = record.run.project, list(record.run.tags)
            for item in record.run.config.update:
                _config(run, item)
        elif kind == "config":
            for item in record.config.update:
                _config(run, item)
        elif kind == "history":
            run.history_keys.update(_key(item) for item in record.history.item if not _key(item).startswith("_"))
        elif kind == "summary":
            for item in record.summary.update:
                if not _key(item).startswith("_"):
                    _set(run.summary, item)
    return run


def _config(run: OfflineRun, item) -> None:
    key = _key(item)
    if key.startswith("_"):
        return
    _flatten(key, json.loads(item.value_json), run.config)


def run_files(folder: Path) -> list[Path]:
    """The offline run files under ``<folder>/wandb/`` (``latest-run`` is a link to one of them: left out)."""
    return sorted((folder / "wandb").glob("offline-run-*/run-*.wandb"))


def wait_until_written(run_dir: Path, timeout_s: float = 30.0) -> bool:
    """Wait until an offline run's file holds its ``exit`` record; False if it does not within ``timeout_s``.

    ``run.finish()`` can return before W&B's core process has flushed the run file (seen: 1 run in 25 with the CPUs
    busy, complete 50 ms later), so whoever reads a run right after logging it (the dashboard, the tests) would find
    it empty. Every run this package logs offline is waited for here."""
    deadline = time.monotonic() + timeout_s
    while True:
        files = sorted(run_dir.glob("run-*.wandb"))
        try:
            if files and any(r.WhichOneof("record_type") == "exit" for r in records(files[0])):
                return True
        except Exception:  # noqa: BLE001 - a half-written file: OSError, ValueError or protobuf's DecodeError
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def read_runs(folders: list[Path]) -> list[OfflineRun]:
    return [read_run(path) for folder in folders for path in run_files(folder)]


__all__ = ["OfflineRun", "read_run", "read_runs", "records", "run_files", "wait_until_written"]
