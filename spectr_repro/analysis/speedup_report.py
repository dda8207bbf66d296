"""What REPORT.md says about speed-up: the verdicts on the paper's speed-up claims, predicted speed-up against L
and K, the fastest lossless configuration, the agreement with timed cells and where the time goes.
Predictions in (``analysis.speedup``, ``analysis.speedup_cells``), markdown and figures out."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from spectr_repro.analysis.format import AVERAGE, interval_text, main_cell, main_setting_rows  # noqa: E402
from spectr_repro.analysis.speedup import (  # noqa: E402
    SpeedupPrediction,
    fastest_lossless,
    greater_verdict,
    rise_then_fall,
)
from spectr_repro.analysis.speedup_cells import agreement_summary  # noqa: E402
from spectr_repro.cost.model import SECTIONS, CallCosts  # noqa: E402
from spectr_repro.verify import VERIFIERS, method_labels  # noqa: E402

RELEASE = "spectr_gbv"


@dataclass
class SpeedupData:
    """The speed-up side of a report: the costs and where they come from, the replay's predictions, the timed
    cells' agreement with them and the time breakdown at the main setting."""

    costs: CallCosts
    prediction: SpeedupPrediction
    agreement: pd.DataFrame
    breakdown: pd.DataFrame
    K: int
    L: int


def _speedup_text(estimate: float, low: float, high: float) -> str:
    return f"{interval_text(estimate, low, high)}×"


def _difference_text(difference) -> str:
    if difference is None:
        return "not replayed"
    return interval_text(*difference, signed=True)


def _timed_text(agreement: pd.DataFrame, method: str, K: int, Ls: list[int]) -> str:
    """Measured speed-ups of the timed cells of (method, K) at the given L, beside their prediction."""
    if agreement.empty:
        return ""
    part = agreement[(agreement["method"] == method) & (agreement["K"] == K) & (agreement["L"].isin(Ls))]
    if part.empty:
        return ""
    by_L = part.groupby("L")[["measured", "predicted_own_calls"]].mean()
    return "; timed cells: " + ", ".join(f"L={L} {r.measured:.2f}× (model {r.predicted_own_calls:.2f}×)"
                                         for L, r in by_L.iterrows())


def speedup_verdict_rows(data: SpeedupData | None) -> list[dict]:
    """The verdict table's rows on speed-up: the release against SpecTr, GBV and SD at the main setting; speed-up
    rising then falling in L (its peak and interval); the fastest K. From the predictions' paired intervals
    (average over the replayed datasets), with the timed cells at those configurations beside them."""
    if data is None:
        return []
    note = f"predicted: replayed tokens per call x measured costs ({data.costs.source}), K={data.K} L={data.L}"
    rows = [_release_row(data, note), _L_row(data), _K_row(data)]
    return [row for row in rows if row is not None]


def _release_row(data: SpeedupData, note: str) -> dict | None:
    """The release against SpecTr, GBV, SD at the main setting."""
    prediction, K, L, labels = data.prediction, data.K, data.L, method_labels()
    methods = set(prediction.table["method"])
    parts, verdicts = [], []
    for other in ("spectr", "gbv", "sd"):
        if other not in methods or RELEASE not in methods:
            continue
        difference = prediction.difference(main_cell(RELEASE, K, L), main_cell(other, K, L))
        verdict, why = greater_verdict(difference, upper_bound=VERIFIERS[other].carries_state)
        verdicts.append(verdict)
        parts.append(f"−{labels[other]} {_difference_text(difference)}" + (f" ({why})" if why else ""))
    if not verdicts:
        return None
    overall = ("does not hold" if "does not hold" in verdicts else
               "holds" if all(v == "holds" for v in verdicts) else "undecided")
    return {"claim": "speed-up SpecTr-GBV > SpecTr, GBV, SD", "paper": "Table 1 speed-ups",
            "measured": f"{labels[RELEASE]} " + "; ".join(parts), "verdict": overall,
            "note": note + ". GBV's replay is its first iteration (an upper bound)."}


