import json
import re
import shutil

import pandas as pd
import pytest

from spectr_repro.__main__ import main as cli_main
from spectr_repro.analysis.load import QUALITY_OUTCOMES_FILE, load_audit, load_quality
from spectr_repro.analysis.report import ReportContext, main
from spectr_repro.analysis.report import quality as quality_module
from spectr_repro.analysis.report.context import find_audit, find_theory
from spectr_repro.analysis.report.quality import quality_section
from spectr_repro.analysis.stats import RESAMPLES


@pytest.fixture
def results_copy(synthetic, tmp_path):
    target = tmp_path / "results" / "synthetic"
    shutil.copytree(synthetic.root, target)
    return target


def _links(markdown):
    return re.findall(r"\]\(([^)]+)\)", markdown)


def test_report_has_every_section_and_its_files_exist(results_copy, capsys, monkeypatch):
    monkeypatch.chdir(results_copy.parent)  # nothing from this checkout's committed results/ leaks in
    audit_dir = results_copy.parent / "audit"
    audit_dir.mkdir()
    audit = {
        "threshold": "exact TV < 1e-9",
        "rows": [
            {
                "rule": "spectr_gbv",
                "K": 2,
                "options": {"carry_over": False},
                "exact_tv": 0.0123,
                "p_value": 1e-12,
                "mc_tv": 0.012,
                "verdict": "NOT lossless",
                "claimed_lossless": True,
                "flags": ["biased"],
                "toys": [{"label": "V=2,L=2,seed=0", "tv": 0.0123}],
            },
            {
                "rule": "sd",
                "K": 1,
                "options": {},
                "exact_tv": 0.0,
                "p_value": 0.61,
                "mc_tv": 0.003,
                "verdict": "lossless",
                "claimed_lossless": True,
            },
        ],
    }
    (audit_dir / "audit.json").write_text(json.dumps(audit))

    assert cli_main(["report", str(results_copy)]) == 0
    report_path = results_copy / "REPORT.md"
    assert str(report_path) in capsys.readouterr().out
    report = report_path.read_text()
    for heading in (
        "## Environment",
        "## Settings",
        "## Table 1 — qwen25coder_1.5b_0.5b",
        "## Table 1 — deepseek_33b_1.3b",
        "## Ablations — qwen25coder_1.5b_0.5b",
        "## The paper's numbers",
        "## Lossless status (audit)",
    ):
        assert heading in report
    assert "synthetic CPU" in report and "2.13.0+cpu" in report and "abc1234" in report
    assert "max_new_tokens: 64" in report
    assert f"intervals over prompts ({RESAMPLES} resamples)" in report  # the ablations' text: the constant's count
    assert "(paper 8.59, Δ" in report  # the 33B pair is set beside the paper
    assert "**SpecTr-GBV** (claimed lossless: True): K=2 carry_over=False: NOT lossless" in report
    assert "threshold: exact TV < 1e-9" in report
    assert "| biased" in report and "V=2,L=2,seed=0" not in report  # per-toy details stay in the audit
    assert "nan" not in report
    links = _links(report)
    # K, L, T and acceptance for Qwen, acceptance for DeepSeek
    assert sum(link.endswith(".png") for link in links) == 5
    for link in links:
        assert (results_copy / link).is_file(), link
    assert (results_copy / "tables" / "table1_qwen25coder_1.5b_0.5b.tex").is_file()


def test_audit_is_found_next_to_the_results_and_read_in_the_shape_its_writer_writes(tmp_path, monkeypatch):
    """`python -m spectr_repro audit` (theory.cli) writes one object: rows, peers and scalar settings; any other
    shape is refused (a bare list or row is no audit file)."""
    monkeypatch.chdir(tmp_path)  # no ./results/audit either
    folder = tmp_path / "results" / "cpu_quick"
    folder.mkdir(parents=True)
    assert find_audit([folder]) is None
    (tmp_path / "results" / "audit").mkdir()
    (tmp_path / "results" / "audit" / "audit.json").write_text("[]")
    assert find_audit([folder]) == tmp_path / "results" / "audit" / "audit.json"
    # a folder elsewhere never takes the working directory's ./results/audit (nor its theory)
    elsewhere = tmp_path / "elsewhere" / "cpu_quick"
    elsewhere.mkdir(parents=True)
    (tmp_path / "results" / "theory").mkdir()
    (tmp_path / "results" / "theory" / "THEORY.md").write_text("# theory\n")
    assert find_audit([elsewhere]) is None and find_theory([elsewhere]) is None
    assert find_theory([folder]) == tmp_path / "results" / "theory" / "THEORY.md"
    row = {"rule": "sd", "K": 1, "verdict": "lossless"}
    path = tmp_path / "audit.json"
    path.write_text(json.dumps({"quick": True, "rows": [row], "peers": [{"peer": "x"}]}))
    audit = load_audit(path)
    assert audit.rows == [row] and audit.peers == [{"peer": "x"}] and audit.settings == {"quick": True}
    for other in ([row], row, {"note": "nothing"}):
        path.write_text(json.dumps(other))
        with pytest.raises(ValueError, match="not an audit"):
            load_audit(path)


