"""W&B's conventions, in one place: mode, destination, tags, and one run per finished cell.

Offline by default (``logger=wandb_offline``): runs are written under ``<output_dir>/<experiment>/wandb/``
and nothing touches the network; upload later with ``wandb sync <output_dir>/<experiment>/wandb/offline-run-*``.
``logger=wandb_online`` logs live (needs ``wandb login``), ``logger=disabled`` logs nothing (records are
written either way).

W&B's environment variables win over the logger config's defaults, as W&B users expect: ``WANDB_PROJECT``
and ``WANDB_ENTITY`` choose where runs go (the config's ``project``/``entity`` only when set there and the
variable is not), ``WANDB_MODE`` (online, offline, disabled) overrides the logger's mode and is never
overwritten, ``WANDB_DIR`` is left to W&B.

Every run of every command (``spectr_repro.tracking.runs.log_command``) follows the same rules; a cell's run
(:func:`log_cell`): ``group`` = experiment, ``job_type`` = method, tags = model pair, dataset and method, config = the
cell's resolved config (K, L, temperature, ... at the top level, so a reviewer can open one project and
filter or group by method, K, L, T, dataset), summary = the cell's metrics (the record schema), a table of
per-prompt records (``records``) and the acceptance by draft position as a line chart
(``acceptance_by_position``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from spectr_repro.conf import conf_dir
from spectr_repro.records import flatten_numbers, table_columns
from spectr_repro.settings import LoggerSettings, logger_settings
from spectr_repro.tracking.offline import wait_until_written

# Per-prompt columns shown in the W&B table: the record schema minus the long per-iteration lists
# (kept in records.jsonl only).
TABLE_COLUMNS = tuple(table_columns())
DEFAULT_PROJECT = "spectr_repro"
MODES = ("online", "offline", "disabled")
LOGGERS = ("wandb_offline", "wandb_online", "disabled")  # conf/logger/<name>.yaml
DEFAULT_LOGGER = "wandb_offline"  # conf/config.yaml's default: offline, nothing reaches the network
SETTINGS = {"console": "off", "silent": True, "x_disable_stats": True, "x_disable_meta": True}


def mode(logger: LoggerSettings) -> str:
    """The effective mode: ``WANDB_MODE`` when set (W&B's convention), else the logger's."""
    return os.environ.get("WANDB_MODE") or logger.mode


def enabled(logger: LoggerSettings) -> bool:
    return logger.backend == "wandb" and mode(logger) in ("offline", "online")


def prepare(logger: LoggerSettings) -> None:
    """Before any run: offline logging must not reach the network (WANDB_MODE set only when unset)."""
    if enabled(logger) and mode(logger) == "offline":
        os.environ.setdefault("WANDB_MODE", "offline")
        os.environ.setdefault("WANDB_SILENT", "true")


def destination(logger: LoggerSettings) -> tuple[str, str | None]:
    """(project, entity): W&B's environment variables first, then the logger's, then the default project."""
    project = os.environ.get("WANDB_PROJECT") or logger.project or DEFAULT_PROJECT
    entity = os.environ.get("WANDB_ENTITY") or logger.entity
    return str(project), (str(entity) if entity else None)


def run_tags(summary: dict[str, Any]) -> list[str]:
    tags = [f"pair:{summary.get('model_pair')}", f"dataset:{summary.get('dataset')}",
            f"method:{summary.get('method')}"]
    return [tag[:64] for tag in tags]  # W&B limits tags to 64 characters


def logger_config(name: str = DEFAULT_LOGGER) -> LoggerSettings:
    """The logger group's ``conf/logger/<name>.yaml`` (for the commands without Hydra: report, theory, audit, bench,
    dashboard). ValueError naming the choices for an unknown name."""
    if name not in LOGGERS:
        raise ValueError(f"unknown logger {name!r}: one of {', '.join(LOGGERS)}")
    return logger_settings(OmegaConf.load(conf_dir() / "logger" / f"{name}.yaml"))


def add_logger_option(parser) -> None:
    """``--logger`` for an argparse command, with the same choices and default as ``logger=`` of the Hydra ones."""
    parser.add_argument("--logger", default=DEFAULT_LOGGER, choices=LOGGERS,
                        help=f"W&B logging (default {DEFAULT_LOGGER}: a run under the output folder's wandb/, no "
                             f"network; WANDB_MODE wins)")


def logger_from_argv(argv) -> LoggerSettings:
    """The logger of a Hydra-style command line (``logger=<name>``; the default when absent)."""
    names = [a.split("=", 1)[1] for a in argv if a.lstrip("+").startswith("logger=")]
    return logger_config(names[-1] if names else DEFAULT_LOGGER)


def log_cell(logger: LoggerSettings, run_root: Path, experiment: str, cell_id: str,
             config: dict[str, Any], summary: dict[str, Any], records: list[dict[str, Any]]) -> Path | None:
    """Log one finished cell as a W&B run; returns the run folder (None when logging is off)."""
    if not enabled(logger):
        return None
    import wandb  # wandb: heavy optional (~0.5 s); only a run that logs to W&B pays for it

    prepare(logger)
    run_root.mkdir(parents=True, exist_ok=True)
    project, entity = destination(logger)
    run = wandb.init(
        project=project,
        entity=entity,
        group=experiment,
        job_type=str(summary.get("method")),
        name=cell_id,
        tags=run_tags(summary),
        config=config,
        dir=str(run_root),
        mode=mode(logger),
        settings=wandb.Settings(**SETTINGS),
        reinit="finish_previous",
    )
    try:
        table = wandb.Table(columns=list(TABLE_COLUMNS),
                            data=[[record.get(c) for c in TABLE_COLUMNS] for record in records])
        logged: dict[str, Any] = {"records": table}
        acceptance = [(i + 1, a) for i, a in enumerate(summary.get("acceptance_by_position") or []) if a is not None]
        if acceptance:
            points = wandb.Table(columns=["position", "acceptance"], data=[list(p) for p in acceptance])
            logged["acceptance_by_position"] = wandb.plot.line(
                points, "position", "acceptance", title=f"P(accept | reached) by draft position: {cell_id}")
        run.log(logged)
        for key, value in flatten_numbers(summary).items():
            run.summary[key] = value
        for position, value in acceptance:  # also as scalars, to filter and compare runs in the runs table
            run.summary[f"acceptance/position_{position}"] = value
        run_dir = Path(run.dir).parent  # .../wandb/offline-run-<time>-<id>/files -> the run folder
    finally:
        run.finish()
    return written(run_dir, logger)


def written(run_dir: Path, logger: LoggerSettings) -> Path:
    """The run folder once its offline file is on disk (``run.finish()`` may return before W&B's core flushes it);
    a warning, never an error, if it is not within the wait."""
    if mode(logger) == "offline" and not wait_until_written(run_dir):
        print(f"warning: W&B has not finished writing {run_dir} yet", file=sys.stderr)
    return run_dir


__all__ = ["DEFAULT_LOGGER", "DEFAULT_PROJECT", "LOGGERS", "SETTINGS", "TABLE_COLUMNS", "LoggerSettings",
           "add_logger_option", "destination", "enabled", "log_cell", "logger_config", "logger_from_argv",
           "logger_settings", "mode", "prepare", "run_tags", "written"]
