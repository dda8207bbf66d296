"""SPEED-Bench's acceptance metrics (analysis/acceptance_metrics.py) on hand-computed cases and their identities."""

from __future__ import annotations

import pandas as pd
import pytest

from spectr_repro.analysis.acceptance_metrics import speed_bench_metrics, speed_bench_table


def test_hand_computed_case():
    """Two prompts: a = [1, 3, 3] (taus 0, 2, 2), b = [2]. Histogram {1: 1, 2: 1, 3: 2} over 4 steps: P(len >= 1, 2, 3)
    = 1, 3/4, 2/4; the conditional rates 1, 3/4, (2/4)/(3/4) = 2/3; Average_AL = (7/3 + 2) / 2 (a mean of means)."""
    metrics = speed_bench_metrics({"a": [1, 3, 3], "b": [2]})
    assert metrics["Acceptance_Length_Histogram"] == {1: 1, 2: 1, 3: 2}
    assert metrics["Joint_Acceptance_Rate"] == pytest.approx({1: 1.0, 2: 0.75, 3: 0.5})
    assert metrics["Conditional_Acceptance_Rate"] == pytest.approx({1: 1.0, 2: 0.75, 3: 2 / 3})
    assert metrics["Average_AL"] == pytest.approx((7 / 3 + 2) / 2)


def test_a_missing_length_is_skipped_as_specdec_bench_does():
    """Lengths 1 and 4 only: the conditional rate at 4 is P(>= 4) / P(>= 1) (no key 2 or 3)."""
    metrics = speed_bench_metrics({"a": [1, 4, 4, 4]})
    assert list(metrics["Conditional_Acceptance_Rate"]) == [1, 4]
    assert metrics["Conditional_Acceptance_Rate"][4] == pytest.approx(0.75)


def test_joint_rates_sum_to_the_pooled_mean_length():
    """Identity: sum_k P(len >= k) over k = 1..max = E[len] (pooled over steps); here every length is present."""
    lengths = {"a": [1, 2, 3, 4, 2], "b": [5, 1, 3]}
    metrics = speed_bench_metrics(lengths)
    pooled = sum(map(sum, lengths.values())) / sum(map(len, lengths.values()))
    assert sum(metrics["Joint_Acceptance_Rate"].values()) == pytest.approx(pooled)
    assert metrics["Average_AL"] != pytest.approx(pooled)  # a mean of prompt means, not tokens over calls


def test_no_step_is_refused():
    with pytest.raises(ValueError, match="no step"):
        speed_bench_metrics({"a": []})


def test_table_has_one_row_per_speculative_cell():
    records = pd.DataFrame([
        {"model_pair": "p", "dataset": "d", "method": "sd", "K": 1, "L": 3, "temperature": 0.4, "prompt_id": "x",
         "accepted_lengths": [0, 3, 1]},
        {"model_pair": "p", "dataset": "d", "method": "sd", "K": 1, "L": 3, "temperature": 0.4, "prompt_id": "y",
         "accepted_lengths": [2]},
        {"model_pair": "p", "dataset": "d", "method": "ar", "K": 1, "L": 3, "temperature": 0.4, "prompt_id": "x",
         "accepted_lengths": []},
    ])
    table = speed_bench_table(records)
    assert len(table) == 1 and table.loc[0, "method"] == "sd"
    assert table.loc[0, "joint_2"] == pytest.approx(3 / 4) and table.loc[0, "joint_4"] == pytest.approx(1 / 4)
