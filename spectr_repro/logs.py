"""Logging for the command line: messages go through ``logging`` to stderr via ``tqdm.write``, so they
never tear a progress bar. Results (tables, paths) are printed to stdout; messages are logged.

    import logging
    log = logging.getLogger(__name__)
    log.info("skip %s: finished earlier", cell_id)

``SPECTR_REPRO_LOG_LEVEL`` (DEBUG, INFO, WARNING, ...) sets the level; INFO by default.
"""

from __future__ import annotations

import logging
import os
import sys

from tqdm.auto import tqdm

LEVEL_ENV_VAR = "SPECTR_REPRO_LOG_LEVEL"


class TqdmHandler(logging.Handler):
    """Writes records with ``tqdm.write`` (above any live progress bar) to stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # logging must never take the run down
            self.handleError(record)


class _Format(logging.Formatter):
    """``message`` for INFO, ``warning: message`` / ``error: message`` above it (the CLI's house style)."""

    def format(self, record: logging.LogRecord) -> str:
        message = super().format(record)
        return message if record.levelno <= logging.INFO else f"{record.levelname.lower()}: {message}"


def setup_logging(level: str | int | None = None) -> None:
    """Route the package's loggers to stderr through tqdm (idempotent)."""
    logger = logging.getLogger("spectr_repro")
    level = level or os.environ.get(LEVEL_ENV_VAR, "INFO")
    logger.setLevel(level if isinstance(level, int) else str(level).upper())
    if not any(isinstance(h, TqdmHandler) for h in logger.handlers):
        handler = TqdmHandler()
        handler.setFormatter(_Format("%(message)s"))
        logger.addHandler(handler)
    logger.propagate = False


def format_duration(seconds: float) -> str:
    """A duration as a command prints it: seconds, minutes, hours or days, whichever reads best."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


__all__ = ["LEVEL_ENV_VAR", "TqdmHandler", "format_duration", "setup_logging"]
