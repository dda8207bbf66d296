"""Table 1 of the paper, regenerated per model pair: rows methods, columns datasets + average.

Two metrics, as in the paper: block efficiency (tokens per target call, AR = 1.00) and speed-up
(AR wall time / method wall time on the same prompts). Each of our numbers is set beside the
paper's where the paper gives one, with the difference ours − paper; cells the paper does not give
stay blank. Written as Markdown, CSV (long form, one row per method × dataset × metric) and LaTeX.

Which cells form the table: the "main setting" (K, L, T) of the pair, inferred from the cells (the
most common L and T, then the most common K among multi-draft methods; ties go to the value closest
to the paper's K=3, L=12, T=0.4) or given explicitly. Single-draft methods (sd, bv, gbv) enter at
K=1, AR at any K/L. Several cells at the same setting (seeds, repeated experiments) are averaged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from spectr_repro.analysis.load import (
    DATASET_ORDER,
    SINGLE_DRAFT_METHODS,
    base_method,
    method_label,
    order_methods,
    ordered,
)
from spectr_repro.analysis.paper import paper_table

METRICS = {"block_efficiency": "Block efficiency", "speedup": "Speed-up vs AR"}
PAPER_MAIN = {"K": 3, "L": 12, "temperature": 0.4}
AVERAGE = "average"


@dataclass(frozen=True)
class Setting:
    """The main setting of a table: number of drafts K, draft length L, temperature."""

    K: int
    L: int
    temperature: float

    def __str__(self) -> str:
        return f"K={self.K}, L={self.L}, T={self.temperature:g}"


def _mode(values: pd.Series, closest_to: float):
    counts = values.value_counts()
    best = counts[counts == counts.max()].index
    return min(best, key=lambda v: (abs(float(v) - closest_to), float(v)))


def main_setting(cells: pd.DataFrame) -> Setting:
    """Infer the main setting of one model pair's cells (see module docstring)."""
    speculative = cells[cells["method"] != "ar"]
    if speculative.empty:
        raise ValueError("no speculative cells to infer a main setting from (only AR)")
    temperature = float(_mode(speculative["temperature"], PAPER_MAIN["temperature"]))
    at_t = speculative[speculative["temperature"] == temperature]
    length = int(_mode(at_t["L"], PAPER_MAIN["L"]))
    multi = at_t[(at_t["L"] == length) & ~at_t["method"].map(base_method).isin(SINGLE_DRAFT_METHODS)]
    drafts = int(_mode(multi["K"], PAPER_MAIN["K"])) if not multi.empty else 1
    return Setting(K=drafts, L=length, temperature=temperature)


def pair_cells_and_setting(
    cells: pd.DataFrame, model_pair: str, setting: Setting | None = None
) -> tuple[pd.DataFrame, Setting]:
    """The cells of ``model_pair`` (ValueError if none) and ``setting`` or, by default, their main setting."""
    pair_cells = cells[cells["model_pair"] == model_pair]
    if pair_cells.empty:
        raise ValueError(f"no cells for model pair {model_pair!r}")
    return pair_cells, setting or main_setting(pair_cells)


def cells_at(cells: pd.DataFrame, setting: Setting, vary: str | None = None) -> pd.DataFrame:
    """Cells at ``setting``; with ``vary`` in {"K", "L", "temperature"} that axis is left free.

    AR matches on temperature only; single-draft methods match K=1 instead of ``setting.K``.
    """
    if vary not in (None, "K", "L", "temperature"):
        raise ValueError(f"vary must be one of None, 'K', 'L', 'temperature'; got {vary!r}")
    is_ar = cells["method"] == "ar"
    single = cells["method"].map(base_method).isin(SINGLE_DRAFT_METHODS)
    keep = pd.Series(True, index=cells.index)
    if vary != "temperature":
        keep &= cells["temperature"] == setting.temperature
    if vary != "L":
        keep &= is_ar | (cells["L"] == setting.L)
    if vary != "K":
        keep &= is_ar | (single & (cells["K"] == 1)) | (~single & (cells["K"] == setting.K))
    return cells[keep]


def table1(cells: pd.DataFrame, model_pair: str, metric: str, setting: Setting | None = None) -> pd.DataFrame:
    """Our Table 1 for one pair and metric: index methods, columns datasets + ``average``.

    The average is the mean over the table's datasets, given only for methods that have every one
    of them (an average over fewer datasets would not be comparable).
    """
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}")
    pair_cells, setting = pair_cells_and_setting(cells, model_pair, setting)
    selected = cells_at(pair_cells, setting)
    wide = selected.pivot_table(index="method", columns="dataset", values=metric, aggfunc="mean")
    wide = wide.reindex(index=order_methods(wide.index), columns=ordered(wide.columns, DATASET_ORDER))
    wide[AVERAGE] = wide.mean(axis=1).where(wide.notna().all(axis=1))
    wide.index.name, wide.columns.name = "method", "dataset"
    return wide


def _long(wide: pd.DataFrame, name: str) -> pd.DataFrame:
    """Rows methods × columns datasets -> columns method, dataset, ``name`` (NaN cells kept)."""
    frame = wide.copy()
    frame.index.name, frame.columns.name = "method", None
    return frame.reset_index().melt(id_vars="method", var_name="dataset", value_name=name)