def test_bad_input_exits_non_zero_and_writes_nothing(tmp_path, capsys):
    missing = tmp_path / "missing"
    assert main([str(missing)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not missing.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main([str(empty)]) == 2
    assert list(empty.iterdir()) == []


def test_missing_audit_file_given_explicitly_is_an_error(results_copy, capsys):
    assert main([str(results_copy), "--audit", str(results_copy / "nope.json")]) == 2
    assert "audit file" in capsys.readouterr().err
    assert not (results_copy / "REPORT.md").exists()


def test_quality_section_reads_saved_scores_and_never_scores(monkeypatch, tmp_path):
    import spectr_repro.quality as quality

    scored, unscored = tmp_path / "scored", tmp_path / "unscored"
    scored.mkdir()
    unscored.mkdir()
    pd.DataFrame({"method": ["ar", "sd"], "accuracy": [0.5, 0.25]}).to_csv(
        scored / "quality.csv", index=False
    )
    # The real scoring executes model-written code: the report must never reach it.
    monkeypatch.setattr(quality, "write_quality", lambda *args, **kwargs: pytest.fail("the report scored"))
    monkeypatch.setattr(quality, "quality_tables", lambda *args, **kwargs: pytest.fail("the report scored"))
    monkeypatch.setattr(quality_module, "scores_lines", lambda df: [
        " ".join(f"{m}={a}" for m, a in zip(df["method"], df["accuracy"]))])

    def section_of(*folders):
        return quality_section(ReportContext(list(folders), tmp_path / "REPORT.md", quality=load_quality(folders)))

    section = section_of(scored, unscored)
    assert section.startswith("## Quality parity with AR") and "ar=0.5 sd=0.25" in section
    assert not any(line.startswith("# ") for line in section.splitlines())  # no document heading inside
    assert "Not scored (no quality.csv)" in section and str(unscored) in section
    section = section_of(unscored)
    assert "Not computed" in section and "python -m spectr_repro quality <results_dir>" in section
    assert not (unscored / "quality.csv").exists()

    monkeypatch.setattr(quality_module, "scores_lines", lambda df: 1 / 0)
    assert "Quality files could not be read: ZeroDivisionError" in section_of(scored)
    context = ReportContext([scored], tmp_path / "REPORT.md", quality=ValueError("unreadable"))  # as loaded
    assert "Quality files could not be read: ValueError: unreadable" in quality_section(context)


def test_several_results_folders_are_merged_into_one_report(synthetic, tmp_path):
    first, second = tmp_path / "paper_main", tmp_path / "ablation_K"
    for cell in synthetic.root.glob("cells/deepseek*"):
        target = first if "__humaneval__" in cell.name else second
        shutil.copytree(cell, target / "cells" / cell.name)
    assert main([str(first), str(second)]) == 0
    table = (first / "tables" / "table1_deepseek_33b_1.3b.md").read_text()
    assert "humaneval" in table and "gsm8k" in table
    assert (first / "REPORT.md").is_file() and not (second / "REPORT.md").exists()


def test_report_has_intervals_and_the_differences_section(results_copy):
    summary_path = next(results_copy.glob("cells/qwen25coder_1.5b_0.5b__gsm8k__rbv__*/summary.json"))
    summary = json.loads(summary_path.read_text())
    summary["batch_prompts"] = 8  # a batched BE run: its wall time is no speed-up
    summary_path.write_text(json.dumps(summary))
    assert main([str(results_copy)]) == 0
    report = (results_copy / "REPORT.md").read_text()
    assert "### Which differences are real — qwen25coder_1.5b_0.5b" in report
    assert "**Δ block efficiency vs SpecTr-GBV**" in report and "**Speed-up ratio vs SD**" in report
    assert "Paired prompts per dataset: 3 — fewer than 10, so no difference can be called real." in report
    assert "Brackets: 95 % bootstrap interval over prompts (9999 resamples, seed 0; BCa" in report
    assert "- rbv on gsm8k, K=3 L=6 T=0.4: batched" in report
    speed_table = report.split("**Speed-up vs AR** (qwen")[1]
    (rbv_row,) = [line for line in speed_table.splitlines() if line.startswith("| RBV")][:1]
    assert f"{summary['speedup']:.2f}×" not in rbv_row and "n/c (batched)" in rbv_row
    assert "nan" not in report
    differences = pd.read_csv(results_copy / "tables" / "differences_qwen25coder_1.5b_0.5b.csv")
    rbv = differences[(differences["method"] == "rbv") & (differences["metric"] == "speedup")]
    assert set(rbv.loc[rbv["dataset"] == "gsm8k", "note"]) == {"n/c (batched)"} and rbv["estimate"].notna().any()
    assert not differences["real"].eq(True).any()  # 3 prompts per cell: never a verdict


def test_quality_section_adds_the_paired_test_from_per_prompt_outcomes(tmp_path):
    rows = [
        {"model_pair": "p", "dataset": "gsm8k", "temperature": 0.4, "seed": 0, "method": method,
         "prompt_id": f"q{i}", "correct": int(correct)}
        for method, outcomes in (("ar", [1, 1, 1, 1, 0, 0]), ("sd", [1, 1, 1, 1, 0, 0]), ("spectr_gbv", [0] * 6))
        for i, correct in enumerate(outcomes)
    ]
    pd.DataFrame(rows).to_csv(tmp_path / QUALITY_OUTCOMES_FILE, index=False)
    context = ReportContext([tmp_path], tmp_path / "REPORT.md", quality=load_quality([tmp_path]))
    section = quality_section(context)  # no quality.csv: the paired part alone, nothing executed
    assert section.startswith("## Quality parity with AR") and "### Paired with AR on the same prompts" in section
    (sd,) = [line for line in section.splitlines() if "| sd " in line]
    (gbv,) = [line for line in section.splitlines() if "| spectr_gbv " in line]
    assert sd.rstrip(" |").endswith("| 1") and "0.667 [0.300, 0.903]" in sd  # identical outcomes: p = 1
    assert gbv.rstrip(" |").endswith("| 0.125")  # 4 prompts only AR solved: 2 · 0.5^4
