"""REPORT.md with a replay: the verdicts open it, the replayed Table 1, figures and the agreement table follow."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest

from spectr_repro.analysis.replay import reference_setting
from spectr_repro.analysis.replay_report import (
    _equality_verdict,
    _monotone_verdict,
    _order_verdict,
    default_variant,
    full_block_tokens,
    main_cells,
    verdict_rows,
)
from spectr_repro.analysis.report import build_report
from spectr_repro.analysis.stats import Interval
from spectr_repro.replay.driver import main as replay_main
from spectr_repro.runner.cli import main_sweep


@pytest.fixture(autouse=True)
def isolated_runner_registry(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTR_REPRO_RUNNERS", str(tmp_path / "runners"))


def test_report_opens_with_verdicts_and_shows_the_replay(tmp_path):
    common = ["model_pair=tiny_random", "num_prompts=3", "max_new_tokens=10", f"output_dir={tmp_path}",
              "logger=disabled"]
    assert replay_main([*common, "method=sd,gbv,spectr,spectr_gbv", "K=1,2", "L=2,3", "replay.draws=2"]) == 0
    assert main_sweep([*common, "method=sd", "K=1", "L=2"]) == 0
    diffs = pd.read_csv(tmp_path / "default" / "replay" / "replay_differences.csv")
    sd_vs_release = diffs[(diffs["method"] == "sd") & (diffs["comparator"] == "spectr_gbv")]
    assert set(sd_vs_release["comparator_K"]) == {1, 2}  # a single-draft rule against the release at every K
    report = build_report([tmp_path / "default"]).read_text()
    headings = [line for line in report.splitlines() if line.startswith("## ")]
    assert headings[0].startswith("## Verdicts")
    assert "## Table 1 — tokens per target call on shared blocks" in report
    assert report.index("tokens per target call on shared blocks") < report.index("## Table 1 — tiny_random")
    assert "| SD " in report.split("### Replay against the trajectory cells")[1]
    differences = report.split("### Which replayed differences are real")[1].split("###")[0]
    assert "| method " in differences and "| vs " in differences and "('" not in differences  # flat, not tuples
    assert (tmp_path / "default" / "figures" / "replay_ablation_K.png").is_file()
    assert (tmp_path / "default" / "figures" / "replay_ablation_L.png").is_file()


def _interval(estimate, low, high, n=10):
    return Interval(estimate, low, high, "BCa", n)


def test_verdict_logic():
    assert _order_verdict([_interval(0.2, 0.1, 0.3), _interval(0.1, 0.05, 0.2)])[0] == "holds"
    assert _order_verdict([_interval(0.2, 0.1, 0.3), _interval(-0.2, -0.3, -0.1)])[0] == "does not hold"
    verdict, note = _order_verdict([_interval(0.02, -0.02, 0.06, n=16)])
    assert verdict == "undecided" and "64 prompts" in note  # half-width 0.04 / 0.02 -> (2)^2 x 16
    assert _monotone_verdict([_interval(-0.2, -0.3, -0.1)])[0] == "does not hold"
    assert _monotone_verdict([_interval(0.0, -0.1, 0.1)])[0].startswith("holds (no decrease")


def test_an_equality_claim_tolerates_float_rounding_only():
    """SpecTr-GBV(K=1) = GBV: two exact expectations of one law differ by float32 rounding (measured ~2e-8 tokens
    per call on the Qwen replay, all of one sign on a dataset: an interval excluding 0); that holds. A real
    difference of 0.01 tokens per call does not (negative control), and an interval around 0 wider than the
    tolerance holds only as "no difference detected"."""
    assert _equality_verdict(_interval(2e-8, 9e-9, 3.7e-8), "")[0] == "holds"
    assert _equality_verdict(_interval(0.01, 0.005, 0.015), "")[0] == "does not hold"
    assert _equality_verdict(_interval(0.0, -0.02, 0.02), "")[0] == "holds (no difference detected)"
    assert _equality_verdict(None, "not replayed") == ("undecided", "not replayed")


def test_verdicts_read_the_audit():
    blocks = pd.DataFrame({"model_pair": ["p"] * 2, "dataset": ["d"] * 2, "temperature": [0.4] * 2,
                           "prompt_id": ["a", "b"], "iteration": [0, 0], "reference_tokens": [2, 2],
                           "method": ["sd"] * 2, "K": [1, 1], "L": [2, 2], "tokens": [1.5, 1.7],
                           "estimator": ["exact"] * 2, "draws": [0, 0]})
    table = pd.DataFrame({"method": ["sd"], "K": [1], "L": [2]})
    rows = verdict_rows(blocks, table, [{"rule": "spectr_gbv", "exact_tv": 0.1, "options": None}])
    assert rows[0]["verdict"] == "does not hold" and "0.100" in rows[0]["measured"]
    assert verdict_rows(blocks, table, [{"rule": "spectr_gbv", "exact_tv": 1e-15}])[0]["verdict"] == "holds"


def test_a_replay_only_folder_reports_beside_a_folder_of_cells(tmp_path):
    """`report results/cpu_quick results/replay_qwen`: a folder with a replay and no cells feeds the replay's sections;
    alone it gets a report of its own (the verdicts and the replay, no trajectory tables: no speed-ups)."""
    common = ["model_pair=tiny_random", "num_prompts=2", "max_new_tokens=8", "logger=disabled"]
    assert replay_main([*common, f"output_dir={tmp_path / 'r'}", "method=sd,gbv", "K=1", "L=2", "replay.draws=1"]) == 0
    assert main_sweep([*common, f"output_dir={tmp_path / 'c'}", "method=sd", "K=1", "L=2"]) == 0
    cells, replayed = tmp_path / "c" / "default", tmp_path / "r" / "default"
    report = build_report([cells, replayed], output=tmp_path / "out" / "REPORT.md").read_text()
    assert [line for line in report.splitlines() if line.startswith("## ")][0].startswith("## Verdicts")
    alone = build_report([replayed], output=tmp_path / "alone" / "REPORT.md").read_text()
    headings = [line for line in alone.splitlines() if line.startswith("## ")]
    assert headings[0].startswith("## Verdicts") and any(h.startswith("## Table 1") for h in headings)
    assert "no speed-ups" in alone and "## Environment" not in alone


def test_full_blocks_include_the_last_one_and_are_unbiased():
    """A trajectory's full blocks estimate the rule's tokens per call without bias when the last block counts:
    whether a block is drafted whole depends on the past only. Simulated with i.i.d. accepted lengths (known mean
    5.25) and the engine's truncation (max_new_tokens 32, L = 6, a block shortened to the tokens still wanted),
    20,000 trajectories, seed 0: the estimate lies within 4 standard errors (SE ~0.007). Negative control (power):
    leaving each prompt's last block out, the estimator used until 2026-12-02, is biased down by ~0.03 (> 4 SE)."""
    rng = np.random.default_rng(0)
    L, max_new_tokens = 6, 32
    law = np.array([0.10, 0.08, 0.07, 0.07, 0.08, 0.10, 0.50])
    mean = float((np.arange(L + 1) + 1) @ law)
    kept, without_last = [], []
    for _ in range(20_000):
        accepted, lengths, emitted = [], [], 0
        while emitted < max_new_tokens:
            length = min(L, max_new_tokens - emitted - 1)
            tau = min(int(rng.choice(L + 1, p=law)), length)
            accepted.append(tau), lengths.append(length)
            emitted += tau + 1
        kept += full_block_tokens(accepted, lengths, L)
        without_last += full_block_tokens(accepted[:-1], lengths[:-1], L)

    def error_in_ses(values):
        values = np.asarray(values, dtype=float)
        return (values.mean() - mean) / (values.std() / np.sqrt(len(values)))

    assert abs(error_in_ses(kept)) < 4
    assert error_in_ses(without_last) < -4


