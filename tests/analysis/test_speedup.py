"""Predicted speed-ups: the arithmetic, the intervals, the verdicts on curves, and the check against timed cells."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from spectr_repro.analysis.speedup import greater_verdict, predict_speedups, rise_then_fall
from spectr_repro.analysis.speedup_cells import agreement_summary, cell_agreement, time_breakdown
from spectr_repro.analysis.speedup_report import SpeedupData, speedup_verdict_rows
from spectr_repro.cost.calibration import ForwardCosts
from spectr_repro.cost.model import CallCosts, SectionOverheads


def linear_costs(fixed=0.1, per_token=0.002, spread=0.0, rules=None) -> CallCosts:
    """Forwards of fixed + per_token x rows x tokens seconds (both models alike), rules and overheads as given."""
    shapes = [(r, t, k) for r in (1, 3, 7) for t in (1, 2, 3, 5, 7, 9, 13, 25) for k in ("last", "all")]
    forward = ForwardCosts(tuple((r, t, k, fixed + per_token * r * t) for r, t, k in shapes),
                           spreads=tuple(spread for _ in shapes))
    return CallCosts(forward, forward, rules or {}, None, "synthetic")


def synthetic_blocks(values: dict[tuple[str, int, int], float], prompts=8, blocks_per_prompt=4, noise=0.3,
                     datasets=("humaneval", "gsm8k"), seed=0) -> pd.DataFrame:
    """Replay blocks whose tokens per call average ``values[cell]`` per cell, with prompt-level noise shared by
    every cell (the same blocks), as a replay's are."""
    rng = np.random.default_rng(seed)
    rows = []
    for dataset in datasets:
        for prompt in range(prompts):
            shift = noise * rng.standard_normal()
            for block in range(blocks_per_prompt):
                for (method, K, L), value in values.items():
                    rows.append(("p", dataset, 0.4, f"{dataset}-{prompt}", block, 3, method, K, L,
                                 max(1.0, value + shift), "exact", 0))
    return pd.DataFrame(rows, columns=["model_pair", "dataset", "temperature", "prompt_id", "iteration",
                                       "reference_tokens", "method", "K", "L", "tokens", "estimator", "draws"])


def test_a_prediction_is_tokens_per_call_times_ar_over_call_seconds():
    costs = linear_costs()
    blocks = synthetic_blocks({("sd", 1, 6): 3.0, ("spectr_gbv", 3, 6): 4.0}, noise=0.0)
    table = predict_speedups(blocks, costs).table
    row = table[(table["method"] == "sd") & (table["dataset"] == "humaneval")].iloc[0]
    call = costs.target.seconds(1, 7, "all") + costs.draft.seconds(1, 2) + 5 * costs.draft.seconds(1, 1)
    assert row["seconds_per_call"] == pytest.approx(call)
    assert row["speedup"] == pytest.approx(3.0 * costs.target.seconds(1, 1) / call)
    assert row["ci_low"] == pytest.approx(row["speedup"]) and row["ci_high"] == pytest.approx(row["speedup"])
    release = table[(table["method"] == "spectr_gbv") & (table["dataset"] == "average")].iloc[0]
    assert release["tokens_per_call"] == pytest.approx(4.0) and release["first_iteration"] == False  # noqa: E712
    gbv_like = predict_speedups(synthetic_blocks({("gbv", 1, 6): 3.0}), costs).table
    assert gbv_like["first_iteration"].all()  # gbv carries state: its replay value is an upper bound


def test_the_interval_carries_prompt_resampling_and_cost_spread():
    blocks = synthetic_blocks({("sd", 1, 6): 3.0})
    exact_costs = predict_speedups(blocks, linear_costs(spread=0.0)).table
    noisy_costs = predict_speedups(blocks, linear_costs(spread=0.1)).table
    width = lambda t: float((t["ci_high"] - t["ci_low"]).iloc[0])  # noqa: E731
    assert 0 < width(exact_costs) < width(noisy_costs)
    row = exact_costs.iloc[0]
    assert row["ci_low"] < row["speedup"] < row["ci_high"]


