"""Table 1 with intervals and "which differences are real" on a seeded toy grid built in memory.

The grid (one model pair, humaneval and gsm8k, 12 prompts each): SD; SpecTr-GBV 0.6 BE above SD and
1.2 times faster on every prompt's scale (plus noise); SBV an exact copy of SpecTr-GBV's records (two
identical methods: the negative control); AR. Per-prompt difficulty varies 2–5 tokens per call, as in
real runs, so only a paired comparison can see the 0.6 shift clearly.
"""

import math

import numpy as np
import pandas as pd
import pytest

from spectr_repro.analysis.figures import ablation_data
from spectr_repro.analysis.tables import (
    AVERAGE,
    build_table1,
    differences_markdown,
    method_differences,
    table1,
    table1_intervals,
)
from spectr_repro.paper import load_paper_numbers

PAIR = "toy_pair"
DATASETS = ("humaneval", "gsm8k")


def toy_grid(num_prompts: int = 12, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    cells, records = [], []
    for dataset in DATASETS:
        difficulty = rng.uniform(2.0, 5.0, num_prompts)
        ar_wall = rng.uniform(2.0, 6.0, num_prompts)
        per_method = {
            "ar": (np.full(num_prompts, 10.0), ar_wall),
            "sd": (
                10 * 0.8 * difficulty + rng.normal(0, 2, num_prompts),
                ar_wall / 2.0 * rng.lognormal(0, 0.05, num_prompts),
            ),
            "spectr_gbv": (
                10 * (0.8 * difficulty + 0.6) + rng.normal(0, 2, num_prompts),
                ar_wall / 2.4 * rng.lognormal(0, 0.05, num_prompts),
            ),
        }
        per_method["sbv"] = per_method["spectr_gbv"]  # identical records
        for method, (tokens, wall) in per_method.items():
            calls = np.full(num_prompts, 10.0)
            cell_id = f"{method}-{dataset}"
            K = 3 if method in ("spectr_gbv", "sbv") else 1
            cells.append(
                {
                    "experiment": "toy", "cell_id": cell_id, "model_pair": PAIR, "method": method,
                    "dataset": dataset, "K": K, "L": 1 if method == "ar" else 6, "temperature": 0.4, "seed": 0,
                    "max_new_tokens": 32, "num_prompts": num_prompts,
                    "block_efficiency": tokens.sum() / calls.sum(), "speedup": ar_wall.sum() / wall.sum(),
                }
            )
            for index in range(num_prompts):
                records.append(
                    {
                        "experiment": "toy", "cell_id": cell_id, "method": method, "dataset": dataset,
                        "model_pair": PAIR, "seed": 0, "max_new_tokens": 32, "prompt_id": f"{dataset}/{index}",
                        "new_tokens": tokens[index], "target_calls": calls[index], "wall_time_s": wall[index],
                        "ar_wall_time_s": ar_wall[index],
                    }
                )
    return pd.DataFrame(cells), pd.DataFrame(records)


def _entry(differences, comparator, method, dataset, metric):
    rows = differences[
        (differences["comparator"] == comparator)
        & (differences["method"] == method)
        & (differences["dataset"] == dataset)
        & (differences["metric"] == metric)
    ]
    assert len(rows) == 1, (comparator, method, dataset, metric)
    return rows.iloc[0]


@pytest.fixture(scope="module")
def grid():
    return toy_grid()


@pytest.fixture(scope="module")
def differences(grid):
    return method_differences(*grid, PAIR)


def test_differences_equal_table1_differences_and_find_the_known_shift(grid, differences):
    cells, _ = grid
    be, speed = table1(cells, PAIR, "block_efficiency"), table1(cells, PAIR, "speedup")
    for dataset in (*DATASETS, AVERAGE):
        shift = _entry(differences, "spectr_gbv", "sd", dataset, "block_efficiency")
        assert shift.estimate == pytest.approx(be.loc["sd", dataset] - be.loc["spectr_gbv", dataset])
        assert shift.high < 0 and shift.low < -0.6 < shift.high  # SD is 0.6 BE below, and the interval says so
        assert shift.excludes_null and shift.real
        ratio = _entry(differences, "sd", "spectr_gbv", dataset, "speedup")
        assert ratio.estimate == pytest.approx(speed.loc["spectr_gbv", dataset] / speed.loc["sd", dataset])
        assert ratio.low > 1 and ratio.real and ratio.null == 1.0
    average = _entry(differences, "spectr_gbv", "sd", AVERAGE, "block_efficiency")
    assert average.n_paired == 24 and average.interval == "BCa"
    assert set(differences["comparator"]) == {"spectr_gbv", "sd"} and "ar" not in set(differences["method"])


def test_two_identical_methods_are_not_a_real_difference(differences):
    for dataset in (*DATASETS, AVERAGE):
        for metric, null in (("block_efficiency", 0.0), ("speedup", 1.0)):
            same = _entry(differences, "spectr_gbv", "sbv", dataset, metric)
            assert same.estimate == pytest.approx(null) and same.low <= null <= same.high
            assert not same.excludes_null and not same.real


def test_too_few_prompts_are_never_called_real():
    few = method_differences(*toy_grid(num_prompts=4), PAIR)
    shift = _entry(few, "spectr_gbv", "sd", "gsm8k", "block_efficiency")
    assert shift.n_paired == 4 and shift.excludes_null and not shift.real
    text = differences_markdown(few)
    assert "fewer than 10, so no difference can be called real" in text
    assert few["real"].eq(False).all() and few["excludes_null"].any()  # the average's 8 prompts are 4 + 4


def test_the_average_can_be_real_when_its_datasets_together_have_enough_prompts():
    some = method_differences(*toy_grid(num_prompts=5), PAIR)
    shift = _entry(some, "spectr_gbv", "sd", "gsm8k", "block_efficiency")
    assert shift.n_paired == 5 and shift.excludes_null and not shift.real
    average = _entry(some, "spectr_gbv", "sd", AVERAGE, "block_efficiency")
    assert average.n_paired == 10 and average.excludes_null and average.real
    assert "only average entries can be called real" in differences_markdown(some)


def test_differing_prompt_sets_are_compared_on_the_intersection_and_said_so(grid):
    cells, records = grid
    dropped = records.drop(records[(records["cell_id"] == "sbv-gsm8k")].index[:2])
    differences = method_differences(cells, dropped, PAIR)
    entry = _entry(differences, "spectr_gbv", "sbv", "gsm8k", "block_efficiency")
    assert (entry.n_paired, entry.n_method, entry.n_comparator) == (10, 10, 12)
    assert entry.note == "paired on the 10 prompts both ran (method 10, comparator 12)"
    assert entry.estimate == pytest.approx(0.0)  # the same prompts of identical methods
    text = differences_markdown(differences)
    assert "‡ Prompt sets differ; compared on the intersection:" in text
    assert "SBV vs SpecTr-GBV, gsm8k, block_efficiency: paired on the 10 prompts" in text


def test_markdown_marks_real_differences_in_bold(differences):
    text = differences_markdown(differences)
    assert "**Δ block efficiency vs SpecTr-GBV**" in text and "**Speed-up ratio vs SD**" in text
    shift = _entry(differences, "spectr_gbv", "sd", "gsm8k", "block_efficiency")
    assert f"**{shift.estimate:+.2f} [{shift.low:+.2f}, {shift.high:+.2f}]**" in text
    versus_gbv = text.split("**Speed-up ratio vs SpecTr-GBV**")[0]
    (sbv,) = [line for line in versus_gbv.splitlines() if line.startswith("| SBV")]
    assert "+0.00 [+0.00, +0.00]" in sbv and "**" not in sbv  # identical methods: not bold
    real = int(differences["real"].eq(True).sum())
    assert f"Real differences: {real} of {len(differences)} entries" in text


def test_table1_values_carry_intervals_that_contain_them(grid, tmp_path):
    cells, records = grid
    for metric in ("block_efficiency", "speedup"):
        wide = table1(cells, PAIR, metric)
        intervals = table1_intervals(cells, records, PAIR, metric).set_index(["method", "dataset"])
        for method in wide.index:
            for dataset in wide.columns:
                low, high = intervals.loc[(method, dataset), ["low", "high"]]
                assert low - 1e-9 <= wide.loc[method, dataset] <= high + 1e-9, (metric, method, dataset)
        # the average's interval resamples within datasets: narrower than either dataset's on its own
        width = intervals["high"] - intervals["low"]
        assert width[("sd", AVERAGE)] < min(width[("sd", d)] for d in DATASETS)
    table = build_table1(cells, load_paper_numbers(), PAIR, tmp_path, records=records)
    row = table.comparison.set_index(["metric", "method", "dataset"]).loc[("block_efficiency", "sd", "gsm8k")]
    assert f"{row.ours:.2f} [{row.ours_low:.2f}, {row.ours_high:.2f}]" in table.markdown
    assert {"ours_low", "ours_high", "interval", "n_prompts", "note"} <= set(pd.read_csv(table.paths["csv"]))
    assert "bootstrap intervals over prompts in brackets" in table.paths["tex"].read_text()


def test_batched_cells_never_show_a_speedup(grid, tmp_path):
    cells, records = grid
    batched = cells.assign(batch_prompts=np.where(cells["cell_id"] == "spectr_gbv-gsm8k", 8, np.nan))
    speed = table1(batched, PAIR, "speedup")
    assert math.isnan(speed.loc["spectr_gbv", "gsm8k"]) and math.isnan(speed.loc["spectr_gbv", AVERAGE])
    unflagged = table1(cells, PAIR, "speedup")
    assert speed.loc["spectr_gbv", "humaneval"] == pytest.approx(unflagged.loc["spectr_gbv", "humaneval"])
    assert table1(batched, PAIR, "block_efficiency").loc["spectr_gbv", "gsm8k"] > 0  # BE is unaffected

    table = build_table1(batched, load_paper_numbers(), PAIR, tmp_path, records=records)
    entry = table.comparison.set_index(["metric", "method", "dataset"]).loc[("speedup", "spectr_gbv", "gsm8k")]
    assert math.isnan(entry.ours) and math.isnan(entry.ours_low) and entry.note == "n/c (batched)"
    speed_table = table.markdown.split("**Speed-up vs AR**")[1]
    assert "n/c (batched)" in speed_table and "n/c (a dataset not comparable)" in speed_table
    (row,) = [line for line in speed_table.splitlines() if line.startswith("| SpecTr-GBV")]
    assert "×" in row.split("|")[2] and row.split("|")[3].strip() == "n/c (batched)"  # humaneval | gsm8k

    differences = method_differences(batched, records, PAIR)
    for comparator, method in (("spectr_gbv", "sd"), ("sd", "spectr_gbv")):
        entry = _entry(differences, comparator, method, "gsm8k", "speedup")
        assert entry.note == "n/c (batched)" and math.isnan(entry.estimate)
        assert _entry(differences, comparator, method, AVERAGE, "speedup").note == "n/c (a dataset not comparable)"
        assert _entry(differences, comparator, method, "gsm8k", "block_efficiency").real

    ablation = ablation_data(batched, records, PAIR, "K")
    point = ablation[(ablation["method"] == "spectr_gbv") & (ablation["dataset"] == "gsm8k")]
    assert list(point["metric"]) == ["block_efficiency"]  # no speed-up point for the batched cell


def test_batched_prompts_without_wall_times_leave_the_speedup_to_the_timed_ones():
    """hardware.batch_prompts: prompts past the first timed_prompts carry no wall time (None -> NaN). Block
    efficiency pairs every prompt; the speed-up ratio pairs the timed prompts only, and equals the full
    computation on those prompts alone."""
    cells, records = toy_grid(num_prompts=12)
    index = records["prompt_id"].str.split("/").str[1].astype(int)
    batched = records.assign(
        wall_time_s=records["wall_time_s"].where(index < 4), ar_wall_time_s=records["ar_wall_time_s"].where(index < 4)
    )
    cells = cells.assign(batch_prompts=8, timed_prompts=4)
    mixed = method_differences(cells, batched, PAIR)
    timed_only = method_differences(cells, records[index < 4], PAIR)
    for dataset in (*DATASETS, AVERAGE):
        be = _entry(mixed, "sd", "spectr_gbv", dataset, "block_efficiency")
        assert be.n_paired == 12 * (len(DATASETS) if dataset == AVERAGE else 1)
        speed, expected = (_entry(frame, "sd", "spectr_gbv", dataset, "speedup") for frame in (mixed, timed_only))
        assert speed.n_paired == expected.n_paired == 4 * (len(DATASETS) if dataset == AVERAGE else 1)
        assert speed.estimate == pytest.approx(expected.estimate) and speed.low == pytest.approx(expected.low)
        assert not speed.note  # the untimed prompts are not "prompt sets that differ"


def test_a_comparator_is_its_rule_as_configured_not_an_option_variant():
    cells, records = toy_grid(num_prompts=12)
    configured, variant = "spectr_gbv[carry_over=False]", "spectr_gbv[arithmetic=release_bf16,carry_over=False]"
    renamed = [frame.replace({"method": {"spectr_gbv": configured, "sbv": variant}}) for frame in (cells, records)]
    differences = method_differences(*renamed, PAIR)
    assert set(differences["comparator"]) == {configured, "sd"}
    same = _entry(differences, configured, variant, "gsm8k", "block_efficiency")  # identical records
    assert same.estimate == pytest.approx(0.0)
