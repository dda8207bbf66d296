"""`python -m spectr_repro report [results_dir ...]`: REPORT.md with environment, settings, Table 1
beside the paper's numbers, ablation figures, per-position acceptance, and (when present) the
losslessness audit, quality metrics and the theory summary.

Outputs, next to the first results folder (or ``--output``):

    REPORT.md
    tables/table1_<pair>.{md,csv,tex}       Table 1 (ours with 95 % intervals, paper, difference)
    tables/differences_<pair>.csv           each method vs SpecTr-GBV and vs SD, paired intervals
    tables/ablation_<K|L|T>_<pair>.csv      the numbers behind each ablation figure
    figures/ablation_<K|L|T>_<pair>.{png,svg}, figures/acceptance_<pair>.{png,svg}

The report reads files only (records and summaries; the audit, quality, theory, bias and replay files beside
them), so it can be rebuilt anywhere; it scores nothing (`python -m spectr_repro quality` does).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from pathlib import Path

import pandas as pd

from spectr_repro.analysis.figures import AXES, AXIS_FILE_NAMES, ablation_data, make_figures
from spectr_repro.analysis.load import (
    DATASET_ORDER,
    METHOD_LABELS,
    METHOD_ORDER,
    Results,
    integrity_markdown,
    load_results,
    order_methods,
    ordered,
)
from spectr_repro.analysis.stats import RESAMPLES, SEED, quality_parity
from spectr_repro.analysis.tables import (
    AVERAGE,
    METRICS,
    build_table1,
    differences_markdown,
    main_setting,
    method_differences,
    speedup_exclusions,
    throughput_ratios,
)
from spectr_repro.environment import git_commit
from spectr_repro.paper import PAPER_SOURCE, load_paper_numbers, release_numbers, unlabelled_numbers
from spectr_repro.quality import quality_markdown

DEFAULT_RESULTS_DIR = "results/cpu_quick"
# Per-prompt quality outcomes next to quality.csv, when scored: one row per prompt per cell with the
# columns stats.QUALITY_OUTCOME_COLUMNS (+ seed, max_new_tokens, K, L when known).
QUALITY_OUTCOMES_FILE = "quality_prompts.csv"  # written by spectr_repro.quality (its PROMPTS_FILE)
ENVIRONMENT_KEYS = ["device", "device_name", "torch", "transformers", "python", "git_commit", "num_threads"]


def _merge(results: list[Results]) -> Results:
    cells = pd.concat([r.cells for r in results], ignore_index=True)
    records = pd.concat(
        [r.records for r in results if not r.records.empty] or [results[0].records], ignore_index=True
    )
    return Results(root=results[0].root, cells=cells, records=records)


def _markdown(frame: pd.DataFrame, index: bool = False) -> str:
    return frame.to_markdown(index=index, disable_numparse=True)


def _unique_text(values) -> str:
    unique = sorted({str(v) for v in values if v is not None and not (isinstance(v, float) and pd.isna(v))})
    return ", ".join(unique) if unique else "—"


def _repository_commit() -> str | None:
    """The commit of the checkout this report is generated from (None outside a git checkout)."""
    commit = git_commit(short=True)
    return None if commit == "unknown" else commit


def environment_section(cells: pd.DataFrame) -> str:
    rows = []
    for env in cells["environment"]:
        env = env if isinstance(env, dict) else {}
        rows.append({key: str(env.get(key, "")) for key in ENVIRONMENT_KEYS})
    table = pd.DataFrame(rows, columns=ENVIRONMENT_KEYS)
    table = table.groupby(ENVIRONMENT_KEYS, dropna=False).size().rename("cells").reset_index()
    lines = [
        "## Environment",
        "",
        "Where the cells were measured (from each summary's `environment`):",
        "",
        _markdown(table),
        "",
    ]
    commit = _repository_commit()
    if commit:
        lines += [
            f"Report generated from commit `{commit}` with pandas {pd.__version__}, Python "
            f"{sys.version.split()[0]}.",
            "",
        ]
    return "\n".join(lines)


def settings_section(cells: pd.DataFrame, records: pd.DataFrame) -> str:
    lines = ["## Settings", ""]
    lines.append(
        f"- Experiments: {_unique_text(cells['experiment'])}; "
        f"model pairs: {_unique_text(cells['model_pair'])}."
    )
    lines.append(
        f"- Cells: {len(cells)} ({(cells['method'] != 'ar').sum()} speculative, "
        f"{(cells['method'] == 'ar').sum()} AR baselines); prompts recorded: {len(records)}."
    )
    lines.append(
        f"- max_new_tokens: {_unique_text(cells['max_new_tokens'])}; seeds: {_unique_text(cells['seed'])}."
    )
    wall = pd.to_numeric(cells["wall_time_s"], errors="coerce").sum()
    lines.append(
        f"- Measured generation time summed over cells (speculative and AR cells, timed prompts only): "
        f"{wall / 60:.1f} min."
    )
    lines.append(
        "- Block efficiency = tokens per target call, bonus token included (AR = 1.00). "
        "Speed-up = AR wall time / method wall time on the same prompts in the same process."
    )
    lines.append("")
    prompts = cells.groupby(["model_pair", "dataset"])["num_prompts"].agg(_unique_text).unstack("dataset")
    prompts = prompts.reindex(columns=ordered(prompts.columns, DATASET_ORDER)).fillna("")
    lines += ["Prompts per cell (by model pair and dataset):", "", _markdown(prompts, index=True), ""]
    grid = (
        cells.groupby(["model_pair", "method"])
        .agg(
            K=("K", _unique_text),
            L=("L", _unique_text),
            T=("temperature", _unique_text),
            datasets=("dataset", lambda d: ", ".join(ordered(d, DATASET_ORDER))),
            cells=("cell_id", "size"),
        )
        .reset_index()
    )
    rank = {m: i for i, m in enumerate(order_methods(grid["method"]))}
    grid = grid.sort_values(["model_pair", "method"], key=lambda c: c.map(rank) if c.name == "method" else c)
    lines += ["Grid (values present in the results):", "", _markdown(grid), ""]
    return "\n".join(lines)


def _relative(path: Path, start: Path) -> str:
    return Path(os.path.relpath(path, start)).as_posix()


def pair_sections(results: Results, paper: pd.DataFrame, out_dir: Path) -> str:
    """Per model pair: Table 1, the speed-ups not shown, tokens/s, which differences are real, the ablations."""
    cells, records = results.cells, results.records
    parts = []
    for pair in ordered(cells["model_pair"], []):
        pair_cells = cells[cells["model_pair"] == pair]
        if (pair_cells["method"] == "ar").all():
            parts.append(f"## {pair}\n\nOnly AR cells: nothing to compare.\n")
            continue
        setting = main_setting(pair_cells)
        lines = table1_lines(cells, records, paper, pair, setting, out_dir)
        lines += not_comparable_lines(pair_cells)
        lines += throughput_lines(cells, pair, setting)
        lines += differences_lines(cells, records, pair, setting, out_dir)
        lines += ablation_lines(cells, records, pair, setting, out_dir)
        parts.append("\n".join(lines))
    return "\n".join(parts)


def table1_lines(cells: pd.DataFrame, records: pd.DataFrame, paper: pd.DataFrame, pair: str, setting,
                 out_dir: Path) -> list[str]:
    """Table 1 of ``pair`` at the main setting beside the paper's numbers (its files written under tables/)."""
    table = build_table1(cells, paper, pair, out_dir / "tables", setting, records=records)
    datasets = [
        d
        for d in table.comparison["dataset"].unique()
        if d != AVERAGE and table.comparison.loc[table.comparison["dataset"] == d, "ours"].notna().any()
    ]
    has_paper = table.comparison["paper"].notna().any()
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
        "Files: " + ", ".join(f"[{p.name}]({_relative(p, out_dir)})" for p in table.paths.values()),
        "",
    ]


