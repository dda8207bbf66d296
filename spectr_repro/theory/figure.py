"""theory.png: per toy, E[tau] against K for every rule, the LP limit and the paper's bound."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from spectr_repro.theory.claims import THEORY_RULES


def write_figure(df: pd.DataFrame, path: Path) -> None:
    import matplotlib  # matplotlib: heavy; only drawing a figure pays for it (theory/audit/replay start without it)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # matplotlib: only a figure pays

    toys = list(dict.fromkeys(df.toy))
    fig, axes = plt.subplots(1, len(toys), figsize=(5.2 * len(toys), 4.2), squeeze=False)
    styles = {
        "lp_optimum": dict(color="black", lw=2.2, marker="s"),
        "paper_bound": dict(color="black", ls="--", marker="x"),
    }
    for ax, toy in zip(axes[0], toys):
        sub = df[df.toy == toy]
        for quantity in (*THEORY_RULES, "lp_optimum", "paper_bound"):
            points = sub[sub.quantity == quantity].sort_values("K")
            if points.empty:
                continue
            label = {
                "lp_optimum": "LP limit (any valid rule)",
                "paper_bound": "paper's bound",
                "gbv": "gbv (valid only with carry-over)",
                "spectr_gbv": "spectr_gbv (release, not lossless)",
            }.get(quantity, quantity)
            if len(points) == 1 and quantity in ("sd", "bv", "gbv"):
                ax.axhline(points.value.iloc[0], ls=":", lw=1, color=f"C{THEORY_RULES.index(quantity)}")
                ax.plot(
                    points.K,
                    points.value,
                    "o",
                    label=f"{label} (K=1, single draft)",
                    color=f"C{THEORY_RULES.index(quantity)}",
                )
                continue
            style = (
                styles[quantity]
                if quantity in styles
                else dict(marker="o", color=f"C{THEORY_RULES.index(quantity)}")
            )
            ax.plot(points.K, points.value, label=label, **style)
        ax.axhline(int(sub.L.iloc[0]), color="grey", lw=0.8)
        ax.set_title(toy)
        ax.set_xlabel("K (drafts)")
        ax.set_ylabel("E[accepted tokens per iteration]")
        ax.set_xticks(sorted(set(sub.K)))
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

