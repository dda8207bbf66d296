"""Speed-up against batch size: predicted (analysis/report/batch.py), the crossover batches from the cost model;
measured (analysis/report/batch_measured.py), the timed groups of the batch bench."""

from __future__ import annotations

import json
import math

import pandas as pd

from spectr_repro.analysis.report.batch import crossover, predicted_batch_table
from spectr_repro.analysis.report.batch_measured import batch_measured_section
from spectr_repro.analysis.report.context import ReportContext


def test_crossover_is_the_first_batch_at_or_below_the_baseline():
    table = pd.DataFrame({"method": ["x"] * 4, "B": [1, 2, 4, 8], "speedup": [2.0, 1.2, 0.9, 0.5]})
    assert crossover(table, "x", 1.0) == 4
    assert crossover(table, "x", 0.1) is None  # never: "beyond" the largest batch
    sd = pd.Series([1.5, 1.3, 1.0, 0.8], index=[1, 2, 4, 8])
    assert crossover(table, "x", sd) == 2


def test_multi_draft_stops_paying_before_single_draft_on_every_accelerator():
    """The replay's tokens per call (a synthetic summary: SD 4.6 at K=1, SBV 5.1 at K=3, L=6) on the Qwen pair's
    shapes: each accelerator's B* against AR is smaller for the K=3 rule, whose verify carries 3x the tokens."""
    summary = pd.DataFrame([
        {"model_pair": "qwen25coder_1.5b_0.5b", "dataset": "average", "temperature": 0.4, "method": m, "K": K,
         "L": 6, "tokens_per_call": t} for m, K, t in (("sd", 1, 4.6), ("sbv", 3, 5.1), ("sbv", 1, 4.65))])
    table = predicted_batch_table(summary, "qwen25coder_1.5b_0.5b", K=3, L=6)
    assert set(table["method"]) == {"ar", "sd", "sbv"} and (table.loc[table["method"] == "sbv", "K"] == 3).all()
    for _, part in table.groupby("accelerator"):
        sd_star, sbv_star = crossover(part, "sd", 1.0), crossover(part, "sbv", 1.0)
        assert sbv_star is not None and (sd_star is None or sbv_star <= sd_star)
        assert part.loc[(part["method"] == "sbv") & (part["B"] == 1), "speedup"].item() > \
            part.loc[(part["method"] == "sd") & (part["B"] == 1), "speedup"].item()  # at B=1 it pays


# --- measured (bench --preset batch_qwen's bench_batch.json) -------------------------------------------------------


def measured_cell(method, K, L, B, speedup, predicted, groups=2):
    low, high = (math.nan, math.nan) if groups == 1 else (speedup - 0.1, speedup + 0.1)
    return {"method": method, "K": K, "L": L, "B": B, "groups": groups, "tokens_per_call": 2.5,
            "speedup": speedup, "speedup_low": low, "speedup_high": high, "predicted": predicted,
            "error": predicted / speedup - 1, "decode_speedup": speedup * 1.1,
            "decode_speedup_low": low * 1.1, "decode_speedup_high": high * 1.1, "decode_predicted": predicted * 1.1,
            "decode_error": predicted / speedup - 1}


def write_bench(folder, cells):
    folder.mkdir(parents=True)
    (folder / "bench_batch.json").write_text(json.dumps({
        "date": "2026-12-06T00:00:00+00:00", "command": "python -m spectr_repro bench --preset batch_qwen",
        "environment": {"device_name": "a test CPU"},  # as spectr_repro.environment writes it
        "batches": {"pair": "qwen", "cells": cells, "groups": [], "costs_source": "synthetic",
                    "median_abs_error": 0.05, "worst_abs_error": 0.1, "decode_median_abs_error": 0.04,
                    "decode_worst_abs_error": 0.08,
                    "settings": {"batches": [1, 2, 4, 8], "datasets": ["humaneval", "gsm8k"], "prompts": 8,
                                 "temperature": 0.4, "max_new_tokens": 32, "contenders": []}}}))


def test_the_measured_section_names_where_each_rule_stops_paying(tmp_path):
    """B* vs AR: the first measured B at or below 1.0; vs SD: the first B at or below SD's at the same L."""
    sd = [measured_cell("sd", 1, 4, B, s, s) for B, s in zip((1, 2, 4, 8), (1.4, 1.2, 1.05, 0.95))]
    spectr = [measured_cell("spectr", 3, 4, B, s, s * 1.1, groups=1 if B == 8 else 2)
              for B, s in zip((1, 2, 4, 8), (1.5, 1.1, 0.9, 0.7))]
    write_bench(tmp_path / "speedup_batch", sd + spectr)
    replay_folder = tmp_path / "replay_qwen_grid"
    replay_folder.mkdir()
    context = ReportContext([replay_folder], tmp_path / "out" / "REPORT.md")
    text = batch_measured_section(context)
    assert text.startswith("## Speed-up against batch size (measured)")
    assert "on 2026-12-06T00:00:00+00:00 (a test CPU)" in text  # the machine the bench ran on, as recorded
    (verdict_table,) = [block for block in text.split("\n\n") if "B* vs AR" in block]
    verdicts = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:4]]
                for line in verdict_table.splitlines() if "K=" in line}
    assert verdicts["SD K=1 L=4"][0] == "8"  # 0.95 at B = 8
    assert verdicts["SpecTr K=3 L=4"] == ["4", "2"]  # below AR at B = 4; below SD's 1.2 at B = 2
    (single,) = [line for line in text.splitlines() if line.startswith("| SpecTr K=3 L=4 | 8 ")]
    assert "| 0.70 " in single and "[" not in single  # one group: no interval
    assert "1.10 [1.00, 1.20]" in text and "+10 %" in text
    assert (tmp_path / "out" / "figures" / "batch_speedup_measured.png").is_file()
    assert (tmp_path / "out" / "tables" / "batch_speedup_measured.csv").is_file()


def test_no_measured_section_without_the_bench_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert batch_measured_section(ReportContext([tmp_path / "x"], tmp_path / "REPORT.md")) is None
    # a checkout's committed ./results/speedup_batch is not this report's: a folder elsewhere does not pick it up
    write_bench(tmp_path / "results" / "speedup_batch", [measured_cell("sd", 1, 4, 1, 1.5, 1.4)])
    elsewhere = tmp_path / "elsewhere" / "synthetic"
    assert batch_measured_section(ReportContext([elsewhere], tmp_path / "REPORT.md")) is None
    assert batch_measured_section(ReportContext([tmp_path / "results" / "grid"], tmp_path / "REPORT.md")) is not None
