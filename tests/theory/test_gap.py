"""The SpecTr -> LP gap table: values, shares, caching, skipping, and the markdown it writes."""

from __future__ import annotations

import json

import pytest

from spectr_repro.theory.cli import main_theory
from spectr_repro.theory.exact import rule_expected_accepted
from spectr_repro.theory.gap import GAP_RULES, GAP_VARIANTS, gap_markdown, gap_rows, gap_toys
from spectr_repro.theory.toy import ToySpec, toy_pair


def test_gap_rules_come_from_the_registry():
    assert {"spectr", "rbv", "sbv", "sbvf", "mpbv"} <= set(GAP_RULES)
    assert not {"sd", "bv", "gbv", "spectr_gbv"} & set(GAP_RULES)  # single-draft, carried state, not lossless


def test_gap_rows_values_shares_and_cache(tmp_path):
    cache = tmp_path / "gap.json"
    toys = [ToySpec(2, 2, 0, K=2), ToySpec(3, 2, 1, K=2), ToySpec(4, 3, 0, K=3)]
    df = gap_rows(toys, cache=cache, max_tuples=5000, progress=None)
    assert df.skipped.tolist() == [False, False, True]
    done = df[~df.skipped]
    target, draft = toy_pair(2, 0)
    assert done.sbv.iloc[0] == pytest.approx(rule_expected_accepted("sbv", target, draft, 2, 2), abs=1e-12)
    for row in done.itertuples():
        assert row.sbvf >= row.sbv - 1e-12 and row.lp_optimum >= max(row.spectr, row.rbv, row.sbv, row.sbvf) - 1e-7
        assert row.share_sbv == pytest.approx((row.sbv - row.spectr) / (row.lp_optimum - row.spectr))
    stored = json.loads(cache.read_text())
    # per toy: each rule, each option variant (sbvf_mixture), the LP optimum, the myopic limit
    assert len(stored) == 2 * (len(GAP_RULES) + len(GAP_VARIANTS) + 2)
    for row in done.itertuples():  # the mixture choice of rho: at least SBV-F and MP-BV (docs/theory.md)
        assert row.sbvf_mixture >= max(row.sbvf, row.mpbv) - 1e-9 and row.lp_optimum >= row.sbvf_mixture - 1e-7
    # A second run reads the cache: a planted value shows up unchanged.
    key = "sbv|V=2,L=2,K=2,seed=0"
    stored[key] = 1.23
    cache.write_text(json.dumps(stored))
    again = gap_rows(toys[:1], cache=cache, progress=None)
    assert again.sbv.iloc[0] == 1.23
    text = gap_markdown(df)
    assert "skipped" in text and "mean share" in text and "share sbvf" in text and "share sbvf_mixture" in text


def test_gap_toys_is_the_stated_cross_product():
    toys = gap_toys()
    assert len(toys) == 36
    assert {(t.vocab_size, t.L, t.K) for t in toys} == {(V, L, K) for V in (2, 3, 4) for L in (2, 3) for K in (2, 3)}


def test_theory_gap_cli_writes_files(tmp_path):
    out = tmp_path / "gap"
    assert main_theory(["--gap", "--quick", "--max-tuples", "300", "--out", str(out)]) == 0
    assert (out / "gap.csv").exists() and "SpecTr -> LP gap" in (out / "GAP.md").read_text()
