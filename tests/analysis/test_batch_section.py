"""Speed-up against batch size, predicted (analysis/report/batch.py): the crossover batches from the cost model."""

from __future__ import annotations

import pandas as pd

from spectr_repro.analysis.report.batch import crossover, predicted_batch_table


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