def differences_lines(cells: pd.DataFrame, records: pd.DataFrame, pair: str, setting, out_dir: Path) -> list[str]:
    """Each method vs SpecTr-GBV and vs SD with paired intervals (written to tables/differences_<pair>.csv)."""
    differences = method_differences(cells, records, pair, setting)
    differences_path = out_dir / "tables" / f"differences_{pair}.csv"
    differences.to_csv(differences_path, index=False, float_format="%.4f")
    return [
        f"### Which differences are real — {pair}",
        "",
        differences_markdown(differences),
        f"Numbers: [{differences_path.name}]({_relative(differences_path, out_dir)}).",
        "",
    ]


def ablation_lines(cells: pd.DataFrame, records: pd.DataFrame, pair: str, setting, out_dir: Path) -> list[str]:
    """The ablation figures of ``pair`` (one per swept axis, numbers in tables/) and per-position acceptance."""
    figures = make_figures(cells, records, pair, out_dir / "figures", setting)
    lines = [
        f"## Ablations — {pair}",
        "",
        "Each figure varies one axis with the other two at the main setting; points are cell values, "
        "error bars 95 % bootstrap intervals over prompts (1000 resamples). Single-draft methods are "
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
        ablation_data(cells, records, pair, axis, setting).to_csv(
            csv_path, index=False, float_format="%.4f"
        )
        png, svg = figures[name]
        lines += [
            f"### Block efficiency and speed-up vs {AXIS_FILE_NAMES[axis]}",
            "",
            f"![{name} {pair}]({_relative(png, out_dir)})",
            "",
            f"Numbers: [{csv_path.name}]({_relative(csv_path, out_dir)}); "
            f"SVG: [{svg.name}]({_relative(svg, out_dir)}).",
            "",
        ]
    if not_swept:
        lines += [f"Not swept in these results (no method takes two values): {', '.join(not_swept)}.", ""]
    if "acceptance" in figures:
        png = figures["acceptance"][0]
        lines += [
            "### Per-position acceptance",
            "",
            "P(draft position i accepted | position i reached), at the main setting.",
            "",
            f"![acceptance {pair}]({_relative(png, out_dir)})",
            "",
        ]
    return lines


def throughput_lines(cells: pd.DataFrame, pair: str, setting) -> list[str]:
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
        _markdown(shown, index=True),
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


def paper_section(paper: pd.DataFrame) -> str:
    labelled = paper[
        (paper["model_pair"] != "") & (paper["metric"].isin(METRICS)) & (paper["dataset"] == AVERAGE)
    ]
    lines = [
        "## The paper's numbers",
        "",
        f"Source: {PAPER_SOURCE}; kept in `spectr_repro/paper_numbers.csv`. "
        "Blank = not reported (never filled in).",
        "",
    ]
    if not labelled.empty:
        wide = labelled.pivot_table(index="method", columns=["model_pair", "metric"], values="value")
        wide = wide.reindex(index=ordered(wide.index, METHOD_ORDER))
        wide.index = [METHOD_LABELS.get(m, m) for m in wide.index]
        wide.columns = [
            f"{pair} {'BE' if metric == 'block_efficiency' else 'speed-up'}" for pair, metric in wide.columns
        ]
        lines += [
            "Averages over the five datasets:",
            "",
            wide.map(lambda v: "" if pd.isna(v) else f"{v:.2f}")
            .rename_axis("method")
            .to_markdown(disable_numparse=True),
            "",
        ]
    unlabelled = unlabelled_numbers(paper)
    if not unlabelled.empty:
        lines += ["Seen without setting labels (model pair unknown, so never placed in a table above):", ""]
        for row in unlabelled.itertuples(index=False):
            where = row.dataset or "—"
            lines.append(
                f"- {METHOD_LABELS.get(row.method, row.method)}, {where}, {row.metric}: {row.value:g}"
            )
        lines.append("")
    lines += release_lines(paper)
    return "\n".join(lines)


# How the authors' release measures (its README and code), where it differs from this harness's definitions.
RELEASE_METRIC_NOTE = (
    "The release's metrics are not ours: its block efficiency counts every token generated before the output is "
    "truncated (a last block that runs past the end of the text or the token budget counts whole); ours is the new "
    "tokens kept (emission stops at EOS and at max_new_tokens, and the last block is drafted only as long as the "
    "tokens still wanted) per target call, bonus or correction included (AR = 1.00). Its acceptance rate is "
    "accepted draft tokens / (K·L), over all K drafts; ours is per position (P(depth i accepted | reached)). Its "
    "numbers are therefore set beside ours, never differenced with them."
)


def release_lines(paper: pd.DataFrame) -> list[str]:
    """The authors' code release's own numbers (experiment=release_humaneval) and how its metrics differ."""
    rows = release_numbers(paper)
    if rows.empty:
        return []
    wide = rows.pivot_table(index="method", columns=["model_pair", "metric"], values="value")
    wide.index = [METHOD_LABELS.get(m, m.upper()) for m in wide.index]
    wide.columns = [f"{pair} {'BE' if metric == 'block_efficiency' else 'tok/s'}" for pair, metric in wide.columns]
    table = wide.map(lambda v: "" if pd.isna(v) else f"{v:.2f}").rename_axis("method")
    return ["### The authors' code release (its own HumanEval setting, `experiment=release_humaneval`)", "",
            f"Source: {rows['source'].iloc[0]}.", "", table.to_markdown(disable_numparse=True), "",
            RELEASE_METRIC_NOTE, ""]


def find_audit(results_dirs: list[Path]) -> Path | None:
    """audit.json next to or above the results folders (results/audit/audit.json), or in ./results/audit."""
    candidates = []
    for folder in results_dirs:
        candidates += [
            folder / "audit" / "audit.json",
            folder.parent / "audit" / "audit.json",
            folder / "audit.json",
        ]
    candidates.append(Path("results") / "audit" / "audit.json")
    return next((c for c in candidates if c.is_file()), None)


def audit_rows(audit) -> list[dict]:
    """The audit's rows, whether the JSON is a list of rows or an object holding one."""
    if isinstance(audit, list):
        return [row for row in audit if isinstance(row, dict)]
    if isinstance(audit, dict):
        if "rule" in audit:
            return [audit]
        for value in audit.values():
            if isinstance(value, list) and value and isinstance(value[0], dict) and "rule" in value[0]:
                return value
    return []


def audit_section(path: Path, out_dir: Path) -> str:
    audit = json.loads(path.read_text(encoding="utf-8"))
    rows = audit_rows(audit)
    lines = [
        "## Lossless status (audit)",
        "",
        f"From [{path.name}]({_relative(path, out_dir)}): exact total-variation distance between each rule's "
        "decoded law and the target's, a Monte-Carlo chi-square check through the real sampler, and the "
        "audit's verdict.",
        "",
    ]
    if isinstance(audit, dict):
        for key, value in audit.items():
            if not isinstance(value, list | dict):
                lines.append(f"- {key}: {value}")
        lines.append("")
    if not rows:
        return "\n".join(lines + ["The audit file holds no rows.", ""])
    table = _audit_table(rows)
    lines += [_markdown(table.astype(object).where(table.notna(), "").astype(str)), ""]
    details = path.parent / "AUDIT.md"
    if details.is_file():
        lines += [f"Details per toy model: [{details.name}]({_relative(details, out_dir)}).", ""]
    if {"rule", "verdict"} <= set(table):
        lines += _audit_verdict_lines(table)
    if "exact_tv_vs_default" in table:
        lines += ["`exact_tv_vs_default`: an option variant's exact TV to the same rule with default options (for "
                  "spectr_gbv `arithmetic=release_*`: how far the release's half-precision rows and float32 "
                  "arithmetic move the law from the float64 replica's).", ""]
    lines += peer_lines(audit.get("peers") if isinstance(audit, dict) else None)
    return "\n".join(lines)


def _audit_table(rows: list[dict]) -> pd.DataFrame:
    """The columns the audit contract names, plus its flags, as text; per-toy details stay in AUDIT.md / audit.json."""
    columns = [
        "rule",
        "K",
        "options",
        "exact_tv",
        "exact_tv_vs_default",
        "p_value",
        "mc_tv",
        "verdict",
        "claimed_lossless",
        "harness_lossless",
        "flags",
    ]
    table = pd.DataFrame(rows)
    table = table[[c for c in columns if c in table]].copy()
    for column in ("exact_tv", "exact_tv_vs_default", "mc_tv"):
        if column in table:
            table[column] = table[column].map(lambda v: "" if v is None or pd.isna(v) else f"{v:.2e}")
    if "p_value" in table:
        table["p_value"] = table["p_value"].map(lambda v: "" if v is None or pd.isna(v) else f"{v:.3g}")
    if "options" in table:
        table["options"] = table["options"].map(_options_cell)
    if "flags" in table:
        table["flags"] = table["flags"].map(lambda v: "; ".join(map(str, v)) if isinstance(v, list) else v)
    return table


def _audit_verdict_lines(table: pd.DataFrame) -> list[str]:
    """One line per rule: its verdict at each K and option variant, and whether its authors claim it lossless."""
    lines = ["Per method:", ""]
    for rule in ordered(table["rule"], METHOD_ORDER):
        rule_rows = table[table["rule"] == rule]
        verdicts = "; ".join(
            f"K={row.get('K', '?')}{' ' + row['options'] if row.get('options') else ''}: {row['verdict']}"
            for _, row in rule_rows.iterrows()
        )
        claimed = ""
        if "claimed_lossless" in rule_rows:
            claimed = f" (claimed lossless: {_unique_text(rule_rows['claimed_lossless'])})"
        lines.append(f"- **{METHOD_LABELS.get(rule, rule)}**{claimed}: {verdicts}")
    return lines + [""]


def peer_lines(peers) -> list[str]:
    """The peer rows of the audit (transformers' assisted generation): one line of table per setting."""
    if not peers:
        return []
    rows = []
    for peer in peers:
        first = peer.get("first_iteration") or {}
        squared = first.get("draft_at_T_squared") or {}
        rows.append({
            "peer": f"{peer.get('peer', '?')} ({peer.get('setting', '?')})",
            "samples": peer.get("num_samples"),
            "p_value": f"{peer.get('p_value', float('nan')):.3g}",
            "mc_tv": f"{peer.get('mc_tv', float('nan')):.3f}",
            "detectable_tv (90 % power)": f"{peer.get('detectable_tv', float('nan')):.3f}",
            "first iteration mean tau (SD exact, draft at T / T^2)": (
                f"{first['mean_tau']:.3f} ({first['exact_mean_tau']:.3f} / {squared.get('exact_mean_tau', 0):.3f})"
                if first else ""),
            "verdict": peer.get("verdict", ""),
            "flags": "; ".join(map(str, peer.get("flags", []))),
        })
    return [
        "Peers (`spectr_repro.theory.peers`, details in AUDIT.md): the decoded law of the first tokens of "
        "transformers' assisted generation on a tiny Llama pair against the target's exact law; any bias of at "
        "least `detectable_tv` would be detected with 90 % power; the first iteration's accepted length against "
        "SD's exact expectation with the draft at temperature T and at T^2.",
        "",
        _markdown(pd.DataFrame(rows).astype(str)),
        "",
    ]


def _options_cell(options) -> str:
    if isinstance(options, dict):
        return ", ".join(f"{key}={value}" for key, value in sorted(options.items()))
    return "" if options is None else str(options)


def paired_quality_lines(results_dirs: list[Path], collapsed: list[dict] | None = None) -> list[str]:
    """Each method against AR on the same prompts (McNemar exact, Wilson intervals) from the folders'
    per-prompt outcomes (``QUALITY_OUTCOMES_FILE``); nothing when no folder has them."""
    paths = [folder / QUALITY_OUTCOMES_FILE for folder in results_dirs if (folder / QUALITY_OUTCOMES_FILE).is_file()]
    if not paths:
        return []
    parity = quality_parity(pd.concat([pd.read_csv(path) for path in paths], ignore_index=True))
    if collapsed:  # settings collapsed to one line in the table (collapse_uninformative_quality)
        parity = _drop_collapsed(parity, collapsed)
    lines = [
        "### Paired with AR on the same prompts",
        "",
        "Accuracy with its Wilson 95 % interval; `only method` / `only AR`: prompts one got right and the "
        "other wrong; p: McNemar's exact test (two-sided binomial test on those discordant prompts). A small "
        "p says the method's accuracy differs from AR's on these prompts; for a lossless rule p < 0.05 should "
        "occur in about 5 % of settings.",
        "",
    ]
    if parity.empty:
        return lines + ["No method shares prompts with an AR cell.", ""]
    interval = "{:.3f} [{:.3f}, {:.3f}]".format
    shown = pd.DataFrame(
        {
            **{c: parity[c] for c in ("dataset", "model_pair", "temperature", "method", "K", "L") if c in parity},
            "n paired": parity["n_paired"],
            "accuracy": [interval(*v) for v in zip(parity.accuracy, parity.accuracy_low, parity.accuracy_high)],
            "AR": [interval(*v) for v in zip(parity.baseline_accuracy, parity.baseline_low, parity.baseline_high)],
            "only method": parity["only_method"],
            "only AR": parity["only_baseline"],
            "p (McNemar)": parity["p_value"].map("{:.3g}".format),
        }
    )
    return lines + [_markdown(shown.astype(str)), ""]


QUALITY_SETTING = ("experiment", "dataset", "model_pair", "temperature", "max_new_tokens")
UNINFORMATIVE_WIDTH = 0.5  # an AR interval wider than half the [0, 1] range cannot tell methods apart


def collapse_uninformative_quality(df: pd.DataFrame) -> tuple[pd.DataFrame, list[str], list[dict]]:
    """Settings whose AR accuracy is 0, or whose AR Wilson interval spans more than half the range, become one
    line each: (the rows kept, those lines, the collapsed settings as {column: value}). A table of zeros (AR
    cannot finish its answers in max_new_tokens) says nothing about the rules and buries the report."""
    if df.empty or "method" not in df or "accuracy" not in df:
        return df, [], []
    columns = [c for c in QUALITY_SETTING if c in df]
    if not columns or not {"ci_low", "ci_high", "correct", "n"} <= set(df):
        return df, [], []
    kept, lines, collapsed = [], [], []
    for key, group in df.groupby(columns, dropna=False, sort=False):
        ar = group[group.method == "ar"]
        if ar.empty:
            kept.append(group)
            continue
        row = ar.iloc[0]
        width = float(row.ci_high - row.ci_low)
        if float(row.accuracy) > 0 and width <= UNINFORMATIVE_WIDTH:
            kept.append(group)
            continue
        reason = ("AR accuracy is 0 (its answers do not finish or are all wrong)" if float(row.accuracy) == 0
                  else f"AR's 95 % interval spans {width:.2f} of the range (too few prompts)")
        tokens = f", {int(row.max_new_tokens)} new tokens" if "max_new_tokens" in row and pd.notna(
            row.max_new_tokens) else ""
        lines.append(f"- {row.dataset}, {row.get('model_pair')}, T={row.get('temperature')}{tokens}: AR "
                     f"{int(row.correct)}/{int(row.n)} [{row.ci_low:.3f}, {row.ci_high:.3f}]; {reason}: its "
                     f"{len(group)} rows say nothing about the rules and are not shown.")
        collapsed.append(dict(zip(columns, key if isinstance(key, tuple) else (key,))))
    frame = pd.concat(kept, ignore_index=True) if kept else df.iloc[:0]
    return frame, lines, collapsed


def _drop_collapsed(parity: pd.DataFrame, collapsed: list[dict]) -> pd.DataFrame:
    for setting in collapsed:
        match = pd.Series(True, index=parity.index)
        for column, value in setting.items():
            if column in parity:
                match &= parity[column].astype(str) == str(value)
        parity = parity[~match]
    return parity


def quality_section(results_dirs: list[Path]) -> str:
    """Quality parity with AR from the files ``python -m spectr_repro quality <dir>`` writes: ``quality.csv``
    (rendered by ``quality.quality_markdown``) and, where present, the per-prompt outcomes
    (``QUALITY_OUTCOMES_FILE``) for the paired test against AR. Scores nothing (scoring HumanEval executes
    model-written code: that is the quality command's business). A file that cannot be read is reported in
    the section rather than losing the whole report.
    """
    heading = ["## Quality parity with AR", ""]
    frames, missing = [], []
    try:
        for folder in results_dirs:
            saved = folder / "quality.csv"
            if saved.is_file():
                frames.append(pd.read_csv(saved))
            else:
                missing.append(folder)
        paired = paired_quality_lines(results_dirs)
        if not frames and paired:
            return "\n".join(heading + paired)
        if not frames:
            return "\n".join(
                heading
                + [
                    "Not computed for these results. `python -m spectr_repro quality <results_dir>` scores "
                    "HumanEval pass@1 and GSM8K/MGSM exact match against AR (HumanEval scoring executes "
                    "model-written code); the report then reads its quality.csv.",
                    "",
                ]
            )
        scored, collapsed_lines, collapsed = collapse_uninformative_quality(pd.concat(frames, ignore_index=True))
        paired = paired_quality_lines(results_dirs, collapsed)
        text = quality_markdown(scored)
    except Exception as error:  # an optional section must not lose the report's tables and figures
        return "\n".join(heading + [f"Quality files could not be read: {type(error).__name__}: {error}", ""])
    # the module writes a stand-alone document: demote its headings below this report's
    body = [("#" + line) if line.startswith("#") else line for line in text.splitlines()]
    if body and body[0].startswith("## "):
        body = body[1:]
    if collapsed_lines:
        body += ["", "Settings that cannot tell the rules apart (collapsed):", "", *collapsed_lines]
    if missing:
        body += ["", f"Not scored (no quality.csv): {', '.join(str(f) for f in missing)}."]
    return "\n".join(heading + body + [""] + paired)


def theory_section(results_dirs: list[Path], out_dir: Path) -> str | None:
    for folder in results_dirs:
        for candidate in (folder.parent / "theory" / "THEORY.md", Path("results") / "theory" / "THEORY.md"):
            if candidate.is_file():
                return (
                    f"## Theory\n\nExact laws, the LP limit and the paper's bound on toy models: "
                    f"[{candidate.name}]({_relative(candidate, out_dir)}).\n"
                )
    return None


BIAS_CSV = Path("bias") / "bias.csv"  # written by `python -m spectr_repro bias` (spectr_repro.bias.driver)


def bias_section(results_dirs: list[Path], out_dir: Path) -> str | None:
    """"Bias on real models": one line per method and setting (the pooled rows of ``bias/bias.csv``) and a
    figure of the first-token law at the context where a rule's estimated bias is largest. None: no bias.csv."""
    paths = [folder / BIAS_CSV for folder in results_dirs if (folder / BIAS_CSV).is_file()]
    if not paths:
        return None
    table = pd.concat([pd.read_csv(path) for path in paths], ignore_index=True)
    pooled = table[table.context.astype(str).str.startswith("pooled")]
    shown = pd.DataFrame({
        "model_pair": pooled.model_pair, "K": pooled.K, "L": pooled.L, "T": pooled.temperature,
        "T draft": pooled.draft_temperature, "method": pooled.method, "estimator": pooled.estimator,
        "contexts": pooled.context.str.extract(r"\((\d+) contexts\)")[0], "draft sets": pooled.samples,
        "TV estimate": pooled.tv_estimate.map("{:.4f}".format),
        "p (Fisher)": pooled.p_value.map("{:.3g}".format), "detectable TV": pooled.detectable_tv.map("{:.3f}".format),
        "exact TV": pooled.exact_tv.map(lambda v: "" if pd.isna(v) else f"{v:.4f}"),
        "acceptance": pooled.acceptance.map("{:.3f}".format), "verdict": pooled.verdict,
    })
    lines = [
        "## Bias on real models",
        "",
        "Law of the FIRST token one iteration emits, from S independent first iterations per context (draft "
        "sets of K drafts x L tokens, drawn in batches), against the target's exact p(.|context) from the same "
        "target forward. Contexts: cuts of an AR continuation of each prompt where the target's top token has "
        "probability nearest 1/2. "
        "Estimator `exact given drafts`: the rule's exact first-token law given the drafts (closed forms for sd, "
        "spectr and the controls; the rule's own `first_token_law` for spectr_gbv and sbv); `counted`: the rule's "
        "own first tokens. Test: Hotelling's T^2 on the probabilities of p's most likely tokens (at most 4 bins, "
        "fixed by p alone; the laws given the drafts are averaged, so no draw is thrown away), valid at any "
        "vocabulary size; p: Fisher's combination over contexts; detectable TV: the smallest TV moved off the "
        "target's most likely token that the pooled test detects with 90 % power at level 0.05. Controls on the "
        "same draft sets: `control_draft` emits the drafted token (law q: exact TV = TV(p, q)) and "
        "`control_lenient_sd` accepts with min(1, 2p/q) (deliberately biased; exact TV shown); `exact TV` 0 "
        "marks rules proven lossless on toys. acceptance: SD's first-token acceptance, sum_y min(p, q), mean over "
        "contexts. The TV estimate is the TV on those bins (a lower bound of the first token's TV; here the mean "
        "over contexts; per-context values and bootstrap intervals in bias.csv).",
        "",
        _markdown(shown.astype(str)),
        "",
    ]
    figure = bias_figure(table, paths, out_dir)
    if figure is not None:
        lines += [f"![first-token law where the bias is largest]({_relative(figure, out_dir)})", ""]
    return "\n".join(lines)


def bias_figure(table: pd.DataFrame, csv_paths: list[Path], out_dir: Path) -> Path | None:
    """Bars of p and of the rule's estimated first-token law, at the (rule, context) with the largest estimated TV
    among those whose test rejects (else the smallest p-value)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rules = table[~table.context.astype(str).str.startswith("pooled") & ~table.method.str.startswith("control")]
    if rules.empty:
        return None
    # The largest estimated TV among the detected biases (the estimate is only read where the test rejects: a
    # lossless rule's estimate is noise); without any detection, the most evidence of one (smallest p).
    detected = rules[rules.verdict.astype(str).str.startswith("bias detected")]
    worst = (detected.sort_values("tv_estimate", ascending=False).iloc[0] if not detected.empty
             else rules.sort_values(["p_value", "tv_estimate"], ascending=[True, False]).iloc[0])
    record = None
    for path in csv_paths:
        for candidate in sorted(path.parent.glob(f"contexts/*/*/{worst.method}.json")):
            data = json.loads(candidate.read_text())
            if (data["context"], data["K"], data["L"], data["temperature"], data["model_pair"]) == (
                    worst.context, worst.K, worst.L, worst.temperature, worst.model_pair):
                record = data
    if record is None:
        return None
    labels = record.get("top_strings") or [str(t) for t in record["top_tokens"]]
    positions = range(len(labels))
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.bar([x - 0.2 for x in positions], record["top_target"], 0.4, label="target p(.|context)")
    ax.bar([x + 0.2 for x in positions], record["top_rule"], 0.4,
           label=f"{METHOD_LABELS.get(worst.method, worst.method)} (estimate, S={record['samples']})")
    ax.set_xticks(list(positions), [repr(label)[1:-1][:12] for label in labels], rotation=45, ha="right")
    ax.set_ylabel("probability of the first token")
    ax.set_title(f"{worst.model_pair}, {worst.context}, K={worst.K} L={worst.L} T={worst.temperature:g}: "
                 f"TV estimate {worst.tv_estimate:.3f}, p = {worst.p_value:.3g}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / "figures" / "bias_first_token.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def build_report(
    results_dirs: list[str | Path],
    output: str | Path | None = None,
    paper_csv: str | Path | None = None,
    audit: str | Path | None = None,
    allow_incomplete: bool = False,
) -> Path:
    """Write REPORT.md (and its tables and figures) and return its path. ValueError on bad input,
    raised before anything is written."""
    folders = [Path(d) for d in results_dirs]
    # Damaged or unfinished cell folders refuse the report (each named) unless allow_incomplete.
    # A folder holding only `bias` or `replay` output (no cells/) feeds those sections alone, beside folders with
    # cells (e.g. `report results/cpu_quick results/replay_qwen`).
    without_cells = [f for f in folders if not (f / "cells").is_dir()
                     and ((f / BIAS_CSV).is_file() or (f / "replay").is_dir())]
    if folders and len(without_cells) == len(folders):  # bias or replay output alone (their own experiments)
        return _report_without_cells(folders, output, audit)
    cell_folders = [f for f in folders if f not in without_cells] or folders
    results = _merge([load_results(folder, strict=not allow_incomplete) for folder in cell_folders])
    paper = load_paper_numbers(paper_csv)
    audit_path, report_path, out_dir = _report_paths(folders, output, audit)

    command = "python -m spectr_repro report " + " ".join(str(f) for f in folders)
    sections = [
        "# spectr_repro report",
        "",
        f"Reproduction of *SpecTr-GBV* (arXiv 2604.25925) and baselines. Generated "
        f"{dt.datetime.now().isoformat(timespec='seconds')} by `{command}` from "
        f"{len(results.cells)} cells.",
        "",
    ]
    replayed = _replay_parts(folders, out_dir, audit_path, results)
    if replayed is not None:  # the verdicts open the report; the replayed Table 1 comes before the trajectory one
        sections += [replayed[0]]
    sections += [
        environment_section(results.cells),
        integrity_markdown(folders, results.cells) or "",
        settings_section(results.cells, results.records),
        replayed[1] if replayed is not None else "",
        pair_sections(results, paper, out_dir),
        paper_section(paper),
    ]
    if audit_path is not None:
        sections.append(audit_section(audit_path, out_dir))
    else:
        sections.append(
            "## Lossless status (audit)\n\nNo audit found (run `python -m spectr_repro audit`).\n"
        )
    for optional in (quality_section(folders), theory_section(folders, out_dir),
                     bias_section(folders, out_dir)):
        if optional:
            sections.append(optional)
    report_path.write_text("\n".join(sections).rstrip() + "\n", encoding="utf-8")
    return report_path


def _report_paths(folders: list[Path], output: str | Path | None, audit: str | Path | None):
    """(audit file or None, REPORT.md's path, its folder, created); ValueError for an audit file that is missing."""
    audit_path = Path(audit) if audit is not None else find_audit(folders)
    if audit is not None and not audit_path.is_file():
        raise ValueError(f"audit file {str(audit_path)!r} not found")
    report_path = Path(output) if output is not None else folders[0] / "REPORT.md"
    report_path.parent.mkdir(parents=True, exist_ok=True)
    return audit_path, report_path, report_path.parent


def _report_without_cells(folders: list[Path], output: str | Path | None, audit: str | Path | None) -> Path:
    """REPORT.md for folders that hold only a replay or a bias run (no trajectory cells: no speed-ups, settings or
    environment tables): the verdicts and replay sections, then the bias section."""
    audit_path, report_path, out_dir = _report_paths(folders, output, audit)
    command = "python -m spectr_repro report " + " ".join(str(f) for f in folders)
    sections = ["# spectr_repro report", "",
                f"Generated {dt.datetime.now().isoformat(timespec='seconds')} by `{command}` from files without "
                "trajectory cells (no speed-ups: those come from `sweep`).", ""]
    audit_data = json.loads(audit_path.read_text(encoding="utf-8")) if audit_path is not None else None
    from spectr_repro.analysis.replay_report import replay_sections

    replayed = replay_sections(folders, out_dir, audit_rows(audit_data) if audit_data is not None else None)
    sections += list(replayed) if replayed is not None else []
    sections += [part for part in (bias_section(folders, out_dir),) if part]
    report_path.write_text("\n".join(sections).rstrip() + "\n", encoding="utf-8")
    return report_path


def _replay_parts(folders: list[Path], out_dir: Path, audit_path: Path | None, results: Results):
    from spectr_repro.analysis.replay_report import replay_sections

    audit = json.loads(audit_path.read_text(encoding="utf-8")) if audit_path is not None else None
    return replay_sections(folders, out_dir, audit_rows(audit) if audit is not None else None,
                           results.cells, results.records)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spectr_repro report",
        description="Write REPORT.md (tables, figures, environment, settings, audit) for results folders.",
    )
    parser.add_argument(
        "results_dirs",
        nargs="*",
        default=[DEFAULT_RESULTS_DIR],
        metavar="results_dir",
        help=f"folders holding cells/<cell_id>/summary.json (default: {DEFAULT_RESULTS_DIR}); "
        "several are merged",
    )
    parser.add_argument("--output", help="report path (default: <first results_dir>/REPORT.md)")
    parser.add_argument("--paper", help="paper numbers CSV (default: the one shipped in the package)")
    parser.add_argument("--audit", help="audit.json (default: results/audit/audit.json when present)")
    parser.add_argument(
        "--allow-incomplete",
        action="store_true",
        help="report although some cell folders are damaged or unfinished (they are listed in the report)",
    )
    args = parser.parse_args(argv)
    try:
        path = build_report(
            args.results_dirs,
            output=args.output,
            paper_csv=args.paper,
            audit=args.audit,
            allow_incomplete=args.allow_incomplete,
        )
    except ValueError as err:
        print(f"report: error: {err}", file=sys.stderr)
        return 2
    print(f"report written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
