"""Per model pair: Table 1 beside the paper, the speed-ups not shown, tokens/s, which differences are real and
the ablation figures. Each part writes its own files (tables/, figures/) beside REPORT.md."""

from __future__ import annotations

import pandas as pd

from spectr_repro.analysis.figures import AXES, AXIS_FILE_NAMES, ablation_data, make_figures
from spectr_repro.analysis.format import AVERAGE, markdown, relative
from spectr_repro.analysis.load import DATASET_ORDER, ordered
from spectr_repro.analysis.report.context import ReportContext
from spectr_repro.analysis.stats import RESAMPLES, SEED
from spectr_repro.analysis.tables import (
    Setting,
    build_table1,
    differences_markdown,
    main_setting,
    method_differences,
    speedup_exclusions,
    throughput_ratios,
)


def pair_sections(context: ReportContext) -> str | None:
    """Per model pair: Table 1, the speed-ups not shown, tokens/s, which differences are real, the ablations."""
    if context.results is None:
        return None
    cells = context.results.cells
    parts = []
    for pair in ordered(cells["model_pair"], []):
        pair_cells = cells[cells["model_pair"] == pair]
        if (pair_cells["method"] == "ar").all():
            parts.append(f"## {pair}\n\nOnly AR cells: nothing to compare.\n")
            continue
        setting = main_setting(pair_cells)
        lines = table1_lines(context, pair, setting)
        lines += not_comparable_lines(pair_cells)
        lines += throughput_lines(cells, pair, setting)
        lines += differences_lines(context, pair, setting)
        lines += ablation_lines(context, pair, setting)
        parts.append("\n".join(lines))
    return "\n".join(parts)


def table1_lines(context: ReportContext, pair: str, setting: Setting) -> list[str]:
    """Table 1 of ``pair`` at the main setting beside the paper's numbers (its files written under tables/)."""
    out_dir = context.out_dir
    table = build_table1(context.results.cells, context.paper, pair, out_dir / "tables", setting,
                         records=context.results.records)
    comparison = table.comparison
    datasets = [d for d in comparison["dataset"].unique()
                if d != AVERAGE and comparison.loc[comparison["dataset"] == d, "ours"].notna().any()]
    has_paper = comparison["paper"].notna().any()
    return [
        f"## Table 1 — {pair}",
        "",
        f"Main setting {setting} (single-draft methods sd, bv, gbv at K=1). "
        f"`{AVERAGE}` = mean over this table's datasets ({', '.join(ordered(datasets, DATASET_ORDER))}), "
        "given only for methods that have all of them.",
        f"Brackets: 95 % bootstrap interval over prompts ({RESAMPLES} resamples, seed {SEED}; BCa, "
        "percentile where BCa is undefined because every prompt gives the same value); the average's "
        "interval resamples prompts within each dataset. "
        "Paper values in parentheses with Δ = ours − paper; "
        + (
            "the paper's averages are over its five datasets and its own prompts, hardware and models."
            if has_paper
            else "the paper reports no numbers for this model pair (see \"The paper's "
            'numbers" below for the DeepSeek pairs).'
        ),
        "",
        table.markdown,
        "Files: " + ", ".join(f"[{p.name}]({relative(p, out_dir)})" for p in table.paths.values()),
        "",
    ]


def not_comparable_lines(pair_cells: pd.DataFrame) -> list[str]:
    """The pair's cells whose speed-up is never shown (batched, contention, offloaded), one line each."""
    reasons = speedup_exclusions(pair_cells)
    excluded = pair_cells[reasons.notna()].assign(reason=reasons[reasons.notna()])
    if excluded.empty:
        return []
    lines = [
        "n/c: speed-ups not shown, in tables or figures, for cells whose wall times are no speed-up "
        "measurement (block efficiency is unaffected):",
        "",
    ]
    for cell in excluded.sort_values(["dataset", "method", "K", "L", "temperature"]).itertuples():
        lines.append(
            f"- {cell.method} on {cell.dataset}, K={cell.K} L={cell.L} T={cell.temperature:g}: {cell.reason}"
        )
    return lines + [""]


def throughput_lines(cells: pd.DataFrame, pair: str, setting: Setting) -> list[str]:
    """The tokens/s ratio vs AR beside Table 1's speed-up (a time ratio), per method and dataset."""
    ratios = throughput_ratios(cells, pair, setting)
    if ratios.empty:
        return []
    shown = ratios.apply(lambda column: column.map(lambda v: "" if pd.isna(v) else f"{v:.2f}×"))
    return [
        f"### Tokens/s ratio vs AR — {pair}",
        "",
        "Table 1's speed-up is a **time ratio** over the same prompts (AR's wall time / the method's). Where a "
        "rule changes the output (not lossless) or stop strings end completions at other places, the lengths "
        "differ; the tokens/s ratio (the method cell's tokens per second / its AR cell's, timed prompts only) "
        "is the fairer figure then:",
        "",
        markdown(shown, index=True),
        "",
    ]


def differences_lines(context: ReportContext, pair: str, setting: Setting) -> list[str]:
    """Each method vs SpecTr-GBV and vs SD with paired intervals (written to tables/differences_<pair>.csv)."""
    differences = method_differences(context.results.cells, context.results.records, pair, setting)
    path = context.out_dir / "tables" / f"differences_{pair}.csv"
    differences.to_csv(path, index=False, float_format="%.4f")
    return [
        f"### Which differences are real — {pair}",
        "",
        differences_markdown(differences),
        f"Numbers: [{path.name}]({relative(path, context.out_dir)}).",
        "",
    ]


def ablation_lines(context: ReportContext, pair: str, setting: Setting) -> list[str]:
    """The ablation figures of ``pair`` (one per swept axis, numbers in tables/) and per-position acceptance."""
    cells, records, out_dir = context.results.cells, context.results.records, context.out_dir
    figures = make_figures(cells, records, pair, out_dir / "figures", setting)
    lines = [
        f"## Ablations — {pair}",
        "",
        "Each figure varies one axis with the other two at the main setting; points are cell values, "
        f"error bars 95 % bootstrap intervals over prompts ({RESAMPLES} resamples). Single-draft methods are "
        "dashed lines in the K figure.",
        "",
    ]
    not_swept = []
    for axis in AXES:
        name = f"ablation_{AXIS_FILE_NAMES[axis]}"
        if name not in figures:
            not_swept.append(AXES[axis])
            continue
        csv_path = out_dir / "tables" / f"{name}_{pair}.csv"
        ablation_data(cells, records, pair, axis, setting).to_csv(csv_path, index=False, float_format="%.4f")
        png, svg = figures[name]
        lines += [
            f"### Block efficiency and speed-up vs {AXIS_FILE_NAMES[axis]}",
            "",
            f"![{name} {pair}]({relative(png, out_dir)})",
            "",
            f"Numbers: [{csv_path.name}]({relative(csv_path, out_dir)}); SVG: [{svg.name}]({relative(svg, out_dir)}).",
            "",
        ]
    if not_swept:
        lines += [f"Not swept in these results (no method takes two values): {', '.join(not_swept)}.", ""]
    if "acceptance" in figures:
        lines += [
            "### Per-position acceptance",
            "",
            "P(draft position i accepted | position i reached), at the main setting.",
            "",
            f"![acceptance {pair}]({relative(figures['acceptance'][0], out_dir)})",
            "",
        ]
    return lines