def test_the_main_setting_is_the_reference_trajectory_where_replayed(tmp_path):
    """cpu_quick replays L = 4, 6, 8 around its sbv K=3 L=6 reference: Table 1 and the verdicts sit at L=6 (its
    timed cells' L), not at the smallest L; without a usable reference, K=3 and the smallest L."""
    table = pd.DataFrame({"K": [1, 3, 5, 7] * 3, "L": [4] * 4 + [6] * 4 + [8] * 4})
    assert main_cells(table, (3, 6)) == (3, 6)
    assert main_cells(table, (3, 12)) == (3, 4) and main_cells(table) == (3, 4)
    for name, reference_L in (("a", 6), ("b", 6)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "replay.json").write_text(json.dumps({"reference_K": 3, "reference_L": reference_L}))
    assert reference_setting(tmp_path) == (3, 6)
    (tmp_path / "b" / "replay.json").write_text(json.dumps({"reference_K": 3, "reference_L": 12}))
    assert reference_setting(tmp_path) is None  # groups disagree: no single reference


def test_the_trajectory_side_is_the_rule_as_the_replay_runs_it():
    """The sweep names option variants ("spectr_gbv[carry_over=False]" beside the release's bfloat16 arithmetic):
    the agreement and the speed-up series take the rule's own variant (fewest options), never the other."""
    frame = pd.DataFrame({"method": ["spectr_gbv[arithmetic=release_bf16,carry_over=False]",
                                     "spectr_gbv[carry_over=False]", "sbv", "gbv[carry_over=False]"],
                          "value": [1, 2, 3, 4]})
    assert default_variant(frame, "spectr_gbv")["value"].tolist() == [2]
    assert default_variant(frame, "sbv")["value"].tolist() == [3]
    assert default_variant(frame, "spectr").empty


