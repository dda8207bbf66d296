"""Context length and output position from replay records (synthetic, written as the replay writes them): tokens per
call by bucket and by output position with intervals, per-position acceptance from the L grid, the paired change of
a rule's gain over SD with input length (and a negative control), older records without output_position, and the
report section."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from spectr_repro.analysis.context_length import (
    acceptance_by_output_position,
    by_input_length,
    by_output_position,
    chunked_prefill_seconds,
    gain_change,
    position_bins,
)
from spectr_repro.analysis.replay import read_blocks, write_summaries
from spectr_repro.cost.calibration import ForwardCosts
from spectr_repro.replay.driver import write_prompt

RESAMPLES = 999
PROMPTS = 12


def sd_tokens(L: int, alpha: float) -> float:
    """SD's E[tau + 1] at L with acceptance alpha at every position: 1 + alpha + ... + alpha^L."""
    return 1.0 + sum(alpha ** i for i in range(1, L + 1))


def write_replay(root, dataset: str, gain: float, alpha_early: float = 0.8, alpha_late: float = 0.8,
                 with_positions: bool = True, seed: int = 0, blocks_per_prompt: int = 40, step: int = 4) -> None:
    """A replay group of ``PROMPTS`` prompts: SD at K=1 and SBV at K=3 (SD's value + ``gain`` at L=3) at L = 1, 2, 3;
    SD accepts with ``alpha_early`` before 64 generated tokens and ``alpha_late`` after; every block emits ``step``
    tokens (its reference_tokens), so block b starts at output position step * b."""
    rng = np.random.default_rng(seed)
    folder = root / f"tiny_random__{dataset}__T0.4__{seed:08d}"
    folder.mkdir(parents=True)
    meta = {"model_pair": "tiny_random", "dataset": dataset, "temperature": 0.4, "num_prompts": PROMPTS,
            "max_new_tokens": step * blocks_per_prompt, "seed": 0, "dtype": "float32", "methods": ["sd", "sbv"],
            "K": [1, 3], "L": [1, 2, 3], "reference": "sbv", "reference_K": 3, "reference_L": 3, "draws": 1,
            "row_groups": "disjoint"}
    (folder / "replay.json").write_text(json.dumps(meta))
    for index in range(PROMPTS):
        prompt_noise = rng.normal(0, 0.05)
        blocks = []
        for b in range(blocks_per_prompt):
            alpha = alpha_early if step * b < 64 else alpha_late
            values = []
            for L in (1, 2, 3):
                sd = sd_tokens(L, alpha) + prompt_noise + rng.normal(0, 0.05)
                values += [["sd", 1, L, sd, "exact", 0], ["sbv", 1, L, sd, "exact", 0],
                           ["sbv", 3, L, sd + gain * L / 3 + rng.normal(0, 0.05), "exact", 0]]
            block = {"iteration": b, "reference_tokens": step, "values": values, "rule_seconds": 0.0}
            if with_positions:
                block["output_position"] = step * b
            blocks.append(block)
        write_prompt(folder / "prompts" / f"{index:04d}", blocks, {"prompt_id": f"longcode/repo{index}",
                                                                    "index": index, "prompt_tokens": 1000})


@pytest.fixture
def two_buckets(tmp_path):
    root = tmp_path / "replay"
    write_replay(root, "longcode_1k", gain=0.5, seed=1)
    write_replay(root, "longcode_16k", gain=0.2, seed=2)
    return root


def test_tokens_per_call_by_bucket_carry_the_bucket_length_and_intervals(two_buckets):
    blocks, _ = read_blocks(two_buckets)
    table = by_input_length(blocks, RESAMPLES)
    assert list(dict.fromkeys(table["input_tokens"])) == [1024, 16384]  # shortest first, from the bucket configs
    sbv = table[(table["method"] == "sbv") & (table["K"] == 3) & (table["L"] == 3)].set_index("input_tokens")
    sd = table[(table["method"] == "sd") & (table["L"] == 3)].set_index("input_tokens")
    for size, gain in ((1024, 0.5), (16384, 0.2)):
        assert sbv.loc[size, "tokens_per_call"] - sd.loc[size, "tokens_per_call"] == pytest.approx(gain, abs=0.03)
        assert sd.loc[size, "ci_low"] < sd.loc[size, "tokens_per_call"] < sd.loc[size, "ci_high"]
        assert sd.loc[size, "prompts"] == PROMPTS


