"""REPORT.md: the "Bias on real models" section (from bias/bias.csv and its records) and the collapsed quality
settings that cannot tell the rules apart."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from spectr_repro.analysis.load import load_quality
from spectr_repro.analysis.report import ReportContext
from spectr_repro.analysis.report import quality as quality_module
from spectr_repro.analysis.report.bias import bias_section
from spectr_repro.analysis.report.context import load_bias
from spectr_repro.analysis.report.quality import collapse_uninformative_quality, quality_section
from spectr_repro.analysis.stats import wilson_interval
from spectr_repro.bias import estimators
from spectr_repro.bias import records as bias_records


def quality_row(dataset, method, correct, n, max_new_tokens=32):
    low, high = wilson_interval(correct, n)
    return {"experiment": "x", "dataset": dataset, "model_pair": "qwen", "temperature": 0.4,
            "max_new_tokens": max_new_tokens, "method": method, "K": 3, "L": 6, "n": n, "correct": correct,
            "accuracy": correct / n, "ci_low": low, "ci_high": high}


def test_settings_where_ar_scores_zero_or_its_interval_is_wide_collapse_to_one_line():
    df = pd.DataFrame([
        quality_row("gsm8k", "ar", 0, 8), quality_row("gsm8k", "sbv", 0, 8),  # AR 0: collapsed
        quality_row("humaneval", "ar", 3, 4), quality_row("humaneval", "sbv", 2, 4),  # interval > 0.5 wide
        quality_row("gsm8k", "ar", 20, 40, 512), quality_row("gsm8k", "sbv", 18, 40, 512),  # informative
    ])
    kept, lines, collapsed = collapse_uninformative_quality(df)
    assert len(kept) == 2 and set(kept.max_new_tokens) == {512}
    assert len(lines) == 2 and len(collapsed) == 2
    assert "AR accuracy is 0" in lines[0] and "0/8" in lines[0] and "32 new tokens" in lines[0]
    assert "spans" in lines[1] and "3/4" in lines[1]


def test_quality_section_shows_the_informative_rows_and_one_line_per_collapsed_setting(monkeypatch, tmp_path):
    pd.DataFrame([quality_row("gsm8k", "ar", 0, 8), quality_row("gsm8k", "sbv", 0, 8),
                  quality_row("gsm8k", "ar", 20, 40, 512), quality_row("gsm8k", "sbv", 18, 40, 512)]
                 ).to_csv(tmp_path / "quality.csv", index=False)
    monkeypatch.setattr(quality_module, "scores_lines", lambda df: [
        f"row {r.method} {r.max_new_tokens}" for r in df.itertuples()])
    section = quality_section(ReportContext([tmp_path], tmp_path / "REPORT.md", quality=load_quality([tmp_path])))
    assert "row sbv 512" in section and "row sbv 32" not in section
    assert "collapsed" in section and section.count("AR accuracy is 0") == 1


def fake_record(method, context, tv, p_value, top_rule):
    power_model = {"df1": 2, "df2": 30, "noncentrality": [400 * t * t for t in estimators.TV_GRID]}
    return {"method": method, "K": 3, "L": 6, "temperature": 0.4, "draft_temperature": 0.4, "model_pair": "qwen",
            "dataset": "humaneval", "samples": 32, "tv_estimate": tv, "interval": [tv / 2, tv * 2],
            "p_value": p_value, "detectable_tv": 0.2, "estimator": "counted", "acceptance": 0.9,
            "exact_tv": float("nan"), "power_model": power_model, "top_tokens": [5, 7],
            "top_target": [0.6, 0.4], "top_rule": top_rule, "top_strings": ["def", " x"], "context": context}


def write_bias_folder(root):
    folder = root / "bias"
    records = [fake_record("spectr_gbv", "P/1+0", 0.30, 0.001, [0.9, 0.1]),
               fake_record("spectr_gbv", "P/2+4", 0.05, 0.4, [0.6, 0.4]),
               fake_record("sbv", "P/1+0", 0.02, 0.7, [0.6, 0.4]), fake_record("sbv", "P/2+4", 0.01, 0.9, [0.6, 0.4]),
               fake_record("control_draft", "P/1+0", 0.9, 0.001, [0.0, 1.0])]
    for record in records:
        path = folder / "contexts" / "setting" / bias_records.safe_name(record["context"]) / f"{record['method']}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record))
    bias_records.write_csv(folder)


def test_bias_section_has_one_line_per_method_and_setting_and_the_figure_of_the_worst_context(tmp_path):
    write_bias_folder(tmp_path)
    section = bias_section(ReportContext([tmp_path], tmp_path / "REPORT.md", bias=load_bias([tmp_path])))
    table = [line for line in section.splitlines() if line.startswith("| qwen")]
    assert len(table) == 3  # spectr_gbv, sbv, the control: pooled rows only
    release = next(line for line in table if "spectr_gbv" in line)
    assert "bias detected" in release and "| 2 " in release  # two contexts, Fisher's p small
    assert "no bias detected" in next(line for line in table if "| sbv" in line)
    assert (tmp_path / "figures" / "bias_first_token.png").stat().st_size > 1000
    assert load_bias([tmp_path / "nothing"]) is None
    assert bias_section(ReportContext([tmp_path / "nothing"], tmp_path / "REPORT.md")) is None


def test_a_bias_only_folder_beside_a_results_folder_adds_the_section_to_the_report(synthetic, tmp_path):
    from spectr_repro.analysis.report import build_report

    write_bias_folder(tmp_path / "bias_run")
    report = build_report([synthetic.root, tmp_path / "bias_run"], output=tmp_path / "out" / "REPORT.md")
    text = report.read_text()
    assert "## Bias on real models" in text and "figures/bias_first_token.png" in text


def test_a_bias_only_folder_gets_a_report_of_its_own(tmp_path):
    """bias_qwen is its own experiment (no cells): `report results/bias_qwen` writes the bias section alone."""
    from spectr_repro.analysis.report import build_report

    write_bias_folder(tmp_path / "bias_run")
    report = build_report([tmp_path / "bias_run"])
    text = report.read_text()
    assert report == tmp_path / "bias_run" / "REPORT.md"
    assert "## Bias on real models" in text and "no speed-ups" in text
    assert (tmp_path / "bias_run" / "figures" / "bias_first_token.png").is_file()
    (tmp_path / "empty_run").mkdir()
    with pytest.raises(ValueError, match="no cells found"):  # a folder with neither cells nor bias nor replay
        build_report([tmp_path / "empty_run"])