def test_agreement_compares_cells_of_the_replay_temperature_only():
    """cpu_quick's T ablation has sbv cells at K=3 L=6 on HumanEval at T=0.1 and 0.7: they stay out of the T=0.4
    replay's agreement row (they made it n=14 prompts instead of 10 until 2026-12-02). Negative control: the
    same cells at T=0.4 do enter it."""
    from spectr_repro.analysis.replay_report import agreement_markdown

    blocks = pd.DataFrame({"model_pair": "p", "dataset": "humaneval", "temperature": 0.4,
                           "prompt_id": ["a", "a", "b", "b"], "iteration": [0, 1, 0, 1], "reference_tokens": 5,
                           "method": "sbv", "K": 3, "L": 6, "tokens": [5.0, 6.0, 4.0, 5.5], "estimator": "exact",
                           "draws": 0})
    table = pd.DataFrame({"method": ["sbv"], "K": [3], "L": [6]})

    def records(temperatures):
        return pd.DataFrame({"method": "sbv", "K": 3, "L": 6, "dataset": "humaneval", "model_pair": "p",
                             "prompt_id": [f"x{i}" for i in range(len(temperatures))], "temperature": temperatures,
                             "accepted_lengths": [[6, 3]] * len(temperatures),
                             "block_lengths": [[6, 6]] * len(temperatures)})

    def prompts(text):  # (trajectory, replay) prompt counts of the SBV row
        row = next(line for line in text.splitlines() if "| SBV" in line)
        return re.findall(r"n=(\d+)", row)

    assert prompts(agreement_markdown(blocks, table, records([0.4, 0.4, 0.1, 0.7]), 3, 6, resamples=200)) == ["2", "2"]
    assert prompts(agreement_markdown(blocks, table, records([0.4] * 4), 3, 6, resamples=200)) == ["4", "2"]


def _k1_blocks(release_estimator: str) -> pd.DataFrame:
    """Ten prompts where the release at K=1 sits 0.03 below gbv on every block (an interval excluding 0)."""
    rows = []
    for index in range(10):
        base = {"model_pair": "p", "dataset": "d", "temperature": 0.4, "prompt_id": f"p{index}", "iteration": 0,
                "reference_tokens": 2, "K": 1, "L": 6, "draws": 0, "output_position": 0, "prompt_tokens": 10}
        rows.append({**base, "method": "gbv", "tokens": 3.0 + index / 10, "estimator": "exact"})
        rows.append({**base, "method": "spectr_gbv", "tokens": 2.97 + index / 10, "estimator": release_estimator,
                     "draws": 16 if release_estimator == "monte_carlo" else 0})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("estimator, verdict", [("monte_carlo", "undecided"), ("exact", "does not hold")])
def test_k1_equality_with_a_sampled_release_is_not_refuted_by_its_draws(estimator, verdict):
    """The release's K=1 values drawn by Monte-Carlo (replay.sampled) against gbv's exact ones: a prompt bootstrap
    of few prompts understates the draws' noise (docs/replay.md, 2026-12-05), so the equality claim is undecided,
    never refuted, there. Negative control: the same difference between exact values does not hold."""
    blocks = _k1_blocks(estimator)
    table = pd.DataFrame({"method": ["gbv", "spectr_gbv"], "K": [1, 1], "L": [6, 6], "dataset": ["d", "d"],
                          "temperature": [0.4, 0.4], "model_pair": ["p", "p"]})
    rows = {row["claim"]: row for row in verdict_rows(blocks, table, None, main=(1, 6))}
    assert rows["K=1 reduces to GBV"]["verdict"] == verdict


