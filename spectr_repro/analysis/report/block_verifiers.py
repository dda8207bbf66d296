"""HSD (Zhou et al., ICLR 2026) beside the block verifiers on the same replayed blocks: its tokens per call minus
BV's, GBV's (first iteration), the release's and SBV-F's, paired prompt by prompt (prompts replayed before hsd was
registered have no hsd rows: every difference pairs on the prompts both rules have).

Single-draft HSD is set against the single-draft rules at K = 1 and against the release and SBV-F at the replay's
main K (the multi-draft comparison the paper's Table 1 makes for GBV), at every L the replay holds."""

from __future__ import annotations

import pandas as pd

from spectr_repro.analysis.format import AVERAGE, interval_text, markdown, relative
from spectr_repro.analysis.replay import differences
from spectr_repro.analysis.report.context import ReportContext

RULE = "hsd"
AGAINST = ("bv", "gbv", "spectr_gbv", "sbvf")  # each at K = 1 where single-draft; the multi-draft at every K


def hsd_differences(blocks: pd.DataFrame) -> pd.DataFrame:
    """hsd minus each of ``AGAINST`` per (T, L, dataset and the average), paired on the same blocks."""
    frame = blocks[blocks["method"].isin((RULE, *AGAINST))]
    if RULE not in set(frame["method"]):
        return pd.DataFrame()
    table = differences(frame, comparators=AGAINST)
    return table[table["method"] == RULE].reset_index(drop=True)


def block_verifiers_section(context: ReportContext) -> str | None:
    replay = context.replay
    if replay is None:
        return None
    table = hsd_differences(replay.blocks)
    if table.empty:
        return None
    path = context.out_dir / "tables" / "hsd_differences.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(path, index=False, float_format="%.4f")
    return "\n".join([
        "## HSD beside the block verifiers", "",
        f"HSD (as released; not lossless, see the audit) minus each rule, tokens per target call on the same blocks at "
        f"L={replay.L}, 95 % intervals over the prompts both rules have (hsd joined the grid on 2026-12-05). Every L: "
        f"[{path.name}]({relative(path, context.out_dir)}).", "",
        markdown(shown_table(table, replay.L, replay.K)), ""])


def shown_table(table: pd.DataFrame, L: int, K: int) -> pd.DataFrame:
    """Rows (temperature, comparator and its K: 1, and the replay's main K), columns the datasets then the average,
    at ``L``; "-" where a dataset has no prompt with hsd at that temperature (as Table 1 shows a missing cell)."""
    main = table[(table["L"] == L) & ((table["comparator_K"] == 1) | (table["comparator_K"] == K))]
    main = main.assign(against=[f"{c} K={k}" for c, k in zip(main["comparator"], main["comparator_K"])],
                       value=[interval_text(d, lo, hi, signed=True) + f" (n={n})" for d, lo, hi, n in
                              zip(main["difference"], main["ci_low"], main["ci_high"], main["prompts"])])
    wide = main.pivot_table(index=["temperature", "against"], columns="dataset", values="value", aggfunc="first")
    order = [c for c in wide.columns if c != AVERAGE] + ([AVERAGE] if AVERAGE in wide.columns else [])
    return wide[order].fillna("-").reset_index()
