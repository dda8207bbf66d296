"""REPORT.md's bias section: per-context detections are Holm's over the contexts of a method and setting."""

from __future__ import annotations

import pandas as pd

from spectr_repro.analysis.report.bias import holm_rejected, worst_context


def contexts(method: str, p_values: list[float], tv: float = 0.05) -> list[dict]:
    return [{"model_pair": "qwen", "dataset": "humaneval", "method": method, "K": 3, "L": 6, "temperature": 0.4,
             "draft_temperature": 0.4, "context": f"P/{i}+0", "p_value": p, "tv_estimate": tv + i / 1000,
             "verdict": "bias detected (p <= 0.05)" if p <= 0.05 else "no bias detected"}
            for i, p in enumerate(p_values)]


def test_a_lone_p_of_0_02_among_16_contexts_is_not_a_detection_and_a_strong_one_is():
    table = pd.DataFrame(contexts("sbv", [0.02] + [0.5] * 15) + contexts("spectr_gbv", [1e-5] + [0.5] * 15))
    rejected = holm_rejected(table)
    assert not rejected[table.method == "sbv"].any()  # uncorrected it reads "bias detected": the wolf cry
    assert rejected[table.method == "spectr_gbv"].tolist() == [True] + [False] * 15


def test_the_figure_context_is_a_holm_rejection_not_an_uncorrected_one():
    # sbv's uncorrected 'bias detected' has the larger TV estimate; only spectr_gbv's survives Holm
    table = pd.DataFrame(contexts("sbv", [0.01] + [0.6] * 15, tv=0.2) + contexts("spectr_gbv", [1e-6] + [0.6] * 15))
    assert worst_context(table).method == "spectr_gbv"
