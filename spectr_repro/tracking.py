"""Weights & Biases logging: one W&B run per finished cell, grouped by experiment.

Offline by default (``logger=wandb_offline``): runs are written under
``<output_dir>/<experiment>/wandb/`` and nothing touches the network; upload later with
``wandb sync <output_dir>/<experiment>/wandb/offline-run-*``. ``logger=wandb_online`` logs live
(needs ``wandb login``), ``logger=disabled`` logs nothing (records are written either way).

Each run has config = the resolved cell config, summary = the cell's metrics, and a table of
per-prompt records (key ``records``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from spectr_repro.records import table_columns

# Per-prompt columns shown in the W&B table: the record schema minus the long per-iteration lists
# (kept in records.jsonl only).
TABLE_COLUMNS = tuple(table_columns())


def enabled(logger_cfg: DictConfig) -> bool:
    return logger_cfg.get("backend") == "wandb" and logger_cfg.get("mode") in ("offline", "online")


def prepare(logger_cfg: DictConfig) -> None:
    """Before any run: in offline mode make sure W&B cannot reach the network."""
    if enabled(logger_cfg) and logger_cfg.mode == "offline":
        os.environ["WANDB_MODE"] = "offline"
        os.environ.setdefault("WANDB_SILENT", "true")


def log_cell(logger_cfg: DictConfig, run_root: Path, experiment: str, cell_id: str,
             config: dict[str, Any], summary: dict[str, Any], records: list[dict[str, Any]]) -> Path | None:
    """Log one finished cell as a W&B run; returns the run folder (None when logging is off)."""
    if not enabled(logger_cfg):
        return None
    import wandb

    prepare(logger_cfg)
    run_root.mkdir(parents=True, exist_ok=True)
    run = wandb.init(
        project=logger_cfg.get("project") or "spectr_repro",
        entity=logger_cfg.get("entity"),
        group=experiment,
        job_type=str(summary.get("method")),
        name=cell_id,
        config=config,
        dir=str(run_root),
        mode=logger_cfg.mode,
        settings=wandb.Settings(console="off", silent=True, x_disable_stats=True, x_disable_meta=True),
        reinit="finish_previous",
    )
    try:
        table = wandb.Table(columns=list(TABLE_COLUMNS),
                            data=[[record.get(c) for c in TABLE_COLUMNS] for record in records])
        run.log({"records": table})
        for key, value in summary.items():
            if isinstance(value, int | float | str | bool) or value is None:
                run.summary[key] = value
            elif isinstance(value, dict):
                for sub_key, sub_value in value.items():
                    run.summary[f"{key}/{sub_key}"] = sub_value
            elif isinstance(value, list):
                run.summary[key] = value
        run_dir = Path(run.dir).parent  # .../wandb/offline-run-<time>-<id>/files -> the run folder
    finally:
        run.finish()
    return run_dir


__all__ = ["TABLE_COLUMNS", "enabled", "log_cell", "prepare"]