def _L_row(data: SpeedupData) -> dict | None:
    """Rises then falls in L (the release at the main K), with the peak's L and its interval."""
    tables, K = data.prediction.table, data.K
    Ls = sorted(set(tables.loc[(tables["method"] == RELEASE) & (tables["K"] == K), "L"]))
    curve = data.prediction.curve([(RELEASE, K, x) for x in Ls]) if Ls else None
    if curve is None:
        return None
    found = rise_then_fall(Ls, *curve)
    values = ", ".join(f"L={x}: {v:.2f}" for x, v in zip(Ls, curve[0]))
    peak = f"; peak L={found.peak} (95 % {found.peak_low}–{found.peak_high})" if found.peak is not None else ""
    return {"claim": "speed-up rises then falls with L", "paper": "L ablation (L = 12 ... 24)",
            "measured": f"{method_labels()[RELEASE]} at K={K}: {values}{peak}"
                        + _timed_text(data.agreement, RELEASE, K, Ls),
            "verdict": found.verdict, "note": f"{found.note}; on this machine ({data.costs.source})"}


def _K_row(data: SpeedupData, paper_K: int = 3) -> dict | None:
    """Is the paper's K the fastest here (the release at the main L)?"""
    prediction, tables, L = data.prediction, data.prediction.table, data.L
    Ks = sorted(set(tables.loc[(tables["method"] == RELEASE) & (tables["L"] == L), "K"]))
    curve = prediction.curve([(RELEASE, k, L) for k in Ks]) if len(Ks) > 1 else None
    if curve is None:
        return None
    found = rise_then_fall(Ks, *curve) if len(Ks) >= 3 else None
    best = Ks[int(curve[0].argmax())]
    others = [prediction.difference((RELEASE, best, L), (RELEASE, k, L)) for k in Ks if k != best]
    decided = all(d is not None and d[1] > 0 for d in others)
    if best == paper_K:
        verdict = "holds" if decided else "undecided"
    else:
        against = prediction.difference((RELEASE, best, L), (RELEASE, paper_K, L)) if paper_K in Ks else None
        verdict = "does not hold" if against is not None and against[1] > 0 else "undecided"
    interval = f" (95 % K {found.peak_low}–{found.peak_high})" if found is not None else ""
    return {"claim": f"K = {paper_K} (the paper's main setting) is the fastest K", "paper": "K ablation, Table 1",
            "measured": f"fastest K here: {best}{interval}; " + ", ".join(f"K={k}: {v:.2f}"
                                                                         for k, v in zip(Ks, curve[0])),
            "verdict": verdict, "note": f"{method_labels()[RELEASE]} at L={L}; "
            + ("every other K significantly slower" if decided else "some K within noise of it")}


# --------------------------------------------------------------------------------------------------
# Tables and figures


def predictions_markdown(prediction: SpeedupPrediction, K: int, L: int) -> str:
    """Predicted speed-up at the main setting per method and dataset (the average last)."""
    frame = main_setting_rows(prediction.table, K, L, lambda r: _speedup_text(r.speedup, r.ci_low, r.ci_high),
                              lambda method: {"lossless": "yes" if VERIFIERS[method].lossless else "no"})
    return "_no prediction at the main setting_" if frame.empty else frame.to_markdown(index=False)


