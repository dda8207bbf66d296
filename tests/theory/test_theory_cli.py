"""``python -m spectr_repro theory --quick``: files written, properties stated, bad input refused."""

from __future__ import annotations

import pandas as pd

from spectr_repro.theory.cli import main_theory


def test_theory_quick_writes_table_figure_and_claims(tmp_path):
    out = tmp_path / "theory"
    assert main_theory(["--quick", "--out", str(out)]) == 0
    df = pd.read_csv(out / "theory.csv")
    assert {"sd", "spectr", "bv", "rbv", "sbv", "sbvf", "mpbv", "spectr_gbv", "gbv", "lp_optimum",
            "lp_optimum_draft_sets", "paper_bound"} <= set(df.quantity)
    assert (out / "theory.png").stat().st_size > 1000
    text = (out / "THEORY.md").read_text()
    for claim in (
        "equals GBV",
        "non-decreasing in K",
        "-> L as K -> infinity",
        "upper limit for valid rules",
        "The node LP and the draft-set LP give the same limit (sanity) | holds",
        "sbv: share of the spectr→LP gap closed",
        "sbvf: share of the spectr→LP gap closed",
    ):
        assert claim in text
    # Consistency of the table: LP >= every rule valid as is, at every K.
    for _, sub in df.groupby("K"):
        lp = float(sub[sub.quantity == "lp_optimum"].value.iloc[0])
        valid = sub[sub.valid_as_is.astype(str) == "True"]
        assert (valid[valid.quantity != "lp_optimum"].value <= lp + 1e-7).all()
    gen = pd.read_csv(out / "generation.csv")
    assert set(gen.rule) == {"sd", "bv", "gbv"}


def test_theory_rejects_bad_k(tmp_path, capsys):
    out = tmp_path / "theory"
    assert main_theory(["--quick", "--max-k", "9", "--out", str(out)]) == 2
    assert not out.exists()
    assert "--max-k" in capsys.readouterr().err
