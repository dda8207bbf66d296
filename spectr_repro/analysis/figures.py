"""Ablation figures (block efficiency and speed-up vs K, vs L, vs T) and per-position acceptance.

Figures are drawn on matplotlib's Agg canvas through the object API (no pyplot state), so they work
the same headless, in tests and in a notebook, and are saved as PNG and SVG.

Points are the cells' summary values (the numbers in Table 1). Error bars are Table 1's 95 % bootstrap
intervals over prompts (``spectr_repro.analysis.stats``: BCa, 9999 resamples, seed 0; prompts resampled
within each cell when several cells make one point) of the same ratio-of-sums statistic computed from
the per-prompt records: block efficiency = Σ new_tokens / Σ target_calls, speed-up = Σ AR wall time /
Σ method wall time. Cells without records get no error bars. A cell whose speed-up is not comparable
(batched prompts, contention, offloaded weights; ``stats.speedup_exclusion``) is never drawn in a
speed-up panel.

Each ablation holds the other two axes at the pair's main setting (see ``tables.main_setting``);
single-draft methods (sd, bv, gbv) have no K axis and are drawn as dashed horizontal lines in the
K figure.

Every rule stays visible where values coincide (two rules with the same law, such as SBV and SBV-F on a
replay): each method has its own marker (and single-draft lines their own dash), and the methods of a panel
are spread a little along x (:func:`dodge`, a quarter of the spacing between x values at most). Legends sit
outside the axes, right of the panels, never over the data.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from spectr_repro.analysis.load import (
    DATASET_ORDER,
    METHOD_ORDER,
    SINGLE_DRAFT_METHODS,
    base_method,
    method_label,
    order_methods,
    ordered,
)
from spectr_repro.analysis.stats import LEVEL, RESAMPLES, ratio_of_sums
from spectr_repro.analysis.tables import (
    METRICS,
    Setting,
    cells_at,
    cells_interval,
    main_setting,
    metric_values,
    pair_cells_and_setting,
    records_by_cell,
)

AXES = {"K": "number of drafts K", "L": "draft length L", "temperature": "temperature T"}
AXIS_FILE_NAMES = {"K": "K", "L": "L", "temperature": "T"}
BOOTSTRAP_RESAMPLES = RESAMPLES
BOOTSTRAP_LEVEL = LEVEL
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">", "p"]
DASHES = ["--", "-.", ":", (0, (5, 1, 1, 1, 1, 1))]
DODGE_SHARE = 0.25  # the methods of a panel spread over this share of the smallest spacing between x values


def method_color(method: str) -> tuple:
    """A fixed colour per method across every figure."""
    base = base_method(method)
    if base != method:  # an option variant ("gbv[carry_over=False]"): a stable colour of its own
        return colormaps["tab20"](zlib.crc32(method.encode()) % 20)
    index = METHOD_ORDER.index(base) if base in METHOD_ORDER else len(METHOD_ORDER)
    return colormaps["tab10"](index % 10)


def _method_index(method: str) -> int:
    base = base_method(method)
    index = METHOD_ORDER.index(base) if base in METHOD_ORDER else len(METHOD_ORDER)
    return index if base == method else index + zlib.crc32(method.encode())  # a variant: a marker of its own


def method_marker(method: str) -> str:
    """A fixed marker per method across every figure, so that coinciding points stay distinguishable."""
    return MARKERS[_method_index(method) % len(MARKERS)]


def method_dash(method: str) -> str | tuple:
    """A fixed dash pattern per method for horizontal reference lines (single-draft methods in a K figure)."""
    return DASHES[_method_index(method) % len(DASHES)]


def dodge(index: int, count: int, x_values) -> float:
    """The x offset of the ``index``-th of ``count`` methods drawn in one panel: spread symmetrically over
    ``DODGE_SHARE`` of the smallest spacing between the distinct ``x_values`` (1 when there is one)."""
    if count < 2:
        return 0.0
    distinct = np.unique(np.asarray(list(x_values), dtype=float))
    spacing = float(np.diff(distinct).min()) if len(distinct) > 1 else 1.0
    return (index - (count - 1) / 2) * DODGE_SHARE * spacing / (count - 1)


def legend_outside(figure: Figure, axes) -> None:
    """One legend for the figure, right of the panels (off the data); duplicates across panels shown once."""
    entries: dict[str, object] = {}
    for ax in np.ravel(axes):
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    if entries:
        figure.legend(list(entries.values()), list(entries), loc="outside right upper", fontsize=8, frameon=False)


def ratio_interval(
    numerators,
    denominators,
    level: float = BOOTSTRAP_LEVEL,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(statistic, low, high): Σnum/Σden and its bootstrap interval over rows (``stats.ratio_of_sums``).

    Rows are prompts; resampling them keeps each prompt's numerator and denominator together. Fewer
    than two rows give NaN bounds.
    """
    interval = ratio_of_sums(numerators, denominators, level=level, resamples=resamples, seed=seed)
    return interval.estimate, interval.low, interval.high


