"""Quality parity with AR, from the files `python -m spectr_repro quality <dir>` writes (``load.QualityFiles``):
the scores per cell (accuracy with its Wilson interval, the difference with AR with its Newcombe interval) and,
where present, each method paired with AR on the same prompts (McNemar). Scores nothing: scoring HumanEval
executes model-written code, the quality command's business."""

from __future__ import annotations

import pandas as pd

from spectr_repro.analysis.format import bounds_text, interval_text, markdown
from spectr_repro.analysis.load import QualityFiles
from spectr_repro.analysis.report.context import ReportContext
from spectr_repro.analysis.stats import quality_parity

QUALITY_SETTING = ("experiment", "dataset", "model_pair", "temperature", "max_new_tokens")
UNINFORMATIVE_WIDTH = 0.5  # an AR interval wider than half the [0, 1] range cannot tell methods apart
HEADING = ["## Quality parity with AR", ""]
SCORES_COLUMNS = ["dataset", "model_pair", "temperature", "method", "K", "L", "lossless", "metric", "n",
                  "accuracy", "vs_ar", "agrees_with_ar"]


def quality_section(context: ReportContext) -> str | None:
    """The section; a file that cannot be read or rendered is reported in it rather than losing the report."""
    if context.quality is None:
        return None
    try:
        if isinstance(context.quality, Exception):
            raise context.quality
        return "\n".join(HEADING + quality_lines(context.quality))
    except Exception as error:  # an optional section must not lose the report's tables and figures
        return "\n".join(HEADING + [f"Quality files could not be read: {type(error).__name__}: {error}", ""])


def quality_lines(files: QualityFiles) -> list[str]:
    if files.scores is None:
        if files.outcomes is not None:
            return paired_lines(files.outcomes)
        return ["Not computed for these results. `python -m spectr_repro quality <results_dir>` scores "
                "HumanEval pass@1 and GSM8K/MGSM exact match against AR (HumanEval scoring executes "
                "model-written code); the report then reads its quality.csv.", ""]
    scored, collapsed_lines, collapsed = collapse_uninformative_quality(files.scores)
    lines = scores_lines(scored)
    if collapsed_lines:
        lines += ["Settings that cannot tell the rules apart (collapsed):", "", *collapsed_lines, ""]
    if files.unscored:
        lines += [f"Not scored (no quality.csv): {', '.join(str(f) for f in files.unscored)}.", ""]
    return lines + (paired_lines(files.outcomes, collapsed) if files.outcomes is not None else [])


def sandbox_sentence(scores: pd.DataFrame) -> str:
    """Which sandbox the HumanEval programs of ``scores`` ran in (its ``sandbox`` column names the mode)."""
    if scores.empty or "humaneval" not in set(scores.get("dataset", ())):
        return "No HumanEval programs were run."
    modes = sorted({str(m) for m in scores.loc[scores.dataset == "humaneval"].get("sandbox", pd.Series(dtype=object))
                    if isinstance(m, str)})
    if not modes:
        return "HumanEval programs ran in a sandbox this file does not record (scored by an older harness)."
    humaneval = scores.loc[scores.dataset == "humaneval"]
    described = dict(zip(humaneval.sandbox, humaneval.get("sandbox_description", pd.Series(dtype=object))))
    return "HumanEval programs ran in the sandbox " + "; ".join(
        f"**{m}**" + (f" ({described[m]})" if isinstance(described.get(m), str) else "") for m in modes) + "."


def scores_lines(scores: pd.DataFrame) -> list[str]:
    """One row per scored cell: accuracy with its Wilson interval, the difference with AR (Newcombe)."""
    lines = [
        "HumanEval pass@1 **executes model-written code** (`spectr_repro.quality.sandbox`). "
        + sandbox_sentence(scores) + " "
        "GSM8K/MGSM: exact match of the extracted final answer. Intervals: Wilson 95 % for accuracy, "
        "Newcombe 95 % for the difference with AR (independent-sample, conservative). A lossless rule "
        "should agree with AR (0 inside the difference interval) in about 95 % of settings.",
        "",
    ]
    if scores.empty:
        return lines + ["No HumanEval, GSM8K or MGSM cells with records found.", ""]
    shown = scores.assign(
        accuracy=[interval_text(a, lo, hi, digits=3) for a, lo, hi in zip(scores.accuracy, scores.ci_low,
                                                                           scores.ci_high)],
        vs_ar=["" if pd.isna(low) else interval_text(d, low, high, digits=3, signed=True)
               for d, low, high in zip(scores.accuracy - scores.ar_accuracy, scores.diff_low, scores.diff_high)],
    )[SCORES_COLUMNS]
    return lines + [shown.to_markdown(index=False), ""]


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
                     f"{int(row.correct)}/{int(row.n)} {bounds_text(row.ci_low, row.ci_high, digits=3)}; {reason}: "
                     f"its {len(group)} rows say nothing about the rules and are not shown.")
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


def paired_lines(outcomes: pd.DataFrame, collapsed: list[dict] | None = None) -> list[str]:
    """Each method against AR on the same prompts (McNemar exact, Wilson intervals), leaving out the settings
    collapsed in the scores table (``collapse_uninformative_quality``)."""
    parity = quality_parity(outcomes)
    if collapsed:
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
    shown = pd.DataFrame(
        {
            **{c: parity[c] for c in ("dataset", "model_pair", "temperature", "method", "K", "L") if c in parity},
            "n paired": parity["n_paired"],
            "accuracy": [interval_text(*v, digits=3) for v in zip(parity.accuracy, parity.accuracy_low,
                                                                   parity.accuracy_high)],
            "AR": [interval_text(*v, digits=3) for v in zip(parity.baseline_accuracy, parity.baseline_low,
                                                             parity.baseline_high)],
            "only method": parity["only_method"],
            "only AR": parity["only_baseline"],
            "p (McNemar)": parity["p_value"].map("{:.3g}".format),
        }
    )
    return lines + [markdown(shown.astype(str)), ""]
