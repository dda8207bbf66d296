"""One W&B run per command: ``log_command(command, logger, folder, tables=..., results=...)``.

The cells' conventions (``tracking.conventions``) for every command that decides something: ``group`` = the
results folder's name (the experiment for replay, bias and report; ``check``, ``theory``, ``audit``, ``bench`` for
theirs), ``job_type`` = the command, ``config`` = its settings at the top level, tags ``command:<name>`` and
``experiment:<group>``, offline by default under ``<folder>/wandb/``, W&B's environment variables winning. Each
table becomes a W&B table ``<command>/<name>``, each image ``<command>/figures/<stem>``, and ``tracking.names``
adds the scalars and curves the dashboard plots. A new command is one call.

Logging never ends a command: the results are on disk already, so a W&B failure is one warning on stderr.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from spectr_repro.tracking.conventions import SETTINGS, LoggerSettings, destination, enabled, mode, prepare, written
from spectr_repro.tracking.names import derive


def read_tables(tables: Mapping[str, pd.DataFrame | str | Path | None]) -> dict[str, pd.DataFrame]:
    """Frames as given, CSV paths read (a missing or empty file, one without columns, or None, is left out)."""
    frames = {}
    for name, table in tables.items():
        if isinstance(table, pd.DataFrame):
            frames[name] = table
        elif table is not None and Path(table).is_file() and Path(table).stat().st_size:
            try:
                frames[name] = pd.read_csv(table)
            except pd.errors.EmptyDataError:  # a table with no columns (e.g. quality.csv without scored cells)
                continue
    return frames


def top_level_config(settings: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Several groups' settings as one config: a key with one value across them keeps it, else the list of its
    values (a replay over two datasets: ``dataset: [gsm8k, humaneval]``), so K, L, T... stay top-level keys."""
    merged: dict[str, list] = {}
    for item in settings:
        for key, value in item.items():
            values = merged.setdefault(key, [])
            if value not in values:
                values.append(value)
    return {key: values[0] if len(values) == 1 else values for key, values in merged.items()}


def tables_in(results: Mapping[str, Any], prefix: str = "") -> dict[str, pd.DataFrame]:
    """Every list of records in a command's result (check's items, the audit's rows, bench's methods per pair) as a
    table named by its path (``methods/<pair>``)."""
    found = {}
    for key, value in results.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            found.update(tables_in(value, f"{name}/"))
        elif isinstance(value, list) and value and all(isinstance(item, Mapping) for item in value):
            found[name] = pd.DataFrame(list(value))
    return found


def _cell(value: Any) -> Any:
    """A value a W&B table holds: lists and dicts as JSON text, NaN as None."""
    if isinstance(value, list | tuple | dict):
        return json.dumps(value, default=str)
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def wandb_table(frame: pd.DataFrame):
    import wandb  # wandb: heavy optional (~0.5 s); only a run that logs to W&B pays for it

    # mixed types allowed: a CSV column may hold numbers and text (an interval, "-"), which W&B would refuse
    return wandb.Table(columns=[str(c) for c in frame.columns], allow_mixed_types=True,
                       data=[[_cell(v) for v in row] for row in frame.itertuples(index=False)])


def log_command(command: str, logger: LoggerSettings, folder: str | Path,
                tables: Mapping[str, pd.DataFrame | str | Path | None] | None = None,
                results: Mapping[str, Any] | None = None, config: Mapping[str, Any] | None = None,
                images: Iterable[str | Path] = (), group: str | None = None) -> Path | None:
    """Log one command's results as a W&B run under ``<folder>/wandb/``; returns the run folder (None when logging
    is off or failed: a warning on stderr, never an exception)."""
    if not enabled(logger):
        return None
    try:
        return _log(command, logger, Path(folder), read_tables(tables or {}), dict(results or {}),
                    dict(config or {}), [Path(p) for p in images], group or Path(folder).resolve().name)
    except Exception as error:  # the results are on disk; a tracker hiccup must not fail the command
        print(f"warning: W&B logging of {command} failed: {type(error).__name__}: {error}", file=sys.stderr)
        return None


def _log(command: str, logger: LoggerSettings, folder: Path, frames: dict[str, pd.DataFrame],
         results: dict[str, Any], config: dict[str, Any], images: list[Path], group: str) -> Path:
    import wandb  # wandb: heavy optional (~0.5 s); only a run that logs to W&B pays for it

    prepare(logger)
    folder.mkdir(parents=True, exist_ok=True)
    project, entity = destination(logger)
    frames = {**tables_in(results), **frames}
    derived = derive(command, frames, results)
    run = wandb.init(project=project, entity=entity, group=group, job_type=command, name=f"{command}-{group}",
                     tags=[f"command:{command}"[:64], f"experiment:{group}"[:64]], config=config, dir=str(folder),
                     mode=mode(logger), settings=wandb.Settings(**SETTINGS), reinit="finish_previous")
    try:
        for x in dict.fromkeys(derived.x_axes.values()):
            run.define_metric(x)
        for pattern, x in derived.x_axes.items():
            run.define_metric(pattern, step_metric=x)
        logged: dict[str, Any] = {f"{command}/{name}": wandb_table(frame) for name, frame in frames.items()}
        logged.update({f"{command}/figures/{path.stem}": wandb.Image(str(path)) for path in images if path.is_file()})
        if logged:
            run.log(logged)
        for row in derived.history:
            run.log(row)
        for key, value in derived.summary.items():
            run.summary[key] = value
        run_dir = Path(run.dir).parent
    finally:
        run.finish()
    print(f"W&B {mode(logger)} run of {command}: {run_dir}", file=sys.stderr)
    return written(run_dir, logger)


__all__ = ["log_command", "read_tables", "tables_in", "top_level_config", "wandb_table"]