def test_a_shrinking_gain_is_detected_and_an_unchanged_one_is_not(two_buckets, tmp_path):
    blocks, _ = read_blocks(two_buckets)
    change = gain_change(blocks, "sbv", 3, 3, "sd", RESAMPLES)
    # the gain drops from 0.5 to 0.2: the paired interval of the change (12 repositories in both) excludes 0
    assert change["prompts"] == PROMPTS and change["change"] == pytest.approx(-0.3, abs=0.03)
    assert change["ci_high"] < 0
    # negative control: the same gain at both lengths (with the same noise) gives an interval around 0
    same = tmp_path / "same"
    write_replay(same, "longcode_1k", gain=0.3, seed=1)
    write_replay(same, "longcode_16k", gain=0.3, seed=2)
    control = gain_change(read_blocks(same)[0], "sbv", 3, 3, "sd", RESAMPLES)
    assert control["ci_low"] < 0 < control["ci_high"]


def test_tokens_per_call_by_output_position(tmp_path):
    root = tmp_path / "replay"
    write_replay(root, "longcode_1k", gain=0.3, alpha_early=0.9, alpha_late=0.5, seed=3)
    blocks, _ = read_blocks(root)
    table = by_output_position(blocks, (0, 64, 256), RESAMPLES)
    sd = table[(table["method"] == "sd") & (table["L"] == 3)].set_index("position")
    assert list(sd.index) == ["0-64", "64-256"]  # 40 blocks of 4 tokens: positions 0 .. 156; no block past 256
    assert sd.loc["0-64", "blocks"] == PROMPTS * 16 and sd.loc["64-256", "blocks"] == PROMPTS * 24
    assert sd.loc["0-64", "tokens_per_call"] == pytest.approx(sd_tokens(3, 0.9), abs=0.05)
    assert sd.loc["64-256", "tokens_per_call"] == pytest.approx(sd_tokens(3, 0.5), abs=0.05)
    assert sd.loc["64-256", "ci_high"] < sd.loc["0-64", "ci_low"]  # the drop is outside both intervals

    acceptance = acceptance_by_output_position(blocks, (0, 64, 256))
    row = acceptance[(acceptance["method"] == "sd") & (acceptance["position"] == "0-64")].iloc[0]
    # SD's gain of drafting position i is P(first i accepted) = alpha^i
    assert [row[f"position_{i}"] for i in (1, 2, 3)] == pytest.approx([0.9, 0.81, 0.729], abs=0.03)
    late = acceptance[(acceptance["method"] == "sd") & (acceptance["position"] == "64-256")].iloc[0]
    assert late["position_1"] == pytest.approx(0.5, abs=0.03)


def test_older_records_without_output_position_get_it_from_the_reference_tokens(tmp_path):
    write_replay(tmp_path / "new", "longcode_1k", gain=0.3, seed=4)
    write_replay(tmp_path / "old", "longcode_1k", gain=0.3, seed=4, with_positions=False)
    new, old = read_blocks(tmp_path / "new")[0], read_blocks(tmp_path / "old")[0]
    assert old["output_position"].tolist() == new["output_position"].tolist()
    assert sorted(new["output_position"].unique())[:3] == [0, 4, 8]


def test_position_bins_are_half_open_and_the_last_is_open():
    bins = position_bins(pd.Series([0, 63, 64, 255, 256, 5000]), (0, 64, 256, 1024))
    assert bins.tolist() == ["0-64", "0-64", "64-256", "64-256", "256-1024", "1024+"]


def test_chunked_prefill_prices_each_chunk_at_its_context():
    # 10 ms a chunk on an empty cache, 30 ms on 1,000 cached tokens: linear in between
    costs = ForwardCosts(((1, 256, "last", 0.010), (1, 256, "last", 0.030)), contexts=(0, 1000))
    seconds = chunked_prefill_seconds(costs, 1024, 256)
    expected = sum(0.010 + 0.020 * start / 1000 for start in (0, 256, 512, 768))
    assert seconds == pytest.approx(expected)
    assert chunked_prefill_seconds(costs, 1024, 256) > 4 * 0.010  # grows with context, unlike a flat price


