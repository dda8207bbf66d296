"""Acceptance in SPEED-Bench's names (``analysis.acceptance_metrics``) for every speculative cell: Average_AL and
P(step length >= k), with the histogram and the conditional rates in ``tables/speed_bench.json``."""

from __future__ import annotations

import json

from spectr_repro.analysis.acceptance_metrics import speed_bench_table
from spectr_repro.analysis.format import markdown, relative
from spectr_repro.analysis.report.context import ReportContext

SHOWN_LENGTHS = 6  # joint rates shown in the Markdown table (all of them are in the files)


def speed_bench_section(context: ReportContext) -> str | None:
    if context.results is None or context.results.records.empty:
        return None
    table = speed_bench_table(context.results.records)
    if table.empty:
        return None
    tables = context.out_dir / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    joint = sorted((c for c in table if c.startswith("joint_")), key=lambda c: int(c.split("_")[1]))
    table.drop(columns=["Acceptance_Length_Histogram", "Conditional_Acceptance_Rate", "Joint_Acceptance_Rate"]
               ).to_csv(tables / "speed_bench.csv", index=False, float_format="%.4f")
    records = [{k: ({str(n): v for n, v in value.items()} if isinstance(value, dict) else value)
                for k, value in row.items() if not k.startswith("joint_")} for row in table.to_dict("records")]
    (tables / "speed_bench.json").write_text(json.dumps(records, indent=1) + "\n", encoding="utf-8")
    shown = table[["model_pair", "dataset", "method", "K", "L", "temperature", "Average_AL", *joint[:SHOWN_LENGTHS]]]
    shown = shown.rename(columns={c: f"P(len>={c.split('_')[1]})" for c in joint}).copy()
    for column in shown.columns[6:]:
        shown[column] = shown[column].map(lambda v: "" if v != v else f"{v:.3f}")  # NaN: length never reached
    return "\n".join([
        "## Acceptance in SPEED-Bench's names", "",
        "The metrics of NVIDIA Model-Optimizer's specdec_bench (`acceptance_rate.py`), from each cell's records: a "
        "step is one target call, its length the tokens it emitted (accepted + 1). Average_AL is the mean over "
        "prompts of each prompt's mean step length; P(len>=k) is the joint acceptance rate at k. The histograms "
        "and conditional "
        f"rates are in [speed_bench.json]({relative(tables / 'speed_bench.json', context.out_dir)}).", "",
        markdown(shown), ""])