def test_an_average_over_datasets_needs_every_dataset_of_the_group():
    """hsd, registered after the grid began, has no humaneval prompts: its mean over the other datasets is not the
    others' average (it would read 4.28 beside 5.0 because humaneval, the easy one, is missing). It gets no average
    row and no averaged difference; sbv, on every dataset, keeps both (the negative control)."""
    from spectr_repro.analysis.replay import AVERAGE, differences, summary

    rows = []
    for dataset, tokens in (("humaneval", 6.0), ("lm1b", 3.0), ("gsm8k", 5.0)):
        for index in range(4):
            base = {"model_pair": "p", "dataset": dataset, "temperature": 0.4, "prompt_id": f"{dataset}{index}",
                    "iteration": 0, "reference_tokens": 2, "K": 1, "L": 6, "draws": 0, "output_position": 0,
                    "prompt_tokens": 10, "estimator": "exact"}
            rows.append({**base, "method": "sd", "tokens": tokens + index / 10})
            rows.append({**base, "method": "sbv", "tokens": tokens + 0.1 + index / 10})
            if dataset != "humaneval":
                rows.append({**base, "method": "hsd", "tokens": tokens + 0.05 + index / 10})
    frame = pd.DataFrame(rows)
    table = summary(frame, resamples=200)
    averaged = set(table.loc[table["dataset"] == AVERAGE, "method"])
    assert averaged == {"sd", "sbv"}
    assert set(table.loc[table["method"] == "hsd", "dataset"]) == {"lm1b", "gsm8k"}
    paired = differences(frame, comparators=("sd",), resamples=200)
    assert set(paired.loc[paired["dataset"] == AVERAGE, "method"]) == {"sbv"}
    assert set(paired.loc[paired["method"] == "hsd", "dataset"]) == {"lm1b", "gsm8k"}


def test_table1_marks_a_rule_replayed_on_fewer_prompts_than_its_column():
    """A rule registered while the grid was running (hsd_rrs) has 2 of humaneval's 4 prompts: its cell is a mean over
    other prompts than the rest of the column, so it reads "(n=2/4)" and a note says so (the committed T=0.1 grid's
    HSD read 5.24 beside BV's 5.91 on 4 of 12 prompts, as if it lost 0.7 tokens a call). Negative control: the same
    table with hsd_rrs on every prompt carries no mark and no note."""
    from spectr_repro.analysis.replay import summary
    from spectr_repro.analysis.replay_report import table1_markdown

    def frame(late_prompts: int) -> pd.DataFrame:
        rows = []
        for dataset, tokens in (("humaneval", 6.0), ("gsm8k", 5.0)):
            for index in range(4):
                base = {"model_pair": "p", "dataset": dataset, "temperature": 0.4, "prompt_id": f"{dataset}{index}",
                        "iteration": 0, "reference_tokens": 2, "L": 6, "draws": 0, "output_position": 0,
                        "prompt_tokens": 10, "estimator": "exact"}
                rows.append({**base, "method": "sd", "K": 1, "tokens": tokens + index / 10})
                rows.append({**base, "method": "sbv", "K": 3, "tokens": tokens + 0.1 + index / 10})
                if dataset == "gsm8k" or index >= 4 - late_prompts:
                    rows.append({**base, "method": "hsd_rrs", "K": 3, "tokens": tokens + index / 10})
        return pd.DataFrame(rows)

    late = table1_markdown(summary(frame(2), resamples=200), 3, 6)
    hsd_rrs_row = next(line for line in late.splitlines() if line.startswith("| HSD-RRS"))
    # humaneval and the average over datasets are marked, gsm8k (all 4 prompts) is not
    assert "(n=2/4)" in hsd_rrs_row and "(n=6/8)" in hsd_rrs_row and hsd_rrs_row.count("(n=") == 2
    assert "registered after the grid began" in late
    assert [line for line in late.splitlines() if "(n=" in line and line.startswith("|")
            and not line.startswith("| HSD-RRS")] == []
    complete = table1_markdown(summary(frame(4), resamples=200), 3, 6)
    assert "(n=" not in complete and "registered after" not in complete
