"""Table 1 of the paper, regenerated per model pair: rows methods, columns datasets + average.

Two metrics, as in the paper: block efficiency (tokens per target call, AR = 1.00) and speed-up
(AR wall time / method wall time on the same prompts). Each of our numbers is set beside the
paper's where the paper gives one, with the difference ours − paper; cells the paper does not give
stay blank. Written as Markdown, CSV (long form, one row per method × dataset × metric) and LaTeX.

Which cells form the table: the "main setting" (K, L, T) of the pair, inferred from the cells (the
most common L and T, then the most common K among multi-draft methods; ties go to the value closest
to the paper's K=3, L=12, T=0.4) or given explicitly. Single-draft methods (sd, bv, gbv) enter at
K=1, AR at any K/L. Several cells at the same setting (seeds, repeated experiments) are averaged.

Uncertainty (``spectr_repro.analysis.stats``): with the records at hand each of our values carries a
95 % bootstrap interval over prompts, and the average column's interval resamples prompts within each
dataset. ``method_differences`` compares every method with SpecTr-GBV and with SD on the same prompts
(difference in block efficiency, ratio of speed-ups, paired intervals). A cell whose summary says its
wall times are no speed-up measurement (batched prompts, contention, offloaded weights:
``stats.speedup_exclusion``) never shows a speed-up: "n/c" and the reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from spectr_repro.analysis.format import AVERAGE, COMPARATORS, interval_text, methods_by_datasets, missing
from spectr_repro.analysis.load import (
    DATASET_ORDER,
    SINGLE_DRAFT_METHODS,
    base_method,
    method_label,
    order_methods,
    ordered,
)
from spectr_repro.analysis.stats import (
    MIN_PROMPTS_FOR_VERDICT,
    RESAMPLES,
    SEED,
    align_prompts,
    mean_of_ratios,
    paired_comparison,
    speedup_exclusion,
)
from spectr_repro.paper import paper_table

METRICS = {"block_efficiency": "Block efficiency", "speedup": "Speed-up vs AR"}
PAPER_MAIN = {"K": 3, "L": 12, "temperature": 0.4}
# Per-prompt record columns whose ratio of sums is each metric: (numerator, denominator).
RATIO_COLUMNS = {
    "block_efficiency": ("new_tokens", "target_calls"),
    "speedup": ("ar_wall_time_s", "wall_time_s"),
}
# How a comparison is made per metric, and the value meaning "no difference".
COMPARISON_KIND = {"block_efficiency": ("difference", 0.0), "speedup": ("ratio", 1.0)}
COMPARISON_TITLES = {"block_efficiency": "Δ block efficiency", "speedup": "Speed-up ratio"}
# A prompt in two cells of one setting is the same prompt when these agree.
PROMPT_KEYS = ["seed", "max_new_tokens", "prompt_id"]


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


def speedup_exclusions(cells: pd.DataFrame) -> pd.Series:
    """Per cell: why its speed-up is not comparable (see ``stats.speedup_exclusion``), else None."""
    return pd.Series([speedup_exclusion(row) for _, row in cells.iterrows()], index=cells.index, dtype=object)


def metric_values(cells: pd.DataFrame, metric: str) -> pd.Series:
    """The cells' values of ``metric``; NaN for speed-ups of cells whose wall times are not comparable."""
    values = pd.to_numeric(cells[metric], errors="coerce")
    if metric == "speedup":
        values = values.where(speedup_exclusions(cells).isna())
    return values


def table1(cells: pd.DataFrame, model_pair: str, metric: str, setting: Setting | None = None) -> pd.DataFrame:
    """Our Table 1 for one pair and metric: index methods, columns datasets + ``average``.

    The average is the mean over the table's datasets, given only for methods that have every one
    of them (an average over fewer datasets would not be comparable). Speed-ups of cells that are not
    comparable (batched, contention, offloaded) are left out; with none left the entry is NaN.
    """
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}")
    pair_cells, setting = pair_cells_and_setting(cells, model_pair, setting)
    selected = cells_at(pair_cells, setting)
    values = selected.assign(_value=metric_values(selected, metric))
    wide = methods_by_datasets(values, "_value", aggfunc="mean", labels=False, columns_name="dataset")
    wide[AVERAGE] = wide.mean(axis=1).where(wide.notna().all(axis=1))
    return wide


def _cell_keys(frame: pd.DataFrame) -> pd.Series:
    return pd.Series(list(zip(frame["experiment"], frame["cell_id"])), index=frame.index)