def _error_bar(cells: pd.DataFrame, by_cell: dict, metric: str, centre: float) -> tuple[float, float]:
    """(below, above) half-widths around ``centre`` from the cells' bootstrap interval over prompts."""
    interval = cells_interval(cells, by_cell, metric, list(cells["dataset"].unique()))
    if np.isnan(interval["low"]):
        return np.nan, np.nan
    return max(centre - interval["low"], 0.0), max(interval["high"] - centre, 0.0)


def ablation_data(
    cells: pd.DataFrame, records: pd.DataFrame, model_pair: str, axis: str, setting: Setting | None = None
) -> pd.DataFrame:
    """Long table for one ablation: dataset, method, value (of ``axis``), metric, mean, err_low, err_high,
    num_cells, num_prompts. AR is left out (it is 1 by definition on both metrics); so are speed-ups of
    cells that are not comparable (a point whose cells are all such has no speed-up row)."""
    if axis not in AXES:
        raise ValueError(f"axis must be one of {', '.join(AXES)}; got {axis!r}")
    pair_cells, setting = pair_cells_and_setting(cells, model_pair, setting)
    selected = cells_at(pair_cells, setting, vary=axis)
    selected = selected[selected["method"] != "ar"]
    by_cell = records_by_cell(records, selected)
    rows = []
    for (dataset, method, value), group in selected.groupby(["dataset", "method", axis]):
        for metric in METRICS:
            values = metric_values(group, metric)
            shown = group[values.notna()]
            if shown.empty:
                continue
            centre = float(values.mean())
            below, above = _error_bar(shown, by_cell, metric, centre)
            keys = zip(shown["experiment"], shown["cell_id"])
            rows.append(
                {
                    "dataset": dataset,
                    "method": method,
                    "value": value,
                    "metric": metric,
                    "mean": centre,
                    "err_low": below,
                    "err_high": above,
                    "num_cells": len(shown),
                    "num_prompts": sum(len(by_cell[key]) for key in keys if key in by_cell),
                }
            )
    return pd.DataFrame(
        rows,
        columns=[
            "dataset",
            "method",
            "value",
            "metric",
            "mean",
            "err_low",
            "err_high",
            "num_cells",
            "num_prompts",
        ],
    )


def _swept_datasets(data: pd.DataFrame) -> list[str]:
    counts = data.groupby(["dataset", "method"])["value"].nunique()
    swept = counts[counts >= 2].reset_index()["dataset"]
    return ordered(swept, DATASET_ORDER)


