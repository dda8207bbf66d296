"""`plan` / `sweep --plan`: cells, tokens, downloads against free disk and an estimated time, loading nothing."""

from __future__ import annotations

import pytest

from spectr_repro import models
from spectr_repro.__main__ import main as command_line
from spectr_repro.plan import main as main_plan
from spectr_repro.runner.cli import main_sweep
from tests.runner.runner_helpers import line_starting


def test_paper_main_plan_offline(offline, capsys):
    assert main_plan(["experiment=paper_main", f"output_dir={offline / 'results'}"]) == 0
    text = capsys.readouterr().out
    # checking cells (issue 34): sd, spectr, spectr_gbv, sbvf x 2 datasets x 2 pairs, and an AR cell per group
    assert "Cells: 20 (4 AR baselines), 0 finished" in text and "20 to compute" in text
    columns = [c.strip() for c in line_starting(text, "| deepseek_33b_1.3b").strip("|").split("|")]
    assert columns[:3] == ["deepseek_33b_1.3b", "cuda", "10"] and columns[8] == "10"  # cells, to compute
    assert columns[9:11] == ["200", "51,200"]  # 10 cells x 20 prompts, x 256 tokens at most
    assert "deepseek-ai/deepseek-coder-33b-instruct@main 66.6 GB" in text
    assert "to download: 82.8 GB" in text and "(enough)" in text
    assert "Estimated time:" in text and "A100-80GB (assumed, not measured)" in text
    assert not (offline / "results").exists(), "a plan writes nothing"


@pytest.mark.slow
def test_paper_preset_plan_offline(offline, capsys):
    """What `make reproduce PRESET=paper` prints first: the four experiments' checking cells, 83 GB once."""
    assert main_plan(["experiment=paper_main,ablation_K,ablation_L,ablation_T",
                      f"output_dir={offline / 'results'}"]) == 0
    text = capsys.readouterr().out
    assert "Cells: 40 (8 AR baselines)" in text and "to download: 82.8 GB" in text


def test_full_disk_shows_in_the_plan(offline, monkeypatch, capsys):
    monkeypatch.setattr(models.hub, "free_disk_bytes", lambda path: 40 * 10**9)
    assert main_plan(["experiment=paper_main", "dataset=gsm8k", f"output_dir={offline / 'results'}"]) == 0
    text = capsys.readouterr().out
    assert "to download: 82.8 GB" in text and "free in" in text and "40.0 GB (NOT ENOUGH" in text


def test_cpu_quick_plan_and_sweep_dash_dash_plan_agree(offline, capsys):
    argv = ["experiment=cpu_quick", f"output_dir={offline / 'results'}"]
    assert main_plan(argv) == 0
    plan = capsys.readouterr().out
    assert "Cells: 61 (7 AR baselines)" in plan and "qwen25coder_1.5b_0.5b" in plan
    assert "2-core CPU" in plan and "to download: 0.0 GB" in plan
    # cpu_quick's cells are for speed-ups: every prompt alone and timed (block efficiency comes from its replay)
    assert "decode their untimed prompts in batches" not in plan
    assert command_line(["sweep", *argv, "--plan"]) == 0
    assert capsys.readouterr().out == plan


def test_finished_cells_are_counted_and_calibrate_the_estimate(tmp_path, capsys):
    out = tmp_path / "results"
    argv = ["model_pair=tiny_random", "dataset=humaneval", "method=sd", "K=1", "L=2", "num_prompts=1",
            "max_new_tokens=3", "logger=disabled", f"output_dir={out}"]
    assert main_sweep(argv) == 0
    capsys.readouterr()
    assert main_plan(argv) == 0
    text = capsys.readouterr().out
    assert "2 finished" in text and "0 to compute" in text
    assert main_plan([*argv, "method=sd,spectr"]) == 0
    text = capsys.readouterr().out
    assert "2 finished" in text and "1 to compute" in text
    assert "calibration: measured: 1 finished AR cell(s) of this pair here" in text


def test_make_reproduce_prints_the_plan_first():
    from pathlib import Path

    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    recipe = makefile.split("\nreproduce:", 1)[1].split("\n\n", 1)[0]
    plan_at, sweep_at = recipe.find("spectr_repro plan"), recipe.find("spectr_repro sweep")
    assert 0 <= plan_at < sweep_at, recipe
