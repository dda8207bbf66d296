"""Speed-up against batch size, predicted (issue 50): the replay's tokens per call at its main setting priced on the
roofline of each accelerator in ``cost/accelerators.yaml`` at B = 1 ... 256 prompts (``cost.batch_speedup``), with the
batch B* past which each rule stops beating AR and past which the multi-draft rules stop beating SD. A MODEL (spec-
sheet peaks, ideal kernels, no per-forward overhead, no rule time), not a measurement. The same cost model, calibrated
on this CPU, is checked against timed groups at B = 1 ... 8 in the next section (``batch_measured``) when the batch
bench's file is there."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from spectr_repro.analysis.figures import legend_outside, method_color, method_dash, save_figure
from spectr_repro.analysis.format import AVERAGE, markdown, relative
from spectr_repro.analysis.report.batch_measured import find_batch_bench
from spectr_repro.analysis.report.context import ReportContext
from spectr_repro.cost.batch_speedup import BATCHES, LABEL, batch_speedups
from spectr_repro.cost.roofline import PAPER_CONTEXT, load_accelerators
from spectr_repro.cost.shapes import pair_shapes
from spectr_repro.verify import VERIFIERS, method_labels

SHOWN_BATCHES = (1, 8, 32, 128, 256)


def predicted_batch_table(replay_table: pd.DataFrame, pair: str, K: int, L: int) -> pd.DataFrame:
    """Speed-up over AR at each B on each accelerator, every replayed rule at (K, L) (single-draft ones at K = 1),
    from the replay's tokens per call on the average over datasets (the only dataset where there is one)."""
    rows = replay_table[(replay_table["L"] == L) & (replay_table["model_pair"] == pair)]
    datasets = set(rows["dataset"])
    rows = rows[rows["dataset"] == (AVERAGE if AVERAGE in datasets else sorted(datasets)[0])]
    tokens = {("ar", 1, 1): 1.0}
    for row in rows.itertuples(index=False):
        if int(row.K) == (1 if VERIFIERS[row.method].single_draft else K):
            tokens[(row.method, int(row.K), L)] = float(row.tokens_per_call)
    grid = [("ar", 1, 1)] + sorted((m, k, l_) for m, k, l_ in tokens if m != "ar")
    target, draft = pair_shapes(pair)
    frames = [batch_speedups(target, draft, device.rates(), tokens, PAPER_CONTEXT, BATCHES, grid).assign(
        accelerator=device.name) for device in load_accelerators().values()]
    return pd.concat(frames, ignore_index=True)


def crossover(table: pd.DataFrame, method: str, against: pd.Series | float) -> int | None:
    """The first B at which ``method``'s speed-up is at or below ``against`` (AR: 1.0; or SD's speed-ups by B)."""
    mine = table[table["method"] == method].set_index("B")["speedup"]
    baseline = against if isinstance(against, pd.Series) else pd.Series(against, index=mine.index)
    below = [int(B) for B in mine.index if mine[B] <= baseline.get(B, float("nan"))]
    return min(below) if below else None


def _one_temperature(table: pd.DataFrame) -> pd.DataFrame:
    """The replay's rows at its middle temperature (the grid's main T = 0.4 of 0.1, 0.4, 0.7)."""
    temperatures = sorted(set(table["temperature"]))
    return table[table["temperature"] == temperatures[len(temperatures) // 2]]


def batch_section(context: ReportContext) -> str | None:
    replay = context.replay
    if replay is None or replay.table.empty:
        return None
    pair = str(replay.table["model_pair"].iloc[0])
    try:
        table = predicted_batch_table(_one_temperature(replay.table), pair, replay.K, replay.L)
    except (KeyError, ValueError, OSError):  # a pair without packaged shapes: nothing to price
        return None
    out = context.out_dir
    (out / "tables").mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "tables" / "batch_speedup_predicted.csv", index=False, float_format="%.4f")
    labels = method_labels()
    rows = []
    for accelerator, part in table.groupby("accelerator", sort=False):
        sd = part[part["method"] == "sd"].set_index("B")["speedup"]
        for method in dict.fromkeys(part["method"]):
            if method == "ar":
                continue
            mine = part[part["method"] == method].set_index("B")["speedup"]
            K = int(part.loc[part["method"] == method, "K"].iloc[0])
            row = {"accelerator": accelerator, "rule": f"{labels[method]} K={K}"}
            row.update({f"B={B}": f"{mine[B]:.2f}" for B in SHOWN_BATCHES})
            past_ar = crossover(part, method, 1.0)
            row["B* vs AR"] = "beyond 256" if past_ar is None else str(past_ar)
            if not VERIFIERS[method].single_draft and not sd.empty:
                past_sd = crossover(part, method, sd)
                row["B* vs SD"] = "beyond 256" if past_sd is None else str(past_sd)
            else:
                row["B* vs SD"] = ""
            rows.append(row)
    figure = _figure(table, labels)
    paths = save_figure(figure, out / "figures" / "batch_speedup_predicted")
    return "\n".join([
        "## Speed-up against batch size (predicted)", "",
        f"The replay's tokens per call (K={replay.K}, L={replay.L}; single-draft rules K=1; average over datasets) "
        f"priced for {pair}'s shapes at {PAPER_CONTEXT} cached tokens on each accelerator's roofline, against AR at "
        f"the same batch: {LABEL}. B* is the first batch at which a rule no longer beats AR (or SD). "
        + ("The same cost model, calibrated on this CPU, is checked against timed groups at B > 1 in the next section."
           if find_batch_bench(context.folders) else "Not checked against timed groups at B > 1 here (no "
           "results/speedup_batch/bench_batch.json: `python -m spectr_repro bench --preset batch_qwen`)."), "",
        f"![speed-up against batch size]({relative(paths[0], out)})", "",
        markdown(pd.DataFrame(rows)), "",
        f"Every (rule, B, accelerator): [batch_speedup_predicted.csv]"
        f"({relative(out / 'tables' / 'batch_speedup_predicted.csv', out)}).", ""])


def _figure(table: pd.DataFrame, labels: dict[str, str]) -> Figure:
    accelerators = list(dict.fromkeys(table["accelerator"]))
    figure = Figure(figsize=(3.2 * len(accelerators) + 1.6, 3.2), layout="constrained")  # the legend off the panels
    axes = figure.subplots(1, len(accelerators), sharey=True, squeeze=False)[0]
    for ax, accelerator in zip(axes, accelerators):
        part = table[(table["accelerator"] == accelerator) & (table["method"] != "ar")]
        for method, rows in part.groupby("method", sort=False):
            ax.plot(rows["B"], rows["speedup"], color=method_color(method), linestyle=method_dash(method),
                    label=f"{labels[method]} K={int(rows['K'].iloc[0])}")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(BATCHES), [str(B) for B in BATCHES], fontsize=7)
        ax.set_title(accelerator, fontsize=9)
        ax.set_xlabel("prompts in a batch (B)")
    axes[0].set_ylabel("predicted speed-up over AR")
    figure.suptitle("A model (roofline), not a measurement", fontsize=9)
    legend_outside(figure, axes[-1])
    return figure
