"""HSD (Zhou et al., ICLR 2026) beside the block verifiers on the same replayed blocks: the tokens per call of hsd,
hsd_rrs and hsd_rrs_release minus BV's, GBV's (first iteration), SpecTr's, the release's and SBV-F's, paired prompt by
prompt (prompts replayed before a rule was registered have no rows of it: every difference pairs on the prompts both
rules have).

Single-draft HSD is set against the single-draft rules at K = 1 and against the multi-draft rules at the replay's main
K (the comparison the paper's Table 1 makes for GBV); the multi-draft HSD rules against the multi-draft rules at the
same K. Every L the replay holds is in the CSV; the section shows the replay's main (K, L)."""

from __future__ import annotations

import pandas as pd

from spectr_repro.analysis.format import AVERAGE, interval_text, markdown, relative
from spectr_repro.analysis.replay import differences
from spectr_repro.analysis.report.context import ReportContext
from spectr_repro.verify import VERIFIERS

RULES = ("hsd", "hsd_rrs", "hsd_rrs_release")
AGAINST = ("bv", "gbv", "spectr", "spectr_gbv", "sbvf")  # each at K = 1 where single-draft


def hsd_differences(blocks: pd.DataFrame) -> pd.DataFrame:
    """Each of ``RULES`` minus each of ``AGAINST`` per (T, K, L, dataset and the average), paired on the same
    blocks."""
    frame = blocks[blocks["method"].isin((*RULES, *AGAINST))]
    present = [rule for rule in RULES if rule in set(frame["method"])]
    if not present:
        return pd.DataFrame()
    return differences(frame, comparators=AGAINST, methods=present).reset_index(drop=True)


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
        f"HSD as released (`hsd`, K = 1) and over K drafts (`hsd_rrs`: the paper's Algorithm 3, lossless; "
        f"`hsd_rrs_release`: the authors' loop; the releases are not lossless, see the audit) minus each rule, tokens "
        f"per target call on the same blocks at L={replay.L}, 95 % intervals over the prompts both rules have (hsd "
        f"joined the grid on 2026-12-05, hsd_rrs and hsd_rrs_release on 2026-12-06). Every K and L: "
        f"[{path.name}]({relative(path, context.out_dir)}).", "",
        markdown(shown_table(table, replay.L, replay.K)), ""])


def shown_table(table: pd.DataFrame, L: int, K: int) -> pd.DataFrame:
    """Rows (temperature, rule and its K, comparator and its K), columns the datasets then the average, at ``L``: hsd
    (K = 1) against the rules at K = 1 and the replay's main K, the multi-draft HSD rules at the main K against the
    rules there; "-" where a dataset has no prompt with the rule at that temperature (as Table 1 shows a missing
    cell)."""
    at_L = table[table["L"] == L]
    single_draft = at_L["method"].map(lambda method: VERIFIERS[method].single_draft)
    single = single_draft & (at_L["K"] == 1) & at_L["comparator_K"].isin((1, K))
    multi = ~single_draft & (at_L["K"] == K) & (at_L["comparator_K"] == K)
    main = at_L[single | multi]
    main = main.assign(rule=[f"{m} K={k}" for m, k in zip(main["method"], main["K"])],
                       against=[f"{c} K={k}" for c, k in zip(main["comparator"], main["comparator_K"])],
                       value=[interval_text(d, lo, hi, signed=True) + f" (n={n})" for d, lo, hi, n in
                              zip(main["difference"], main["ci_low"], main["ci_high"], main["prompts"])])
    wide = main.pivot_table(index=["temperature", "rule", "against"], columns="dataset", values="value",
                            aggfunc="first")
    order = [c for c in wide.columns if c != AVERAGE] + ([AVERAGE] if AVERAGE in wide.columns else [])
    return wide[order].fillna("-").reset_index()
