"""REPORT.md's audit section: the released rule's 'NOT lossless' verdict says where its bias comes from."""

from __future__ import annotations

import pandas as pd

from spectr_repro.analysis.report.audit import MPBV_SBVF_FINDING, RELEASE_BIAS_SOURCE, _verdict_lines


def test_the_release_verdict_names_the_source_of_its_bias_and_lossless_rules_do_not():
    table = pd.DataFrame([{"rule": "spectr_gbv", "K": 2, "options": "", "verdict": "NOT lossless"},
                          {"rule": "sbv", "K": 2, "options": "", "verdict": "lossless"}])
    lines = _verdict_lines(table)
    release = next(line for line in lines if "spectr_gbv" in line or "SpecTr-GBV" in line)
    assert RELEASE_BIAS_SOURCE in release and "docs/theory.md" in release
    assert all(RELEASE_BIAS_SOURCE not in line for line in lines if line is not release)


def test_the_mpbv_verdict_carries_the_mpbv_vs_sbvf_finding_and_no_other_line_does():
    table = pd.DataFrame([{"rule": "mpbv", "K": 2, "options": "", "verdict": "lossless"},
                          {"rule": "sbvf", "K": 2, "options": "", "verdict": "lossless"}])
    lines = _verdict_lines(table)
    mpbv = next(line for line in lines if "MP-BV" in line)
    assert MPBV_SBVF_FINDING in mpbv and "docs/theory.md" in mpbv
    assert all(MPBV_SBVF_FINDING not in line for line in lines if line is not mpbv)


def test_the_theory_claims_table_is_read_from_claims_csv_beside_theory_md(tmp_path):
    from spectr_repro.analysis.report.audit import claims_lines

    theory_md = tmp_path / "THEORY.md"
    theory_md.write_text("# theory")
    assert claims_lines(theory_md) == [] and claims_lines(None) == []
    pd.DataFrame([{"claim": "SpecTr-GBV at K=1 equals GBV", "verdict": "holds", "evidence": "gap 1e-17"},
                  {"claim": "The paper's bound is an upper limit for valid rules", "verdict": "FAILS",
                   "evidence": "below the LP in 3"}]).to_csv(tmp_path / "claims.csv", index=False)
    rows = [line for line in "\n".join(claims_lines(theory_md)).splitlines() if line.startswith("| ")]
    cells = [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]
    assert ["SpecTr-GBV at K=1 equals GBV", "holds", "gap 1e-17"] in cells
    assert ["The paper's bound is an upper limit for valid rules", "FAILS", "below the LP in 3"] in cells
