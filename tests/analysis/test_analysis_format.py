"""The analysis's shared formatting (spectr_repro.analysis.format): intervals as text, the methods-by-datasets
pivot, and Table 1's LaTeX escaped by pandas."""

import math

import pandas as pd

from spectr_repro.analysis.format import AVERAGE, bounds_text, interval_text, main_setting_rows, methods_by_datasets
from spectr_repro.analysis.tables import latex_table


def test_interval_text_shows_bounds_only_where_both_exist():
    assert interval_text(1.234, 1.1, 1.4) == "1.23 [1.10, 1.40]"
    assert interval_text(0.05, -0.01, 0.11, digits=3, signed=True) == "+0.050 [-0.010, +0.110]"
    assert interval_text(2.5, 2.0, 3.0, unit="×") == "2.50× [2.00, 3.00]"  # the unit follows the estimate only
    assert interval_text(2.5, math.nan, 3.0) == "2.50" and interval_text(2.5, None, None) == "2.50"
    assert interval_text(2.5, -math.inf, 3.0) == "2.50"  # an infinite bound is no interval
    assert interval_text(math.nan, 1.0, 2.0) == " [1.00, 2.00]"  # as Table 1 showed it: no estimate, the bounds
    assert bounds_text(0.1, 0.25, digits=3) == "[0.100, 0.250]" and bounds_text(None, 1.0) == ""


def test_methods_by_datasets_orders_rows_and_columns_and_labels_methods():
    long = pd.DataFrame({"method": ["spectr_gbv", "sd", "sd", "gbv[carry_over=False]"],
                         "dataset": [AVERAGE, "gsm8k", "humaneval", "humaneval"], "value": [1.0, 2.0, 3.0, 4.0]})
    wide = methods_by_datasets(long, "value")
    assert list(wide.index) == ["SD", "GBV[carry_over=False]", "SpecTr-GBV"]  # the registry's order, labels
    assert list(wide.columns) == ["humaneval", "gsm8k", AVERAGE]  # the data registry's order, the average last
    assert wide.loc["SD", "gsm8k"] == 2.0 and math.isnan(wide.loc["SpecTr-GBV", "humaneval"])
    assert wide.index.name == "method" and wide.columns.name is None
    raw = methods_by_datasets(long, "value", aggfunc="mean", labels=False, columns_name="dataset")
    assert list(raw.index) == ["sd", "gbv[carry_over=False]", "spectr_gbv"] and raw.columns.name == "dataset"


def test_latex_table_escapes_names_and_notes_and_writes_times_and_delta_as_math():
    comparison = pd.DataFrame({"model_pair": "p", "metric": "speedup", "method": ["gbv[carry_over=False]", "sd"],
                               "dataset": ["humaneval", "humaneval"], "ours": [1.5, math.nan],
                               "paper": [1.25, math.nan], "note": ["", "n/c (50% & more_batched)"]})
    tex = latex_table(comparison, caption="c", label="l")
    assert r"GBV[carry\_over=False]" in tex and r"n/c (50\% \& more\_batched)" in tex
    assert r"1.50$\times$ (paper 1.25$\times$, $\Delta$ +0.25)" in tex
    assert "×" not in tex and "Δ" not in tex


def test_main_setting_rows_take_each_rules_cell_and_put_the_average_last():
    """Table 1 and the predicted speed-ups share this shape: a single-draft rule (sd) at K = 1, a multi-draft one
    (spectr) at K, the other cells left out; the extra columns after K; a dataset a rule lacks is "-"."""
    rows = [("sd", 1, 6, AVERAGE, 2.0), ("sd", 1, 6, "gsm8k", 2.5), ("sd", 3, 6, "gsm8k", 9.0),
            ("spectr", 3, 6, "humaneval", 3.0), ("spectr", 3, 6, "gsm8k", 3.5), ("spectr", 3, 4, "gsm8k", 9.0),
            ("spectr", 1, 6, "gsm8k", 9.0)]
    table = pd.DataFrame(rows, columns=["method", "K", "L", "dataset", "value"])
    frame = main_setting_rows(table, 3, 6, lambda r: f"{r.value:g}", lambda method: {"note": method.upper()})
    assert list(frame.columns) == ["method", "K", "note", "gsm8k", "humaneval", AVERAGE]
    assert frame.to_dict("records") == [
        {"method": "SD", "K": 1, "note": "SD", "gsm8k": "2.5", "humaneval": "-", AVERAGE: "2"},
        {"method": "SpecTr", "K": 3, "note": "SPECTR", "gsm8k": "3.5", "humaneval": "3", AVERAGE: "-"}]
    assert main_setting_rows(table, 3, 12, str).empty  # no rule has a cell at L = 12