def records_by_cell(records: pd.DataFrame, cells: pd.DataFrame) -> dict[tuple, pd.DataFrame]:
    """(experiment, cell_id) -> that cell's records, for ``cells`` that have any."""
    if records is None or records.empty:
        return {}
    wanted = set(_cell_keys(cells))
    selected = records[_cell_keys(records).isin(wanted)]
    return {key: group for key, group in selected.groupby(["experiment", "cell_id"])}


def _ratio_stratum(records: pd.DataFrame, metric: str) -> tuple | None:
    numerator, denominator = RATIO_COLUMNS[metric]
    values = records[[numerator, denominator]].apply(pd.to_numeric, errors="coerce")
    if values.empty or values.isna().any().any():
        return None
    return values[numerator].to_numpy(), values[denominator].to_numpy()


def cells_interval(cells: pd.DataFrame, by_cell: dict, metric: str, datasets: list[str]) -> dict:
    """Interval of the mean over ``datasets`` of the mean over each dataset's cells (one stratum per
    cell, weight 1 / (datasets · cells of that dataset)); NaN bounds when a cell has no usable records."""
    strata, weights = [], []
    for dataset in datasets:
        group = cells[cells["dataset"] == dataset]
        for key in _cell_keys(group):
            stratum = _ratio_stratum(by_cell[key], metric) if key in by_cell else None
            if stratum is None:
                return {"low": math.nan, "high": math.nan, "interval": "none (no records)", "n_prompts": 0}
            strata.append(stratum)
            weights.append(1.0 / (len(datasets) * len(group)))
    interval = mean_of_ratios(strata, weights)
    return {"low": interval.low, "high": interval.high, "interval": interval.method, "n_prompts": interval.n}


def table1_intervals(
    cells: pd.DataFrame,
    records: pd.DataFrame,
    model_pair: str,
    metric: str,
    setting: Setting | None = None,
) -> pd.DataFrame:
    """Long form beside ``table1``: method, dataset, low, high, interval (its method), n_prompts, note.

    ``note`` is "n/c (<reason>)" where every cell of an entry has a speed-up that is not comparable.
    """
    pair_cells, setting = pair_cells_and_setting(cells, model_pair, setting)
    selected = cells_at(pair_cells, setting)
    selected = selected.assign(_reason=speedup_exclusions(selected) if metric == "speedup" else None)
    excluded, selected = selected[selected["_reason"].notna()], selected[selected["_reason"].isna()]
    by_cell = records_by_cell(records, selected)
    datasets = ordered(pd.concat([selected, excluded])["dataset"], DATASET_ORDER)
    rows = []
    for method in order_methods(pd.concat([selected, excluded])["method"]):
        mine, theirs = selected[selected["method"] == method], excluded[excluded["method"] == method]
        for dataset in datasets:
            here = mine[mine["dataset"] == dataset]
            if not here.empty:
                rows.append({"method": method, "dataset": dataset, "note": ""}
                            | cells_interval(here, by_cell, metric, [dataset]))
            elif (theirs["dataset"] == dataset).any():
                reason = ", ".join(sorted(set(theirs.loc[theirs["dataset"] == dataset, "_reason"])))
                rows.append({"method": method, "dataset": dataset, "note": f"n/c ({reason})"})
        if set(mine["dataset"]) == set(datasets):
            rows.append({"method": method, "dataset": AVERAGE, "note": ""}
                        | cells_interval(mine, by_cell, metric, datasets))
        elif not theirs.empty and set(mine["dataset"]) | set(theirs["dataset"]) == set(datasets):
            rows.append({"method": method, "dataset": AVERAGE, "note": "n/c (a dataset not comparable)"})
    columns = ["method", "dataset", "low", "high", "interval", "n_prompts", "note"]
    return pd.DataFrame(rows).reindex(columns=columns)


def _long(wide: pd.DataFrame, name: str) -> pd.DataFrame:
    """Rows methods × columns datasets -> columns method, dataset, ``name`` (NaN cells kept)."""
    frame = wide.copy()
    frame.index.name, frame.columns.name = "method", None
    return frame.reset_index().melt(id_vars="method", var_name="dataset", value_name=name)