def compare_with_paper(ours: pd.DataFrame, paper: pd.DataFrame, model_pair: str, metric: str) -> pd.DataFrame:
    """Long form: method, dataset, ours, paper, diff (= ours − paper; NaN where either is missing).

    Paper-only cells (e.g. a method we did not run) are kept, with ``ours`` NaN.
    """
    theirs = paper_table(paper, model_pair, metric)
    ours_long = _long(ours, "ours")
    if theirs.empty:
        ours_long["paper"] = math.nan
    else:
        theirs_long = _long(theirs, "paper").dropna(subset=["paper"])
        ours_long = ours_long.merge(theirs_long, on=["method", "dataset"], how="outer")
    ours_long["diff"] = ours_long["ours"] - ours_long["paper"]
    ours_long.insert(0, "metric", metric)
    ours_long.insert(0, "model_pair", model_pair)
    methods = order_methods(ours_long["method"])
    datasets = ordered(ours_long["dataset"], DATASET_ORDER + [AVERAGE])
    ours_long["_m"] = ours_long["method"].map(methods.index)
    ours_long["_d"] = ours_long["dataset"].map(datasets.index)
    return ours_long.sort_values(["_m", "_d"]).drop(columns=["_m", "_d"]).reset_index(drop=True)


def _fmt(value: float, metric: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{value:.2f}×" if metric == "speedup" else f"{value:.2f}"


def _cell_text(ours: float, paper: float, metric: str, latex: bool = False) -> str:
    text = _fmt(ours, metric)
    if not math.isnan(paper):
        diff = "" if math.isnan(ours) else f", Δ {ours - paper:+.2f}"
        text = f"{text} (paper {_fmt(paper, metric)}{diff})".strip()
    if latex:
        text = text.replace("×", r"$\times$").replace("Δ", r"$\Delta$")
    return text


def _latex_escape(text: str) -> str:
    return (
        str(text)
        .replace("\\", r"\textbackslash{}")
        .replace("_", r"\_")
        .replace("%", r"\%")
        .replace("&", r"\&")
    )


def display_table(comparison: pd.DataFrame, latex: bool = False) -> pd.DataFrame:
    """Wide table of strings, "ours (paper X, Δ d)"; rows method labels, columns dataset names."""
    if comparison.empty:
        return pd.DataFrame()
    metric = comparison["metric"].iloc[0]
    comparison = comparison.assign(
        text=[_cell_text(o, p, metric, latex) for o, p in zip(comparison["ours"], comparison["paper"])]
    )
    wide = comparison.pivot(index="method", columns="dataset", values="text").fillna("")
    wide = wide.reindex(
        index=order_methods(wide.index), columns=ordered(wide.columns, DATASET_ORDER + [AVERAGE])
    )
    wide.index = [method_label(m) for m in wide.index]
    wide.index.name = "method"
    wide.columns.name = None
    return wide


@dataclass
class Table1:
    """Table 1 of one model pair: the setting, the long comparison and the written files."""

    model_pair: str
    setting: Setting
    comparison: pd.DataFrame  # long: model_pair, metric, method, dataset, ours, paper, diff
    markdown: str
    paths: dict[str, Path]


def build_table1(
    cells: pd.DataFrame,
    paper: pd.DataFrame,
    model_pair: str,
    out_dir: str | Path,
    setting: Setting | None = None,
) -> Table1:
    """Table 1 for ``model_pair`` (both metrics), written to ``out_dir`` as .md, .csv and .tex."""
    out_dir = Path(out_dir)
    pair_cells = cells[cells["model_pair"] == model_pair]
    if pair_cells.empty:
        raise ValueError(f"no cells for model pair {model_pair!r}")
    setting = setting or main_setting(pair_cells)
    comparisons, markdown_parts, latex_parts = [], [], []
    for metric, title in METRICS.items():
        comparison = compare_with_paper(table1(cells, model_pair, metric, setting), paper, model_pair, metric)
        comparisons.append(comparison)
        markdown_parts.append(
            f"**{title}** ({model_pair}, {setting})\n\n"
            + display_table(comparison).to_markdown(disable_numparse=True)
            + "\n"
        )
        latex_table = display_table(comparison, latex=True)
        latex_table.index = [_latex_escape(name) for name in latex_table.index]  # "GBV[carry_over=False]"
        latex_table.columns = [_latex_escape(name) for name in latex_table.columns]
        latex = latex_table.to_latex(
            caption=f"{title}, {model_pair.replace('_', ' ')}, {setting}; paper values in parentheses.",
            label=f"tab:{metric}-{model_pair}".replace(".", "-"),
        )
        latex_parts.append(latex)
    comparison = pd.concat(comparisons, ignore_index=True)
    comparison.insert(2, "K", setting.K)
    comparison.insert(3, "L", setting.L)
    comparison.insert(4, "temperature", setting.temperature)
    markdown = "\n".join(markdown_parts)
    out_dir.mkdir(parents=True, exist_ok=True)
    # Pair names contain dots (qwen25coder_1.5b_0.5b): append suffixes, never Path.with_suffix.
    paths = {suffix: out_dir / f"table1_{model_pair}.{suffix}" for suffix in ("md", "csv", "tex")}
    paths["md"].write_text(markdown, encoding="utf-8")
    comparison.to_csv(paths["csv"], index=False, float_format="%.4f")
    paths["tex"].write_text("\n".join(latex_parts), encoding="utf-8")
    return Table1(
        model_pair=model_pair, setting=setting, comparison=comparison, markdown=markdown, paths=paths
    )
