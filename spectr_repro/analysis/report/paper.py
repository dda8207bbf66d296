"""The paper's numbers section: its averages per model pair, numbers seen without labels, and the authors'
code release's own numbers with how its metrics differ from ours."""

from __future__ import annotations

import pandas as pd

from spectr_repro.analysis.format import AVERAGE
from spectr_repro.analysis.load import METHOD_LABELS, METHOD_ORDER, ordered
from spectr_repro.analysis.report.context import ReportContext
from spectr_repro.analysis.tables import METRICS
from spectr_repro.paper import PAPER_SOURCE, release_numbers, unlabelled_numbers

# How the authors' release measures (its README and code), where it differs from this harness's definitions.
RELEASE_METRIC_NOTE = (
    "The release's metrics are not ours: its block efficiency counts every token generated before the output is "
    "truncated (a last block that runs past the end of the text or the token budget counts whole); ours is the new "
    "tokens kept (emission stops at EOS and at max_new_tokens, and the last block is drafted only as long as the "
    "tokens still wanted) per target call, bonus or correction included (AR = 1.00). Its acceptance rate is "
    "accepted draft tokens / (K·L), over all K drafts; ours is per position (P(depth i accepted | reached)). Its "
    "numbers are therefore set beside ours, never differenced with them."
)


def _two_decimals(wide: pd.DataFrame) -> str:
    return wide.map(lambda v: "" if pd.isna(v) else f"{v:.2f}").rename_axis("method").to_markdown(
        disable_numparse=True)


def paper_section(context: ReportContext) -> str | None:
    paper = context.paper
    if paper is None:
        return None
    labelled = paper[(paper["model_pair"] != "") & (paper["metric"].isin(METRICS)) & (paper["dataset"] == AVERAGE)]
    lines = [
        "## The paper's numbers",
        "",
        f"Source: {PAPER_SOURCE}; kept in `spectr_repro/paper_numbers.csv`. Blank = not reported (never filled in).",
        "",
    ]
    if not labelled.empty:
        wide = labelled.pivot_table(index="method", columns=["model_pair", "metric"], values="value")
        wide = wide.reindex(index=ordered(wide.index, METHOD_ORDER))
        wide.index = [METHOD_LABELS.get(m, m) for m in wide.index]
        wide.columns = [
            f"{pair} {'BE' if metric == 'block_efficiency' else 'speed-up'}" for pair, metric in wide.columns
        ]
        lines += ["Averages over the five datasets:", "", _two_decimals(wide), ""]
    unlabelled = unlabelled_numbers(paper)
    if not unlabelled.empty:
        lines += ["Seen without setting labels (model pair unknown, so never placed in a table above):", ""]
        lines += [f"- {METHOD_LABELS.get(row.method, row.method)}, {row.dataset or '—'}, {row.metric}: {row.value:g}"
                  for row in unlabelled.itertuples(index=False)]
        lines.append("")
    lines += release_lines(paper)
    return "\n".join(lines)


def release_lines(paper: pd.DataFrame) -> list[str]:
    """The authors' code release's own numbers (experiment=release_humaneval) and how its metrics differ."""
    rows = release_numbers(paper)
    if rows.empty:
        return []
    wide = rows.pivot_table(index="method", columns=["model_pair", "metric"], values="value")
    wide.index = [METHOD_LABELS.get(m, m.upper()) for m in wide.index]
    wide.columns = [f"{pair} {'BE' if metric == 'block_efficiency' else 'tok/s'}" for pair, metric in wide.columns]
    return ["### The authors' code release (its own HumanEval setting, `experiment=release_humaneval`)", "",
            f"Source: {rows['source'].iloc[0]}.", "", _two_decimals(wide), "", RELEASE_METRIC_NOTE, ""]
