"""Weights & Biases: every command that decides something logs one run, with the cells' conventions.

- ``conventions``: mode, destination, tags, the logger configs, one run per finished cell (:func:`log_cell`);
- ``runs``: one run per command (:func:`log_command`: its tables, images, settings, and what ``names`` derives);
- ``names``: the metric names each command logs and the dashboard plots;
- ``offline``: reading offline runs back;
- ``dashboard``: ``python -m spectr_repro dashboard <results folder>``, the W&B workspace built from code.
"""

from spectr_repro.tracking.conventions import (
    DEFAULT_LOGGER,
    DEFAULT_PROJECT,
    LOGGERS,
    TABLE_COLUMNS,
    LoggerSettings,
    add_logger_option,
    destination,
    enabled,
    log_cell,
    logger_config,
    logger_from_argv,
    logger_settings,
    mode,
    prepare,
    run_tags,
)
from spectr_repro.tracking.runs import log_command, top_level_config

__all__ = ["DEFAULT_LOGGER", "DEFAULT_PROJECT", "LOGGERS", "TABLE_COLUMNS", "LoggerSettings", "add_logger_option",
           "destination", "enabled", "log_cell", "log_command", "logger_config", "logger_from_argv", "logger_settings",
           "mode", "prepare", "run_tags", "top_level_config"]
