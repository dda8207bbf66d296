"""HSD beside the block verifiers (analysis/report/block_verifiers.py): paired on the prompts both rules have."""

from __future__ import annotations

import pandas as pd
import pytest

from spectr_repro.analysis.report.block_verifiers import hsd_differences, shown_table


def blocks(rows):
    return pd.DataFrame([{"model_pair": "p", "temperature": 0.4, "dataset": "d", "iteration": 0, **row}
                         for row in rows])


def test_hsd_pairs_on_the_prompts_both_rules_have():
    """bv on prompts a, b, c; hsd only on b, c (registered after a was replayed): the difference is hsd - bv on b and
    c alone (+0.5 each), not against bv's mean over a, b, c. Negative control: pooling prompt a would give +1.5."""
    rows = [{"method": "bv", "K": 1, "L": 6, "prompt_id": p, "tokens": t} for p, t in (("a", 1.0), ("b", 3.0),
                                                                                        ("c", 5.0))]
    rows += [{"method": "hsd", "K": 1, "L": 6, "prompt_id": p, "tokens": t} for p, t in (("b", 3.5), ("c", 5.5))]
    table = hsd_differences(blocks(rows))
    [row] = table.to_dict("records")
    assert row["comparator"] == "bv" and row["prompts"] == 2
    assert row["difference"] == pytest.approx(0.5)


def test_no_hsd_no_table():
    assert hsd_differences(blocks([{"method": "bv", "K": 1, "L": 6, "prompt_id": "a", "tokens": 2.0}])).empty


def test_multi_draft_comparators_at_each_K():
    rows = [{"method": "hsd", "K": 1, "L": 6, "prompt_id": p, "tokens": 2.0} for p in "ab"]
    rows += [{"method": "spectr_gbv", "K": K, "L": 6, "prompt_id": p, "tokens": 2.0 + K / 10} for p in "ab"
             for K in (1, 3)]
    table = hsd_differences(blocks(rows))
    assert sorted(table["comparator_K"]) == [1, 3]
    assert table.set_index("comparator_K")["difference"].to_dict() == pytest.approx({1: -0.1, 3: -0.3})


def test_a_dataset_without_hsd_at_a_temperature_shows_a_dash_not_nan():
    """Dataset d has hsd at T=0.4 only, e at T=0.7 only: each missing (temperature, dataset) reads "-" (as in
    Table 1), never "nan" (the committed grid's report showed "nan" for HumanEval at T=0.1 and 0.4)."""
    rows = [{"method": m, "K": 1, "L": 6, "prompt_id": p, "tokens": t, "temperature": T, "dataset": d}
            for T, d in ((0.4, "d"), (0.7, "e")) for p in "ab" for m, t in (("bv", 2.0), ("hsd", 2.5))]
    shown = shown_table(hsd_differences(blocks(rows)), L=6, K=3)
    assert set(shown.columns) >= {"d", "e"}
    cells = shown.set_index("temperature")
    assert cells.loc[0.4, "e"] == "-" and cells.loc[0.7, "d"] == "-"
    assert cells.loc[0.4, "d"].startswith("+0.50") and "nan" not in shown.to_string()


def test_multi_draft_hsd_rules_are_set_against_the_rules_at_their_own_K():
    """hsd_rrs at K = 1 and 3 beside spectr at K = 3 and bv: the shown rows are hsd_rrs K=3 against spectr K=3 only
    (+0.2), not hsd_rrs against bv (its reduction at K = 1, a single-draft rule at K = 3). Control: the CSV keeps
    those rows."""
    rows = [{"method": m, "K": K, "L": 6, "prompt_id": p, "tokens": t} for p in "ab"
            for m, K, t in (("hsd_rrs", 1, 2.0), ("hsd_rrs", 3, 2.5), ("spectr", 3, 2.3), ("bv", 1, 2.0))]
    table = hsd_differences(blocks(rows))
    assert set(zip(table["K"], table["comparator"], table["comparator_K"])) == {(1, "bv", 1), (3, "bv", 1),
                                                                                (3, "spectr", 3)}
    shown = shown_table(table, L=6, K=3)
    assert list(zip(shown["rule"], shown["against"])) == [("hsd_rrs K=3", "spectr K=3")]
    assert shown["d"].iloc[0].startswith("+0.20")
