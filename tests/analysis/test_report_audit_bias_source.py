"""REPORT.md's audit section: the released rule's 'NOT lossless' verdict says where its bias comes from."""

from __future__ import annotations

import pandas as pd

from spectr_repro.analysis.report.audit import RELEASE_BIAS_SOURCE, _verdict_lines


def test_the_release_verdict_names_the_source_of_its_bias_and_lossless_rules_do_not():
    table = pd.DataFrame([{"rule": "spectr_gbv", "K": 2, "options": "", "verdict": "NOT lossless"},
                          {"rule": "sbv", "K": 2, "options": "", "verdict": "lossless"}])
    lines = _verdict_lines(table)
    release = next(line for line in lines if "spectr_gbv" in line or "SpecTr-GBV" in line)
    assert RELEASE_BIAS_SOURCE in release and "docs/theory.md" in release
    assert all(RELEASE_BIAS_SOURCE not in line for line in lines if line is not release)