def test_paired_differences_see_what_the_rules_do_on_the_same_blocks():
    """Two cells on the same blocks whose tokens differ by 0.1 per call: the paired difference excludes 0 though
    each cell's own interval (prompt noise 0.5) overlaps the other's."""
    blocks = synthetic_blocks({("spectr", 3, 6): 3.5, ("spectr_gbv", 3, 6): 3.6}, noise=0.5)
    prediction = predict_speedups(blocks, linear_costs())
    estimate, low, high = prediction.difference(("spectr_gbv", 3, 6), ("spectr", 3, 6))
    assert low > 0 and estimate > 0
    table = prediction.table[prediction.table["dataset"] == "average"].set_index("method")
    assert table.loc["spectr", "ci_high"] > table.loc["spectr_gbv", "ci_low"]  # unpaired, they overlap


def _curve(means, noise, resamples=2000, seed=1):
    rng = np.random.default_rng(seed)
    means = np.array(means, dtype=float)
    shared = rng.normal(0, noise, size=(resamples, 1))  # a replicate moves every point alike, as paired ones do
    return means, means + shared + rng.normal(0, noise / 4, size=(resamples, len(means)))


def test_rise_then_fall_holds_for_a_peaked_curve_and_names_its_peak():
    found = rise_then_fall([2, 4, 6, 8, 12], *_curve([1.2, 1.5, 1.7, 1.6, 1.3], noise=0.05))
    assert found.verdict == "holds" and found.peak == 6
    assert found.peak_low <= 6 <= found.peak_high


def test_a_monotone_curve_does_not_rise_then_fall():
    found = rise_then_fall([2, 4, 6, 8], *_curve([1.1, 1.3, 1.5, 1.7], noise=0.05))
    assert found.verdict == "does not hold" and "rises throughout" in found.note
    found = rise_then_fall([2, 4, 6, 8], *_curve([1.7, 1.5, 1.3, 1.1], noise=0.05))
    assert found.verdict == "does not hold" and "falls throughout" in found.note


def test_a_flat_curve_within_noise_is_undecided():
    found = rise_then_fall([2, 4, 6, 8], *_curve([1.50, 1.52, 1.51, 1.50], noise=0.3))
    assert found.verdict == "undecided"
    # the same shape with noise small enough decides it (power: the test can say "holds")
    assert rise_then_fall([2, 4, 6, 8], *_curve([1.50, 1.60, 1.55, 1.45], noise=0.01)).verdict == "holds"


def test_a_difference_against_an_upper_bound_decides_one_way_only():
    assert greater_verdict((0.2, 0.1, 0.3), upper_bound=True)[0] == "holds"
    assert greater_verdict((-0.2, -0.3, -0.1), upper_bound=True)[0] == "undecided"
    assert greater_verdict((-0.2, -0.3, -0.1))[0] == "does not hold"


