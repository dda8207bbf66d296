from spectr_repro.analysis.load import DATASET_ORDER, METHOD_ORDER
from spectr_repro.analysis.tables import AVERAGE, METRICS
from spectr_repro.paper import load_paper_numbers, paper_table, release_numbers, unlabelled_numbers

PAIRS = {"deepseek_33b_1.3b", "deepseek_6.7b_1.3b"}


def test_paper_numbers_use_our_names():
    everything = load_paper_numbers()
    paper = everything[~everything["source"].str.startswith("github junemily/SpecTr-GBV")]
    assert len(paper) + len(release_numbers(everything)) == len(everything)
    assert set(paper["method"]) <= set(METHOD_ORDER)
    assert set(paper["dataset"]) <= set(DATASET_ORDER) | {AVERAGE, ""}
    assert set(paper["model_pair"]) <= PAIRS | {""}
    assert set(paper["source"]) == {"arXiv 2604.25925"}  # blank source = the paper
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


def test_release_numbers_carry_their_source_and_the_release_pairs():
    """The code release's README numbers (issue 24): HumanEval on the Llama pairs, MCSD as its only extra method."""
    release = release_numbers(load_paper_numbers())
    assert len(release) == 18  # 4 pairs x 3 methods BE, + tokens/s for the two 7B pairs
    assert set(release["model_pair"]) == {"llama2_7b_68m", "llama2_7b_160m", "llama2_13b_68m", "llama2_13b_160m"}
    assert set(release["dataset"]) == {"humaneval"} and set(release["method"]) == {"gbv", "mcsd", "spectr_gbv"}
    assert set(release["metric"]) == {"block_efficiency", "tokens_per_s"}
    assert release["source"].str.startswith("github junemily/SpecTr-GBV").all()
    assert not release.duplicated(["model_pair", "method", "metric"]).any()
    be = paper_table(load_paper_numbers(), "llama2_7b_68m", "block_efficiency")
    assert be.loc["spectr_gbv", "humaneval"] == 3.17 and be.loc["gbv", "humaneval"] == 1.53