def test_the_report_section_renders_tables_figures_and_a_paragraph(two_buckets, tmp_path):
    from spectr_repro.analysis.report.context import load_context
    from spectr_repro.analysis.report.context_length import context_length_section

    write_summaries(two_buckets, resamples=RESAMPLES)
    context = load_context([two_buckets.parent], output=tmp_path / "report" / "REPORT.md")
    text = context_length_section(context)
    assert text.startswith("## Context length and output position")
    assert "shrinks with context" in text  # the paragraph says what the numbers show
    assert "| SBV K=3" in text and "1K (12 prompts)" in text and "16K (12 prompts)" in text
    out = tmp_path / "report"
    assert (out / "figures" / "context_input_length.png").is_file()
    assert (out / "figures" / "context_output_position.png").is_file()
    assert pd.read_csv(out / "tables" / "context_output_position.csv")["tokens_per_call"].notna().all()
    assert "not predicted here" in text  # no calibration of the tiny pair in this test's calibration file


def test_each_pair_and_temperature_gets_its_own_subsection(tmp_path):
    from spectr_repro.analysis.report.context import load_context
    from spectr_repro.analysis.report.context_length import context_length_section

    root = tmp_path / "results" / "replay"
    write_replay(root, "longcode_1k", gain=0.3, seed=5)
    write_replay(root, "longcode_16k", gain=0.3, seed=6)
    for path in root.glob("*/replay.json"):  # a second temperature: the same blocks under T=0.7
        copy = path.parent.with_name(path.parent.name.replace("T0.4", "T0.7"))
        shutil.copytree(path.parent, copy)
        meta = json.loads((copy / "replay.json").read_text())
        (copy / "replay.json").write_text(json.dumps({**meta, "temperature": 0.7}))
    write_summaries(root, resamples=RESAMPLES)
    text = context_length_section(load_context([root.parent], output=tmp_path / "report" / "REPORT.md"))
    assert "### tiny_random, T=0.4" in text and "### tiny_random, T=0.7" in text
    assert (tmp_path / "report" / "figures" / "context_input_length_tiny_random_T0.7.png").is_file()
    table = pd.read_csv(tmp_path / "report" / "tables" / "context_input_length.csv")
    assert set(table["temperature"]) == {0.4, 0.7}


def test_the_report_summarises_a_replay_stopped_before_its_summary(two_buckets, tmp_path):
    """A replay writes its summary when the command ends; the report of a replay stopped (or still running) rebuilds
    it from the finished prompts instead of leaving the replay out, and rebuilds a summary older than a prompt."""
    import os

    from spectr_repro.analysis.report.context import REPLAY_SUMMARY, load_replay

    def buckets(replay):
        return set(replay.table["dataset"]) - {"average"}  # the summary adds the datasets' average

    summary = two_buckets.parent / REPLAY_SUMMARY
    assert not summary.exists()
    replay = load_replay([two_buckets.parent], tmp_path / 'report')
    assert replay is not None and summary.is_file()
    assert buckets(replay) == {"longcode_1k", "longcode_16k"}
    # a summary older than a finished prompt (one group only, then the other finished): rebuilt with both groups
    pd.read_csv(summary).query("dataset == 'longcode_1k'").to_csv(summary, index=False)
    os.utime(summary, (0, 0))
    assert buckets(load_replay([two_buckets.parent], tmp_path / 'report')) == {"longcode_1k", "longcode_16k"}
    # negative control: a summary newer than every prompt is read as it is, not rebuilt
    pd.read_csv(summary).query("dataset == 'longcode_1k'").to_csv(summary, index=False)
    assert buckets(load_replay([two_buckets.parent], tmp_path / 'report')) == {"longcode_1k"}
    # committed (sealed) results are never written into: their summary is rebuilt in the report's folder
    manifest = next(two_buckets.glob("*/replay.json")).parent / "manifest.json"
    manifest.write_text("{}")
    before = summary.stat().st_mtime_ns
    for done in two_buckets.glob("*/prompts/*/done.json"):
        os.utime(done)  # newer than the summary: it must be rebuilt, and not here
    replay = load_replay([two_buckets.parent], tmp_path / "report")
    assert buckets(replay) == {"longcode_1k", "longcode_16k"} and summary.stat().st_mtime_ns == before
    assert (tmp_path / "report" / "replay_summaries" / two_buckets.parent.name / "replay_summary.csv").is_file()
    # a folder without finished prompts has no replay
    (tmp_path / "empty" / "replay").mkdir(parents=True)
    assert load_replay([tmp_path / "empty"], tmp_path / "report") is None