def _timed_cells(costs: CallCosts, calls_per_prompt: float, cells: list[tuple[str, int, int]], prompts=4,
                 noise=0.02, seed=0):
    """Cells and records whose wall times are the cost model's (x small noise): what a machine that the model
    describes would measure."""
    rng = np.random.default_rng(seed)
    cell_rows, records = [], []
    for method, K, L in cells:
        cell_id = f"{method}_K{K}_L{L}"
        split = dict.fromkeys(("prefill", "draft", "target", "verify", "total"), 0.0)
        for _ in range(prompts):
            P, N, calls = 100, 32, calls_per_prompt
            sections = costs.call_sections(method, K, L, P + N // 2)
            wall = (costs.prefill_seconds(P) + calls * sum(sections.values())) * (1 + noise * rng.standard_normal())
            ar = costs.prefill_seconds(P, with_draft=False) + (N - 1) * costs.ar_token_seconds(P + N // 2)
            records.append({"cell_id": cell_id, "method": method, "prompt_tokens": P, "new_tokens": N,
                            "target_calls": calls, "wall_time_s": wall, "ar_wall_time_s": ar})
            split["prefill"] += costs.prefill_seconds(P)
            for section in ("draft", "target", "verify"):
                split[section] += calls * sections[section]
            split["total"] += wall
        cell_rows.append({"cell_id": cell_id, "method": method, "K": K, "L": L, "temperature": 0.4,
                          "dataset": "humaneval", "model_pair": "p", "speedup_comparable": True,
                          **{f"time_{s}_s": v for s, v in split.items()}})
    return pd.DataFrame(cell_rows), pd.DataFrame(records)


def test_the_model_agrees_with_cells_it_describes_and_not_with_costs_of_another_K():
    """Cells timed on a machine the model describes agree within 5 % (their wall times carry 2 % noise); the same
    cells priced with the K = 7 rule costs in place of K = 3's (costs from the wrong shape, the negative control)
    miss by far more."""
    rules = {("spectr_gbv", 3, 6): 0.05, ("spectr_gbv", 7, 6): 0.5, ("sd", 1, 6): 0.01}
    costs = CallCosts(linear_costs().target, linear_costs().draft, rules,
                      SectionOverheads({"draft": (0.01, 0.001), "other": (0.005, 0.0)}, {"target": 0.002}), "x")
    cells, records = _timed_cells(costs, 8, [("spectr_gbv", 3, 6), ("sd", 1, 6)])
    agreement = cell_agreement(cells, records, costs)
    assert agreement_summary(agreement, "error_own_calls")["worst"] < 0.05
    # the sweep names the release by its options; a variant with more (the bf16 arithmetic) is not what the
    # replay runs and stays out
    variants = cells.assign(method=["spectr_gbv[carry_over=False]", "sd"])
    bf16 = variants.iloc[[0]].assign(method="spectr_gbv[arithmetic=release_bf16,carry_over=False]", cell_id="bf16")
    named = cell_agreement(pd.concat([variants, bf16]), pd.concat(
        [records, records[records["cell_id"] == "spectr_gbv_K3_L6"].assign(cell_id="bf16")]), costs)
    assert sorted(named["cell_id"]) == ["sd_K1_L6", "spectr_gbv_K3_L6"]
    wrong = CallCosts(costs.target, costs.draft, {**rules, ("spectr_gbv", 3, 6): rules[("spectr_gbv", 7, 6)]},
                      costs.overheads, "wrong K")
    assert agreement_summary(cell_agreement(cells, records, wrong), "error_own_calls")["worst"] > 0.2


def test_the_breakdown_puts_measured_and_predicted_side_by_side():
    costs = CallCosts(linear_costs().target, linear_costs().draft, {("spectr_gbv", 3, 6): 0.05}, None, "x")
    cells, records = _timed_cells(costs, 8, [("spectr_gbv", 3, 6)], noise=0.0)
    breakdown = time_breakdown(cells, records, costs, 3, 6)
    release = breakdown[breakdown["method"] == "spectr_gbv"].set_index("source")
    measured, predicted = release.loc["measured"], release.loc["predicted"]
    for section in ("prefill", "draft", "target", "verify"):
        assert measured[section] == pytest.approx(predicted[section], rel=1e-6)
    assert measured["verify"] == pytest.approx(1e3 * 8 * 0.05 / 32)  # 8 calls x 50 ms over 32 tokens
    assert breakdown["method"].iloc[0] == "ar"


def test_verdict_rows_judge_the_release_on_predicted_speed_ups():
    values = {("spectr_gbv", 3, L): v for L, v in zip((2, 4, 6, 8, 12), (2.0, 3.2, 4.4, 5.0, 5.4))}
    values.update({("spectr", 3, 6): 3.6, ("sd", 1, 6): 3.0, ("gbv", 1, 6): 3.1,
                   **{("spectr_gbv", K, 6): v for K, v in ((1, 3.2), (7, 4.8))}})
    prediction = predict_speedups(synthetic_blocks(values, noise=0.1), linear_costs(fixed=0.2, per_token=0.01))
    rows = speedup_verdict_rows(SpeedupData(linear_costs(), prediction, pd.DataFrame(), pd.DataFrame(), 3, 6))
    by_claim = {row["claim"]: row for row in rows}
    assert by_claim["speed-up SpecTr-GBV > SpecTr, GBV, SD"]["verdict"] == "holds"
    curve = by_claim["speed-up rises then falls with L"]
    assert curve["verdict"] in ("holds", "does not hold", "undecided") and "peak L=" in curve["measured"]
    assert "fastest K here" in by_claim["K = 3 (the paper's main setting) is the fastest K"]["measured"]


def test_the_report_decides_speed_up_from_a_replay_and_a_calibration_beside_it(tmp_path, monkeypatch):
    """tiny_random: a replay, a timed cell and a calibration in `<results>/../check/check.json` (as `make
    reproduce` leaves them): the verdicts carry the speed-up rows and the speed-up section has its figures and
    agreement table; without the calibration the section is absent and the verdicts say why."""
    import json
    import shutil

    from spectr_repro.analysis.report import build_report
    from spectr_repro.cost.calibration import Calibration
    from spectr_repro.replay.driver import main as replay_main
    from spectr_repro.runner.cli import main_sweep

    monkeypatch.setenv("SPECTR_REPRO_RUNNERS", str(tmp_path / "runners"))
    common = ["model_pair=tiny_random", "num_prompts=2", "max_new_tokens=10", f"output_dir={tmp_path}",
              "logger=disabled"]
    assert replay_main([*common, "method=sd,gbv,spectr,spectr_gbv", "K=1,3", "L=2,4,6", "replay.draws=2"]) == 0
    assert main_sweep([*common, "method=spectr_gbv", "K=3", "L=4"]) == 0
    report = build_report([tmp_path / "default"]).read_text()
    assert "## Speed-up, predicted" not in report and "no calibration of this pair" in report

    costs = linear_costs(spread=0.05)
    calibration = Calibration("cpu", "tiny_random", "float32", "test CPU", "2026-12-03", False, costs.target,
                              costs.draft, {"rule_seconds": {"spectr_gbv/3/4": 0.01}})
    (tmp_path / "check").mkdir()
    (tmp_path / "check" / "check.json").write_text(json.dumps({"calibration": calibration.to_json()}))
    report = build_report([tmp_path / "default"]).read_text()
    verdicts = report.split("## Verdicts")[1].split("\n## ")[0]
    assert "speed-up rises then falls with L" in verdicts and "speed-up SpecTr-GBV > SpecTr, GBV, SD" in verdicts
    section = report.split("## Speed-up, predicted")[1].split("\n## ")[0]
    assert "Fastest lossless configuration predicted here" in section and "spectr_gbv K=3 L=4" in section
    assert (tmp_path / "default" / "figures" / "speedup_vs_L.png").is_file()
    predictions = pd.read_csv(tmp_path / "default" / "tables" / "speedup_predictions.csv")
    assert (tmp_path / "default" / "replay" / "replay_speedups.csv").read_text() == (
        tmp_path / "default" / "tables" / "speedup_predictions.csv").read_text()
    assert {"sd", "gbv", "spectr", "spectr_gbv"} <= set(predictions["method"])
    assert (predictions["ci_low"] <= predictions["speedup"]).all()
    # a replay without timed cells beside it: predictions and verdicts, no agreement (not a crash)
    shutil.copytree(tmp_path / "default" / "replay", tmp_path / "alone" / "replay")
    alone = build_report([tmp_path / "alone"]).read_text()
    assert "No timed cell of this pair to check the model against." in alone
