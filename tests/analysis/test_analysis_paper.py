from spectr_repro.analysis.load import DATASET_ORDER, METHOD_ORDER
from spectr_repro.analysis.paper import load_paper_numbers, paper_table, unlabelled_numbers
from spectr_repro.analysis.tables import AVERAGE, METRICS

PAIRS = {"deepseek_33b_1.3b", "deepseek_6.7b_1.3b"}


def test_paper_numbers_use_our_names():
    paper = load_paper_numbers()
    assert len(paper) > 0
    assert set(paper["method"]) <= set(METHOD_ORDER)
    assert set(paper["dataset"]) <= set(DATASET_ORDER) | {AVERAGE, ""}
    assert set(paper["model_pair"]) <= PAIRS | {""}
    labelled = paper[paper["model_pair"] != ""]
    assert set(labelled["metric"]) <= set(METRICS)
    assert not labelled.duplicated(["model_pair", "dataset", "method", "metric"]).any()
    assert paper["value"].notna().all() and (paper["value"] > 0).all()


def test_unlabelled_numbers_are_marked_and_kept_out_of_pair_tables():
    paper = load_paper_numbers()
    unlabelled = unlabelled_numbers(paper)
    assert len(unlabelled) > 0
    assert unlabelled["note"].str.contains("without setting labels|setting unknown").all()
    for pair in PAIRS:
        table = paper_table(paper, pair, "block_efficiency")
        # only the five-dataset averages are labelled with a pair; per-dataset cells stay blank
        assert list(table.columns) == [AVERAGE]
        assert set(table.index) == {"sd", "spectr", "gbv", "spectr_gbv"}


def test_paper_table_aligns_with_our_method_order():
    paper = load_paper_numbers()
    table = paper_table(paper, "deepseek_33b_1.3b", "speedup")
    # SpecTr-GBV is the paper's best average speed-up on the 33B pair
    assert table[AVERAGE].idxmax() == "spectr_gbv"
    assert paper_table(paper, "qwen25coder_1.5b_0.5b", "speedup").empty
