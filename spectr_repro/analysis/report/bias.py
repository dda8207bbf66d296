"""Bias on real models: one line per method and setting (the pooled rows of ``bias/bias.csv``) and a figure of
the first-token law at the context where a rule's estimated bias is largest."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import pandas as pd
from statsmodels.stats.multitest import multipletests

from spectr_repro.analysis.format import markdown, relative
from spectr_repro.analysis.load import METHOD_LABELS
from spectr_repro.analysis.report.context import BiasData, ReportContext

BIAS_METHOD = (
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
    "over contexts; per-context values and bootstrap intervals in bias.csv). Verdicts: a rule's verdict is the "
    "pooled test's (one test per method and setting, level 0.05). A single context counts as a detection only under "
    "Holm's correction over the contexts of its method and setting (family-wise error 0.05): uncorrected, a lossless "
    "rule would read 'bias detected' at one of 16 contexts 56 % of the time. The figure's context is chosen among "
    "Holm's rejections."
)

FAMILY = ("model_pair", "dataset", "method", "K", "L", "temperature", "draft_temperature")  # one pooled test each


def bias_section(context: ReportContext) -> str | None:
    """None without a bias.csv."""
    if context.bias is None:
        return None
    table = context.bias.table
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
    lines = ["## Bias on real models", "", BIAS_METHOD, "", markdown(shown.astype(str)), ""]
    figure = bias_figure(context.bias, context.out_dir)
    if figure is not None:
        lines += [f"![first-token law where the bias is largest]({relative(figure, context.out_dir)})", ""]
    return "\n".join(lines)


def worst_context(table: pd.DataFrame) -> pd.Series | None:
    """The (rule, context) row with the largest estimated TV among those whose test rejects (the estimate is
    only read where the test rejects: a lossless rule's estimate is noise); without any detection, the one with
    the most evidence of one (smallest p). None without rule rows."""
    rules = table[~table.context.astype(str).str.startswith("pooled") & ~table.method.str.startswith("control")]
    if rules.empty:
        return None
    detected = rules[holm_rejected(rules)]
    if not detected.empty:
        return detected.sort_values("tv_estimate", ascending=False).iloc[0]
    return rules.sort_values(["p_value", "tv_estimate"], ascending=[True, False]).iloc[0]


def holm_rejected(contexts: pd.DataFrame, alpha: float = 0.05) -> pd.Series:
    """Per-context rows (no pooled rows) -> bool Series: rejected by Holm's step-down over the contexts of the same
    method and setting (statsmodels' multipletests), at family-wise level ``alpha``."""
    rejected = pd.Series(False, index=contexts.index)
    for _, family in contexts.groupby(list(FAMILY), dropna=False):
        rejected.loc[family.index] = multipletests(family.p_value.astype(float).to_numpy(), alpha=alpha,
                                                   method="holm")[0]
    return rejected


def _context_record(bias: BiasData, row: pd.Series) -> dict | None:
    """The bias command's record of ``row`` (its ``contexts/<setting>/<context>/<method>.json``)."""
    record = None
    for path in bias.csv_paths:
        for candidate in sorted(path.parent.glob(f"contexts/*/*/{row.method}.json")):
            data = json.loads(candidate.read_text())
            if (data["context"], data["K"], data["L"], data["temperature"], data["model_pair"]) == (
                    row.context, row.K, row.L, row.temperature, row.model_pair):
                record = data
    return record


def bias_figure(bias: BiasData, out_dir: Path) -> Path | None:
    """Bars of p and of the rule's estimated first-token law at :func:`worst_context`; legend below the axes."""
    matplotlib.use("Agg")

    worst = worst_context(bias.table)
    record = None if worst is None else _context_record(bias, worst)
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
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)  # off the data
    fig.tight_layout()
    path = out_dir / "figures" / "bias_first_token.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
