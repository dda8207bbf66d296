import math

import pandas as pd
import pytest

from spectr_repro.analysis.load import SINGLE_DRAFT_METHODS, load_results
from spectr_repro.analysis.tables import (
    AVERAGE,
    Setting,
    build_table1,
    compare_with_paper,
    main_setting,
    table1,
)
from spectr_repro.paper import load_paper_numbers

QWEN = "qwen25coder_1.5b_0.5b"
DEEPSEEK = "deepseek_33b_1.3b"


@pytest.fixture(scope="module")
def cells(synthetic):
    return load_results(synthetic.root).cells


def _expected(synthetic, metric, method, dataset, setting):
    K = 1 if method in SINGLE_DRAFT_METHODS else setting.K
    function = (
        synthetic.expected_block_efficiency if metric == "block_efficiency" else synthetic.expected_speedup
    )
    return function(method, dataset, K, setting.L, setting.temperature)


def test_main_setting_is_inferred_per_pair(cells):
    assert main_setting(cells[cells["model_pair"] == QWEN]) == Setting(K=3, L=6, temperature=0.4)
    assert main_setting(cells[cells["model_pair"] == DEEPSEEK]) == Setting(K=3, L=12, temperature=0.4)


@pytest.mark.parametrize("metric", ["block_efficiency", "speedup"])
def test_table1_values_are_the_main_setting_cells(cells, synthetic, metric):
    table = table1(cells, QWEN, metric)
    setting = Setting(3, 6, 0.4)
    assert list(table.index) == ["ar", "sd", "spectr", "bv", "gbv", "spectr_gbv", "rbv", "sbv"]
    assert list(table.columns) == ["humaneval", "gsm8k", AVERAGE]
    for method in table.index:
        for dataset in ("humaneval", "gsm8k"):
            expected = _expected(synthetic, metric, method, dataset, setting)
            assert table.loc[method, dataset] == pytest.approx(expected, rel=1e-9), (method, dataset)
        assert table.loc[method, AVERAGE] == pytest.approx(table.loc[method, ["humaneval", "gsm8k"]].mean())
    # ablation cells (K=5, L=8, T=0.7 ...) must not leak into the table
    assert table.loc["spectr_gbv", "humaneval"] != pytest.approx(
        _expected(synthetic, metric, "spectr_gbv", "humaneval", Setting(5, 6, 0.4))
    )


def test_average_is_blank_when_a_method_misses_a_dataset(cells):
    fewer = cells[~((cells["method"] == "rbv") & (cells["dataset"] == "gsm8k"))]
    table = table1(fewer, QWEN, "block_efficiency")
    assert math.isnan(table.loc["rbv", AVERAGE]) and math.isnan(table.loc["rbv", "gsm8k"])
    assert not math.isnan(table.loc["sbv", AVERAGE])


def test_comparison_sets_paper_beside_ours_with_the_difference(cells):
    paper = load_paper_numbers()
    comparison = compare_with_paper(
        table1(cells, DEEPSEEK, "block_efficiency"), paper, DEEPSEEK, "block_efficiency"
    )
    reported = paper[(paper["model_pair"] == DEEPSEEK) & (paper["metric"] == "block_efficiency")]
    with_paper = comparison[comparison["paper"].notna()]
    assert len(with_paper) == len(reported) == 4
    for row in with_paper.itertuples():
        assert row.dataset == AVERAGE
        expected_paper = reported[reported["method"] == row.method]["value"].item()
        assert row.paper == expected_paper
        assert row.diff == pytest.approx(row.ours - expected_paper)
    # the paper gives no per-dataset numbers for this pair: blank, never filled in
    assert comparison[comparison["dataset"] != AVERAGE]["paper"].isna().all()


def test_build_table1_writes_markdown_csv_and_latex(cells, tmp_path):
    table = build_table1(cells, load_paper_numbers(), DEEPSEEK, tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == {f"table1_{DEEPSEEK}.{s}" for s in ("md", "csv", "tex")}
    markdown = table.paths["md"].read_text()
    assert "(paper 8.59, Δ " in markdown and "SpecTr-GBV" in markdown
    assert r"\begin{tabular}" in table.paths["tex"].read_text()
    reread = pd.read_csv(table.paths["csv"])
    assert len(reread) == len(table.comparison)
    assert reread["ours"].sum() == pytest.approx(table.comparison["ours"].sum(), abs=1e-3)
    assert set(reread["metric"]) == {"block_efficiency", "speedup"}


def test_throughput_ratios_are_tokens_per_second_over_the_ar_cells(cells):
    from spectr_repro.analysis.load import method_label
    from spectr_repro.analysis.tables import throughput_ratios

    ratios = throughput_ratios(cells, QWEN, Setting(3, 6, 0.4))
    assert list(ratios.columns) == ["humaneval", "gsm8k"] and "AR" not in ratios.index
    qwen = cells[(cells.model_pair == QWEN) & (cells.temperature == 0.4)]
    for dataset in ("humaneval", "gsm8k"):
        ar = qwen[(qwen.method == "ar") & (qwen.dataset == dataset)]
        for method in ("sbv", "sd"):
            K = 1 if method == "sd" else 3
            cell = qwen[(qwen.method == method) & (qwen.dataset == dataset) & (qwen.K == K) & (qwen.L == 6)]
            expected = (cell.tokens.iloc[0] / cell.wall_time_s.iloc[0]) / (ar.tokens.iloc[0] / ar.wall_time_s.iloc[0])
            assert ratios.loc[method_label(method), dataset] == pytest.approx(expected, rel=1e-12)
