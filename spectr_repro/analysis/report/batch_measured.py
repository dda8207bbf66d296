"""Speed-up against batch size, measured (issue 50): the timed groups of ``bench --preset batch_qwen``
(``bench_batch.json``: B prompts decoded together by AR and each rule, paired over groups) beside the one cost
model's prediction for the same groups, and the batch B* past which each rule stops beating AR (and each
multi-draft rule stops beating SD at the same L), as measured here."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from spectr_repro.analysis.figures import legend_outside, method_color, save_figure
from spectr_repro.analysis.format import markdown, relative
from spectr_repro.analysis.report.context import ReportContext
from spectr_repro.verify import VERIFIERS, method_labels

FILE = "bench_batch.json"
FOLDER = "speedup_batch"  # results/speedup_batch/bench_batch.json, beside the other committed results


def find_batch_bench(folders: list[Path]) -> Path | None:
    """bench_batch.json in a reported folder or in ``speedup_batch`` beside one. Never looked up from the working
    directory: a report of a folder outside results/ must not pick up this checkout's committed measurement."""
    candidates = [c for folder in folders for c in (folder / FILE, folder.parent / FOLDER / FILE)]
    return next((c for c in candidates if c.is_file()), None)


def load_cells(path: Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The measured cells and the whole result (ValueError for a file without them)."""
    data = json.loads(path.read_text())
    batches = data.get("batches") or {}
    if not batches.get("cells"):
        raise ValueError(f"{path} holds no timed batch cells")
    return pd.DataFrame(batches["cells"]), data


def crossover(cells: pd.DataFrame, method: str, K: int, L: int, against: dict[int, float] | None = None
              ) -> str:
    """The first measured B at which the rule's speed-up is at or below AR's (1.0) or ``against``'s at that B."""
    mine = cells[(cells["method"] == method) & (cells["K"] == K) & (cells["L"] == L)].sort_values("B")
    for row in mine.itertuples(index=False):
        baseline = 1.0 if against is None else against.get(int(row.B), math.nan)
        if row.speedup <= baseline:
            return str(int(row.B))
    return f"beyond {int(mine['B'].max())}" if len(mine) else "-"


def _interval(row, prefix: str = "") -> str:
    low, high = getattr(row, f"{prefix}speedup_low"), getattr(row, f"{prefix}speedup_high")
    point = getattr(row, f"{prefix}speedup")
    return f"{point:.2f}" + ("" if math.isnan(low) else f" [{low:.2f}, {high:.2f}]")


def batch_measured_section(context: ReportContext) -> str | None:
    path = find_batch_bench(context.folders)
    if path is None:
        return None
    try:
        cells, data = load_cells(path)
    except (OSError, ValueError, KeyError) as error:
        return f"## Speed-up against batch size (measured)\n\n{path}: unreadable ({error}).\n"
    out = context.out_dir
    (out / "tables").mkdir(parents=True, exist_ok=True)
    cells.to_csv(out / "tables" / "batch_speedup_measured.csv", index=False, float_format="%.4f")
    labels = method_labels()
    table = pd.DataFrame([{
        "rule": f"{labels[r.method]} K={r.K} L={r.L}", "B": int(r.B), "groups": int(r.groups),
        "tokens per call": f"{r.tokens_per_call:.2f}", "measured (95 %)": _interval(r),
        "predicted": f"{r.predicted:.2f}", "error": f"{100 * r.error:+.0f} %",
        "after prefill (95 %)": _interval(r, "decode_"), "predicted ": f"{r.decode_predicted:.2f}",
        "error ": f"{100 * r.decode_error:+.0f} %"} for r in cells.itertuples(index=False)])
    verdicts = []
    for (method, K, L), _ in cells.groupby(["method", "K", "L"], sort=False):
        sd = cells[(cells["method"] == "sd") & (cells["L"] == L)].set_index("B")["speedup"].to_dict()
        multi = not VERIFIERS[method].single_draft and K > 1
        verdicts.append({"rule": f"{labels[method]} K={K} L={L}", "B* vs AR (measured)": crossover(cells, method, K, L),
                         "B* vs SD at the same L": crossover(cells, method, K, L, sd) if multi and sd else ""})
    bench = data["batches"]
    settings = bench["settings"]
    paths = save_figure(_figure(cells, labels), out / "figures" / "batch_speedup_measured")
    return "\n".join([
        "## Speed-up against batch size (measured)", "",
        f"`{data.get('command', 'bench --preset batch_qwen')}` on {data.get('date', '?')} "
        f"({(data.get('environment') or {}).get('device_name', 'this machine')}): {settings['prompts']} prompts of "
        f"{', '.join(settings['datasets'])} taken in turn and cut into groups of B, each group decoded by AR and by "
        f"every rule with the same seeds ({settings['max_new_tokens']} tokens a prompt, EOS off, "
        f"T={settings['temperature']}), in an order rotating between groups. Speed-up: AR's seconds over the rule's "
        "on the same group, AR at the same B; 95 % t interval over the groups (none from a single group). "
        "Predicted: the one cost model on the same groups' calls, calibrated in the same process "
        f"({bench['costs_source']}). "
        f"Median |error| {100 * bench['median_abs_error']:.1f} % (worst {100 * bench['worst_abs_error']:.1f} %) end "
        f"to end; {100 * bench['decode_median_abs_error']:.1f} % (worst "
        f"{100 * bench['decode_worst_abs_error']:.1f} %) after the prefill." + retimed(bench), "",
        f"![measured speed-up against batch size]({relative(paths[0], out)})", "",
        markdown(pd.DataFrame(verdicts)), "",
        markdown(table), "",
        f"Every cell: [batch_speedup_measured.csv]({relative(out / 'tables' / 'batch_speedup_measured.csv', out)});"
        f" the groups' raw seconds and calls: `{path}`.", ""])


def _figure(cells: pd.DataFrame, labels: dict[str, str]) -> Figure:
    figure = Figure(figsize=(10.0, 3.6), layout="constrained")  # constrained: the legend outside, off the panels
    axes = figure.subplots(1, 2, sharey=True)
    for ax, (prefix, title) in zip(axes, (("", "end to end"), ("decode_", "after the prefill"))):
        for (method, K, L), rows in cells.groupby(["method", "K", "L"], sort=False):
            rows = rows.sort_values("B")
            color = method_color(method)
            low = (rows[f"{prefix}speedup"] - rows[f"{prefix}speedup_low"]).fillna(0).clip(lower=0)
            high = (rows[f"{prefix}speedup_high"] - rows[f"{prefix}speedup"]).fillna(0).clip(lower=0)
            marker = "o" if L == cells["L"].min() else "s"
            ax.errorbar(rows["B"], rows[f"{prefix}speedup"], yerr=[low, high], color=color, marker=marker,
                        markersize=4, capsize=2, linewidth=1, label=f"{labels[method]} K={K} L={L}")
            ax.plot(rows["B"], rows[f"{prefix}predicted"], color=color, linestyle=":", linewidth=1)
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xscale("log", base=2)
        batches = sorted(set(cells["B"]))
        ax.set_xticks(batches, [str(int(B)) for B in batches])
        ax.set_xlabel("prompts in a batch (B)")
        ax.set_title(f"{title} (dotted: predicted)", fontsize=9)
    # Scaled to the speed-ups, not to the intervals: two groups give a t interval 12.7 standard errors wide, which
    # would flatten every line; an interval that leaves the axes is cut at its edge (the table has it whole).
    points = cells[["speedup", "predicted", "decode_speedup", "decode_predicted"]].to_numpy()
    axes[0].set_ylim(0.0, max(1.5, 1.25 * float(points.max())))
    axes[0].set_ylabel("speed-up over AR at the same B")
    figure.suptitle("95 % intervals over groups, cut at the axes' edge", fontsize=8)
    legend_outside(figure, axes[-1])
    return figure


def retimed(bench: dict) -> str:
    """What the calibration alone gave, where each group's forwards were timed again just before it."""
    if "calibration_median_abs_error" not in bench:
        return ""
    return (" Each group's forwards were timed again just before it (a shared VM's speed drifts within the hour); "
            f"from the calibration alone: {100 * bench['calibration_median_abs_error']:.1f} % (worst "
            f"{100 * bench['calibration_worst_abs_error']:.1f} %) end to end.")


__all__ = ["batch_measured_section", "crossover", "find_batch_bench", "load_cells"]