def curve_figure(prediction: SpeedupPrediction, axis: str, fixed: int, path: Path) -> Path | None:
    """Predicted speed-up (average over datasets) against ``axis`` ("L" or "K") at the other fixed, one line per
    method with its 95 % band."""
    table = prediction.table[prediction.table["dataset"] == AVERAGE]
    if table.empty:
        table = prediction.table
    other = "K" if axis == "L" else "L"
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    drawn = 0
    for method, part in table.groupby("method", sort=False):
        value = 1 if (other == "K" and VERIFIERS[method].single_draft) else fixed
        part = part[part[other] == value].sort_values(axis)
        if len(part) < 2:
            continue
        label = method_labels()[method] + (" (1st iter.)" if VERIFIERS[method].carries_state else "")
        line, = ax.plot(part[axis], part["speedup"], marker="o", label=label)
        ax.fill_between(part[axis], part["ci_low"], part["ci_high"], alpha=0.15, color=line.get_color())
        drawn += 1
    if not drawn:
        plt.close(fig)
        return None
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlabel(axis)
    ax.set_ylabel("predicted speed-up over AR (decoding)")
    ax.set_title(f"Predicted speed-up vs {axis} ({other}={fixed}; 95 % bands)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def agreement_markdown(agreement: pd.DataFrame) -> str:
    if agreement.empty:
        return "_no timed cell with a comparable speed-up_"
    frame = pd.DataFrame({
        "cell": agreement["method"] + " K=" + agreement["K"].astype(str) + " L=" + agreement["L"].astype(str),
        "dataset": agreement["dataset"], "T": agreement["temperature"], "prompts": agreement["prompts"],
        "measured": [_speedup_text(r.measured, r.measured_low, r.measured_high) for r in agreement.itertuples()],
        "predicted (replay)": [("-" if pd.isna(r.predicted) else
                                _speedup_text(r.predicted, r.predicted_low, r.predicted_high))
                               for r in agreement.itertuples()],
        "error (replay)": [("-" if pd.isna(r.error) else f"{100 * r.error:+.0f} %") for r in agreement.itertuples()],
        "predicted (own calls)": [f"{r.predicted_own_calls:.2f}×" for r in agreement.itertuples()],
        "error (own calls)": [f"{100 * r.error_own_calls:+.0f} %" for r in agreement.itertuples()],
    })
    return frame.to_markdown(index=False)


def agreement_sentence(agreement: pd.DataFrame) -> str:
    parts = []
    for column, what in (("error_own_calls", "the cost model at the cells' own target calls"),
                         ("error", "the replay's tokens per call and the cost model")):
        found = agreement_summary(agreement, column)
        if found is not None:
            parts.append(f"{what}: median |error| {100 * found['median']:.1f} %, worst {100 * found['worst']:.1f} % "
                         f"over {found['cells']} cells")
    if not parts:
        return "No timed cell of this pair to check the model against."
    worst = agreement.loc[agreement["error_own_calls"].abs().idxmax()]
    return ("; ".join(parts) + f". The worst cell is {worst['method']} K={worst['K']} L={worst['L']} on "
            f"{worst['dataset']} ({100 * worst['error_own_calls']:+.0f} %).")


def breakdown_markdown(breakdown: pd.DataFrame) -> str:
    if breakdown.empty:
        return "_no timed cell at the main setting_"
    frame = breakdown.copy()
    frame["total"] = frame[["prefill", *SECTIONS]].sum(axis=1)
    return frame.round(1).to_markdown(index=False)


def breakdown_figure(breakdown: pd.DataFrame, path: Path) -> Path | None:
    """Stacked bars: ms per generated token by section, measured and predicted side by side per method."""
    if breakdown.empty:
        return None
    fig, ax = plt.subplots(figsize=(max(6.0, 0.7 * len(breakdown)), 4.2))
    labels = [f"{r.method}\n{r.source.split(' ')[0][:4]}." for r in breakdown.itertuples()]
    bottom = [0.0] * len(breakdown)
    for section in ("prefill", *SECTIONS):
        values = breakdown[section].fillna(0.0).tolist()
        ax.bar(range(len(values)), values, bottom=bottom, label=section)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set_ylabel("ms per generated token")
    ax.set_title("Where the time goes (meas. = timed cells' sections, pred. = cost model)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def fastest_text(prediction: SpeedupPrediction) -> str:
    best = fastest_lossless(prediction)
    if best is None:
        return "No lossless configuration was replayed."
    share = best.get("share_fastest")
    return (f"Fastest lossless configuration predicted here (average over the replayed datasets): "
            f"**{method_labels()[best['method']]} K={best['K']} L={best['L']}**, "
            f"{_speedup_text(best['speedup'], best['ci_low'], best['ci_high'])} over AR"
            + (f"; it is the fastest in {100 * share:.0f} % of the bootstrap replicates" if share is not None else "")
            + " (rules replayed on their first iteration are not candidates).")


__all__ = ["SpeedupData", "agreement_markdown", "agreement_sentence", "breakdown_figure", "breakdown_markdown",
           "curve_figure", "fastest_text", "predictions_markdown", "speedup_verdict_rows"]