def compare_with_paper(
    ours: pd.DataFrame,
    paper: pd.DataFrame,
    model_pair: str,
    metric: str,
    intervals: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Long form: method, dataset, ours, paper, diff (= ours − paper; NaN where either is missing).

    Paper-only cells (e.g. a method we did not run) are kept, with ``ours`` NaN. With ``intervals``
    (``table1_intervals``) the columns ours_low, ours_high, interval, n_prompts and note are added.
    """
    theirs = paper_table(paper, model_pair, metric)
    ours_long = _long(ours, "ours")
    if theirs.empty:
        ours_long["paper"] = math.nan
    else:
        theirs_long = _long(theirs, "paper").dropna(subset=["paper"])
        ours_long = ours_long.merge(theirs_long, on=["method", "dataset"], how="outer")
    ours_long["diff"] = ours_long["ours"] - ours_long["paper"]
    if intervals is not None:
        extra = intervals.rename(columns={"low": "ours_low", "high": "ours_high"})
        ours_long = ours_long.merge(extra, on=["method", "dataset"], how="left")
        ours_long["note"] = ours_long["note"].fillna("")
    ours_long.insert(0, "metric", metric)
    ours_long.insert(0, "model_pair", model_pair)
    methods = order_methods(ours_long["method"])
    datasets = ordered(ours_long["dataset"], DATASET_ORDER + [AVERAGE])
    ours_long["_m"] = ours_long["method"].map(methods.index)
    ours_long["_d"] = ours_long["dataset"].map(datasets.index)
    return ours_long.sort_values(["_m", "_d"]).drop(columns=["_m", "_d"]).reset_index(drop=True)


def _unit(metric: str) -> str:
    return "×" if metric == "speedup" else ""


def _cell_text(
    ours: float,
    paper: float,
    metric: str,
    low: float = math.nan,
    high: float = math.nan,
    note: str = "",
) -> str:
    text = note if note and missing(ours) else interval_text(ours, low, high, unit=_unit(metric))
    if not math.isnan(paper):
        diff = "" if math.isnan(ours) else f", Δ {ours - paper:+.2f}"
        text = f"{text} (paper {interval_text(paper, None, None, unit=_unit(metric))}{diff})".strip()
    return text


def display_table(comparison: pd.DataFrame) -> pd.DataFrame:
    """Wide table of strings, "ours [low, high] (paper X, Δ d)"; rows method labels, columns datasets.

    The interval appears where ``comparison`` has one (``compare_with_paper(..., intervals=)``); an
    entry that is not comparable shows its note ("n/c (batched)") instead of a number.
    """
    if comparison.empty:
        return pd.DataFrame()
    metric = comparison["metric"].iloc[0]
    absent = pd.Series(math.nan, index=comparison.index)
    low, high = comparison.get("ours_low", absent), comparison.get("ours_high", absent)
    notes = comparison.get("note", pd.Series("", index=comparison.index)).fillna("")
    comparison = comparison.assign(
        text=[
            _cell_text(o, p, metric, lo, hi, note)
            for o, p, lo, hi, note in zip(comparison["ours"], comparison["paper"], low, high, notes)
        ]
    )
    return methods_by_datasets(comparison, "text").fillna("")


def _latex_math(text: str) -> str:
    """× and Δ as LaTeX math (applied after pandas has escaped the text)."""
    return text.replace("×", r"$\times$").replace("Δ", r"$\Delta$")


def latex_table(comparison: pd.DataFrame, caption: str, label: str) -> str:
    """``display_table`` as a LaTeX table: pandas escapes the labels and entries ("GBV[carry_over=False]",
    "n/c (...)"), then × and Δ become math."""
    wide = display_table(comparison).rename_axis(None)
    return wide.to_latex(escape=True, formatters={column: _latex_math for column in wide.columns},
                         caption=caption, label=label)


@dataclass
class Table1:
    """Table 1 of one model pair: the setting, the long comparison and the written files."""

    model_pair: str
    setting: Setting
    comparison: pd.DataFrame  # long: model_pair, metric, method, dataset, ours, paper, diff (+ intervals)
    markdown: str
    paths: dict[str, Path]


def build_table1(
    cells: pd.DataFrame,
    paper: pd.DataFrame,
    model_pair: str,
    out_dir: str | Path,
    setting: Setting | None = None,
    records: pd.DataFrame | None = None,
) -> Table1:
    """Table 1 for ``model_pair`` (both metrics), written to ``out_dir`` as .md, .csv and .tex.

    With ``records`` every value carries its 95 % bootstrap interval over prompts."""
    out_dir = Path(out_dir)
    pair_cells = cells[cells["model_pair"] == model_pair]
    if pair_cells.empty:
        raise ValueError(f"no cells for model pair {model_pair!r}")
    setting = setting or main_setting(pair_cells)
    comparisons, markdown_parts, latex_parts = [], [], []
    for metric, title in METRICS.items():
        intervals = (
            table1_intervals(cells, records, model_pair, metric, setting) if records is not None else None
        )
        comparison = compare_with_paper(
            table1(cells, model_pair, metric, setting), paper, model_pair, metric, intervals
        )
        comparisons.append(comparison)
        markdown_parts.append(
            f"**{title}** ({model_pair}, {setting})\n\n"
            + display_table(comparison).to_markdown(disable_numparse=True)
            + "\n"
        )
        latex_parts.append(latex_table(
            comparison,
            caption=f"{title}, {model_pair.replace('_', ' ')}, {setting}; paper values in parentheses"
            + ("; 95\\% bootstrap intervals over prompts in brackets." if records is not None else "."),
            label=f"tab:{metric}-{model_pair}".replace(".", "-"),
        ))
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


# --------------------------------------------------------------------------------------------------
# Which differences are real: every method against SpecTr-GBV and against SD, prompt by prompt
# --------------------------------------------------------------------------------------------------

_DIFFERENCE_COLUMNS = [
    "model_pair", "comparator", "method", "dataset", "metric", "estimate", "low", "high", "null",
    "excludes_null", "real", "n_paired", "n_per_dataset", "n_method", "n_comparator", "interval", "note",
]


@dataclass
class _Pairing:
    """One entry of a comparison before its bootstrap: aligned strata, their weights, prompt counts."""

    strata: list[tuple]  # (num_a, den_a, num_b, den_b) per (seed, max_new_tokens) group
    weights: list[float]
    counts: dict[str, int]  # n_paired, n_per_dataset (the fewest paired prompts of a dataset), n_method, n_comparator
    note: str = ""  # "n/c (...)" when the entry is not comparable


def _pair_records(mine: pd.DataFrame, theirs: pd.DataFrame, metric: str) -> _Pairing:
    """Prompts of one dataset matched on PROMPT_KEYS; one stratum per (seed, max_new_tokens)."""
    numerator, denominator = RATIO_COLUMNS[metric]
    aligned = align_prompts(mine, theirs, PROMPT_KEYS, [numerator, denominator])
    counts = {  # prompts with this metric's records (batched prompts have no wall time, so no speed-up)
        "n_paired": len(aligned),
        "n_per_dataset": len(aligned),
        "n_method": len(mine.dropna(subset=[numerator, denominator]).drop_duplicates(PROMPT_KEYS)),
        "n_comparator": len(theirs.dropna(subset=[numerator, denominator]).drop_duplicates(PROMPT_KEYS)),
    }
    columns = [f"{numerator}_a", f"{denominator}_a", f"{numerator}_b", f"{denominator}_b"]
    # Prompts decoded in a batch (hardware.batch_prompts) have no wall time: speed-ups pair the timed ones.
    aligned = aligned.dropna(subset=columns)
    counts["n_paired"] = counts["n_per_dataset"] = len(aligned)
    if aligned.empty:
        return _Pairing([], [], counts, "no paired prompts with records")
    groups = [group for _, group in aligned.groupby(["seed", "max_new_tokens"], dropna=False)]
    strata = [tuple(group[c].to_numpy(dtype=float) for c in columns) for group in groups]
    return _Pairing(strata, [1.0 / len(groups)] * len(groups), counts)


def _dataset_pairing(
    selected: pd.DataFrame, by_cell: dict, records: pd.DataFrame, method: str, comparator: str, dataset: str,
    metric: str,
) -> _Pairing | None:
    """``method`` against ``comparator`` on ``dataset``; None when either has no cell there."""
    sides = [selected[(selected["method"] == m) & (selected["dataset"] == dataset)] for m in (method, comparator)]
    if any(side.empty for side in sides):
        return None
    reasons = sorted({reason for side in sides for reason in side["_reason"] if reason})
    if metric == "speedup" and reasons:
        return _Pairing([], [], {}, f"n/c ({', '.join(reasons)})")
    frames = [pd.concat([by_cell[k] for k in _cell_keys(side) if k in by_cell] or [records.iloc[:0]]) for side in sides]
    return _pair_records(frames[0], frames[1], metric)


def _average_pairing(per_dataset: dict[str, _Pairing]) -> _Pairing:
    """The mean over datasets: every dataset's strata, weights divided by the number of datasets."""
    pairings = list(per_dataset.values())
    if any(p.note.startswith("n/c") for p in pairings):
        return _Pairing([], [], {}, "n/c (a dataset not comparable)")
    if any(not p.strata for p in pairings):
        return _Pairing([], [], {}, "no paired prompts with records in a dataset")
    counts = {key: sum(p.counts[key] for p in pairings) for key in pairings[0].counts}
    counts["n_per_dataset"] = min(p.counts["n_per_dataset"] for p in pairings)
    strata = [s for p in pairings for s in p.strata]
    weights = [w / len(pairings) for p in pairings for w in p.weights]
    return _Pairing(strata, weights, counts)


def _difference_row(pairing: _Pairing, kind: str, null: float) -> dict:
    row = {"null": null, "note": pairing.note, **pairing.counts}
    if not pairing.strata:
        return row
    interval = paired_comparison(pairing.strata, kind, pairing.weights)
    row.update(
        estimate=interval.estimate,
        low=interval.low,
        high=interval.high,
        excludes_null=interval.excludes(null),
        real=interval.excludes(null) and pairing.counts["n_paired"] >= MIN_PROMPTS_FOR_VERDICT,
        interval=interval.method,
    )
    counts = pairing.counts
    if counts["n_paired"] < max(counts["n_method"], counts["n_comparator"]):
        row["note"] = (
            f"paired on the {counts['n_paired']} prompts both ran "
            f"(method {counts['n_method']}, comparator {counts['n_comparator']})"
        )
    return row


def method_differences(
    cells: pd.DataFrame,
    records: pd.DataFrame,
    model_pair: str,
    setting: Setting | None = None,
    comparators: tuple[str, ...] = COMPARATORS,
) -> pd.DataFrame:
    """Each method against each comparator at ``setting``, per dataset and averaged over datasets.

    Block efficiency: the difference method − comparator; speed-up: the ratio method / comparator;
    each with its paired 95 % bootstrap interval over prompts (``stats.paired_comparison``). Prompts
    are matched on (seed, max_new_tokens, prompt_id); where the two cells' prompt sets differ the
    comparison uses the prompts both ran, and ``note`` says so. The average column exists where both
    methods have every dataset of the table; it resamples prompts within each dataset. ``real``: the
    interval excludes the null (0 or 1) with at least ``MIN_PROMPTS_FOR_VERDICT`` paired prompts in the
    entry: the dataset's own, or all datasets' together for the average (a stratified bootstrap of them).
    """
    pair_cells, setting = pair_cells_and_setting(cells, model_pair, setting)
    selected = cells_at(pair_cells, setting)
    selected = selected[selected["method"] != "ar"]
    selected = selected.assign(_reason=speedup_exclusions(selected))
    datasets = ordered(selected["dataset"], DATASET_ORDER)
    by_cell = records_by_cell(records, selected)
    rows = []
    # A comparator is its rule as configured (the shortest name of that rule: "spectr_gbv[carry_over=False]",
    # not an option variant such as "spectr_gbv[arithmetic=release_bf16,carry_over=False]").
    names = set(selected["method"])
    resolved = [min((m for m in names if base_method(m) == c), key=len, default=None) for c in comparators]
    for comparator in [c for c in resolved if c is not None]:
        for method in order_methods(m for m in selected["method"] if m != comparator):
            for metric, (kind, null) in COMPARISON_KIND.items():
                per_dataset = {
                    dataset: pairing
                    for dataset in datasets
                    if (pairing := _dataset_pairing(selected, by_cell, records, method, comparator, dataset, metric))
                }
                if len(per_dataset) == len(datasets):
                    per_dataset[AVERAGE] = _average_pairing(per_dataset)
                for dataset, pairing in per_dataset.items():
                    key = {"model_pair": model_pair, "comparator": comparator, "method": method,
                           "dataset": dataset, "metric": metric}
                    rows.append(key | _difference_row(pairing, kind, null))
    return pd.DataFrame(rows).reindex(columns=_DIFFERENCE_COLUMNS)


def _difference_text(row, metric: str) -> str:
    if missing(row.estimate):
        return row.note
    text = interval_text(row.estimate, row.low, row.high, signed=metric != "speedup", unit=_unit(metric))
    if row.real is True:
        text = f"**{text}**"
    return text + (" ‡" if row.note else "")


def differences_markdown(differences: pd.DataFrame) -> str:
    """The "which differences are real" tables: per comparator and metric, methods × datasets."""
    if differences.empty:
        return "No comparator (SpecTr-GBV, SD) at this setting: nothing to compare with.\n"
    sizes = sorted({int(n) for n in differences["n_per_dataset"].dropna()})
    totals = [int(n) for n in differences["n_paired"].dropna()] or [0]
    lines = [
        f"Each method against {' and against '.join(method_label(c) for c in differences['comparator'].unique())} "
        "on the same prompts (paired by prompt id). Δ block efficiency = method − comparator; speed-up "
        "ratio = method's speed-up / comparator's. Brackets: 95 % paired bootstrap interval over prompts "
        f"({RESAMPLES} resamples, seed {SEED}; BCa, percentile where BCa is undefined); the average column "
        "resamples prompts within each dataset. **Bold**: the interval excludes 0 (Δ) or 1 (ratio) with at "
        f"least {MIN_PROMPTS_FOR_VERDICT} paired prompts in the entry (a dataset's own; all datasets' together "
        "for the average) — a difference that is real at this setting. "
        "n/c: speed-up not comparable (batched, contention or offloaded cells).",
        "",
        f"Paired prompts per dataset: {', '.join(map(str, sizes)) or '—'}"
        + (
            f" — fewer than {MIN_PROMPTS_FOR_VERDICT}, so no difference can be called real."
            if sizes and max(totals) < MIN_PROMPTS_FOR_VERDICT
            else f" — fewer than {MIN_PROMPTS_FOR_VERDICT} per dataset: only average entries can be called real."
            if sizes and max(sizes) < MIN_PROMPTS_FOR_VERDICT
            else "."
        ),
        "",
    ]
    for comparator in differences["comparator"].unique():
        for metric in COMPARISON_KIND:
            subset = differences[(differences["comparator"] == comparator) & (differences["metric"] == metric)]
            if subset.empty:
                continue
            subset = subset.assign(text=[_difference_text(row, metric) for row in subset.itertuples()])
            wide = methods_by_datasets(subset, "text").fillna("")
            lines += [
                f"**{COMPARISON_TITLES[metric]} vs {method_label(comparator)}**",
                "",
                wide.to_markdown(disable_numparse=True),
                "",
            ]
    judged = differences[differences["excludes_null"].notna()]
    lines.append(
        f"Real differences: {int((judged['real'] == True).sum())} of {len(judged)} entries with an interval "  # noqa: E712
        f"({int((judged['excludes_null'] == True).sum())} intervals exclude the null). Each entry is its own "  # noqa: E712
        "95 % statement: among entries with no true difference about 1 in 20 is still bold."
    )
    footnotes = differences[differences["note"].str.startswith("paired on")]
    if not footnotes.empty:
        lines += ["", "‡ Prompt sets differ; compared on the intersection:"]
        lines += [
            f"- {method_label(r.method)} vs {method_label(r.comparator)}, {r.dataset}, {r.metric}: {r.note}"
            for r in footnotes.itertuples()
        ]
    return "\n".join(lines) + "\n"


def throughput_ratios(cells: pd.DataFrame, model_pair: str, setting: Setting) -> pd.DataFrame:
    """Tokens/s of each method's cell over its AR cell's (same dataset and temperature), at ``setting``:
    [method x dataset]. Table 1's speed-up is a time ratio over the same prompts; when outputs differ in
    length (a lossy rule, stop strings firing elsewhere) the tokens/s ratio is the fairer figure. Cells
    whose speed-up is not comparable (``speedup_exclusions``) are left empty."""
    at = cells_at(cells[cells["model_pair"] == model_pair], setting)
    at = at[speedup_exclusions(at).isna()]
    ar = at[at["method"] == "ar"].set_index(["dataset", "temperature"])["tokens_per_s"]
    ar = ar[~ar.index.duplicated()]
    rows = [{"method": cell.method, "dataset": cell.dataset, "ratio": cell.tokens_per_s / base}
            for cell in at[at["method"] != "ar"].itertuples()
            if (base := ar.get((cell.dataset, cell.temperature))) is not None and base > 0]
    if not rows:
        return pd.DataFrame()
    return methods_by_datasets(pd.DataFrame(rows), "ratio", aggfunc="last", index_name=None)