def _new_figure(rows: int, cols: int, width: float = 4.2, height: float = 3.0) -> Figure:
    figure = Figure(figsize=(width * cols, height * rows), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def plot_ablation(data: pd.DataFrame, axis: str, title: str = "") -> Figure | None:
    """Rows datasets that sweep ``axis``, columns BE and speed-up; one line per method.

    None when no method varies ``axis`` in ``data``.
    """
    datasets = _swept_datasets(data) if not data.empty else []
    if not datasets:
        return None
    figure = _new_figure(len(datasets), len(METRICS))
    grid = figure.subplots(len(datasets), len(METRICS), squeeze=False)
    for row, dataset in enumerate(datasets):
        for col, (metric, metric_title) in enumerate(METRICS.items()):
            ax = grid[row][col]
            subset = data[(data["dataset"] == dataset) & (data["metric"] == metric)]
            methods = order_methods(subset["method"])
            for index, method in enumerate(methods):
                line = subset[subset["method"] == method].sort_values("value")
                label = method_label(method)
                if axis == "K" and base_method(method) in SINGLE_DRAFT_METHODS and len(line) == 1:
                    ax.axhline(
                        line["mean"].iloc[0],
                        color=method_color(method),
                        linestyle=method_dash(method),
                        linewidth=1.2,
                        label=f"{label} (K={int(line['value'].iloc[0])})",
                    )
                    continue
                errors = np.vstack([line["err_low"].to_numpy(), line["err_high"].to_numpy()])
                ax.errorbar(
                    line["value"].to_numpy(float) + dodge(index, len(methods), subset["value"]),
                    line["mean"],
                    yerr=None if np.isnan(errors).all() else errors,
                    marker=method_marker(method),
                    markersize=4,
                    capsize=3,
                    color=method_color(method),
                    label=label,
                )
            if metric == "speedup":
                ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
            ax.set_xlabel(AXES[axis])
            ax.set_ylabel(metric_title)
            ax.set_title(dataset, fontsize=10)
            ax.grid(alpha=0.3)
            if axis in ("K", "L"):
                ax.xaxis.get_major_locator().set_params(integer=True)
    legend_outside(figure, grid)
    if title:
        figure.suptitle(title, fontsize=11)
    return figure


def acceptance_data(cells: pd.DataFrame, model_pair: str, setting: Setting | None = None) -> pd.DataFrame:
    """Long table: dataset, method, position (1-based), acceptance (P(accepted | reached)), averaged
    over cells at the main setting."""
    pair_cells, setting = pair_cells_and_setting(cells, model_pair, setting)
    selected = cells_at(pair_cells, setting)
    rows = []
    for _, cell in selected[selected["method"] != "ar"].iterrows():
        values = cell["acceptance_by_position"]
        if not isinstance(values, list | tuple) or not values:
            continue
        for position, value in enumerate(values, 1):
            rows.append(
                {
                    "dataset": cell["dataset"],
                    "method": cell["method"],
                    "position": position,
                    "acceptance": np.nan if value is None else float(value),
                }
            )
    frame = pd.DataFrame(rows, columns=["dataset", "method", "position", "acceptance"])
    return frame.groupby(["dataset", "method", "position"], as_index=False)["acceptance"].mean()


def plot_acceptance(data: pd.DataFrame, title: str = "") -> Figure | None:
    """One panel per dataset, one line per method: acceptance probability at each draft position."""
    if data.empty:
        return None
    datasets = ordered(data["dataset"], DATASET_ORDER)
    cols = min(len(datasets), 3)
    rows = -(-len(datasets) // cols)
    figure = _new_figure(rows, cols)
    grid = figure.subplots(rows, cols, squeeze=False)
    for index, dataset in enumerate(datasets):
        ax = grid[index // cols][index % cols]
        subset = data[data["dataset"] == dataset]
        methods = order_methods(subset["method"])
        for index, method in enumerate(methods):
            line = subset[subset["method"] == method].sort_values("position")
            ax.plot(
                line["position"].to_numpy(float) + dodge(index, len(methods), subset["position"]),
                line["acceptance"],
                marker=method_marker(method),
                markersize=3,
                color=method_color(method),
                label=method_label(method),
            )
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("draft position i")
        ax.set_ylabel("P(accepted | reached)")
        ax.set_title(dataset, fontsize=10)
        ax.grid(alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
    for index in range(len(datasets), rows * cols):
        grid[index // cols][index % cols].set_visible(False)
    legend_outside(figure, grid)
    if title:
        figure.suptitle(title, fontsize=11)
    return figure


def save_figure(figure: Figure, stem: str | Path) -> list[Path]:
    """Write ``stem``.png (150 dpi) and ``stem``.svg; returns both paths."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    # Pair names contain dots (qwen25coder_1.5b_0.5b): append suffixes, never Path.with_suffix.
    paths = [stem.parent / f"{stem.name}.png", stem.parent / f"{stem.name}.svg"]
    figure.savefig(paths[0], dpi=150)
    figure.savefig(paths[1])
    return paths


def make_figures(
    cells: pd.DataFrame,
    records: pd.DataFrame,
    model_pair: str,
    out_dir: str | Path,
    setting: Setting | None = None,
) -> dict[str, list[Path]]:
    """Every figure for one pair: keys "ablation_K", "ablation_L", "ablation_T", "acceptance" (only
    those the results allow); values the written PNG and SVG paths."""
    out_dir = Path(out_dir)
    pair_cells = cells[cells["model_pair"] == model_pair]
    setting = setting or main_setting(pair_cells)
    written: dict[str, list[Path]] = {}
    for axis in AXES:
        data = ablation_data(cells, records, model_pair, axis, setting)
        name = f"ablation_{AXIS_FILE_NAMES[axis]}"
        figure = plot_ablation(data, axis, title=f"{model_pair}: {AXES[axis]} varied, others at {setting}")
        if figure is not None:
            written[name] = save_figure(figure, out_dir / f"{name}_{model_pair}")
    figure = plot_acceptance(
        acceptance_data(cells, model_pair, setting),
        title=f"{model_pair}: per-position acceptance at {setting}",
    )
    if figure is not None:
        written["acceptance"] = save_figure(figure, out_dir / f"acceptance_{model_pair}")
    return written
