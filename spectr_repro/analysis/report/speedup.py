"""The speed-up section: predicted speed-up of every replayed rule against L and K, the fastest lossless
configuration, the model checked against the timed cells, and where the time goes."""

from __future__ import annotations

from spectr_repro.analysis.format import relative
from spectr_repro.analysis.report.context import ReportContext
from spectr_repro.analysis.speedup_report import (
    agreement_markdown,
    agreement_sentence,
    breakdown_figure,
    breakdown_markdown,
    curve_figure,
    fastest_text,
    predictions_markdown,
)

PREDICTIONS_CSV = "speedup_predictions.csv"
REPLAY_CSV = "replay_speedups.csv"
AGREEMENT_CSV = "speedup_agreement.csv"
BREAKDOWN_CSV = "time_breakdown.csv"


def speedup_section(context: ReportContext) -> str | None:
    data = context.speedup
    if data is None:
        return None
    out_dir, K, L = context.out_dir, data.K, data.L
    tables = out_dir / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    data.prediction.table.to_csv(tables / PREDICTIONS_CSV, index=False)
    for root in context.replay.roots if context.replay is not None else []:
        data.prediction.table.to_csv(root / REPLAY_CSV, index=False)  # beside replay_summary.csv
    lines = ["## Speed-up, predicted from shared blocks and measured costs", "",
             "Speed-up over AR of the decoding loop = replayed tokens per target call × AR's seconds per token / "
             f"seconds per call. Costs: {data.costs.source}: forwards at the call's shapes and context, every rule's "
             "call timed on real blocks, each engine section's overhead fitted on real decodes "
             "(`python -m spectr_repro check`). 95 % intervals resample prompts (paired across rules) and carry the "
             "spread of the cost measurements. Prefill is left out here (it is the same for every rule); the timed "
             "cells' speed-ups below include it, and so do their predictions. "
             f"Every prediction: `{relative(tables / PREDICTIONS_CSV, out_dir)}`.", "",
             fastest_text(data.prediction), "",
             f"### Predicted speed-up at the main setting (K={K}, L={L})", "",
             predictions_markdown(data.prediction, K, L), ""]
    for axis, fixed in (("L", K), ("K", L)):
        path = curve_figure(data.prediction, axis, fixed, out_dir / "figures" / f"speedup_vs_{axis}.png")
        if path is not None:
            lines += [f"![predicted speed-up vs {axis}]({relative(path, out_dir)})", ""]
    lines += ["### Checked against timed cells", "",
              "Each timed cell's measured speed-up (AR's wall time over the rule's on the same prompts, each decoded "
              "alone) beside the model's, for the cell's own prompts: from the replay's tokens per call (what a user "
              "gets without timing) and from the cell's own target calls (the cost model alone; a cell of a few "
              "prompts is lucky or unlucky in its block efficiency, which the first column shows and the second "
              "removes). " + agreement_sentence(data.agreement), ""]
    if not data.agreement.empty:
        data.agreement.to_csv(tables / AGREEMENT_CSV, index=False)
        lines += [agreement_markdown(data.agreement), ""]
    lines += [f"### Where the time goes (K={K}, L={L})", "",
              "Milliseconds per generated token by engine section: measured (the timed cells' sections, their "
              "datasets pooled) and predicted (the cost model at the same prompts and calls). *other* is what no "
              "section holds (the loop's own Python).", ""]
    if not data.breakdown.empty:
        data.breakdown.to_csv(tables / BREAKDOWN_CSV, index=False)
        path = breakdown_figure(data.breakdown, out_dir / "figures" / "time_breakdown.png")
        if path is not None:
            lines += [f"![where the time goes]({relative(path, out_dir)})", ""]
    lines += [breakdown_markdown(data.breakdown), ""]
    return "\n".join(lines)
