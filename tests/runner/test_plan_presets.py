"""PRESET=paper plans a day at most (issue 34): the replay, the calibration and the checking cells, apart.

The paper preset's block efficiencies come from paper_main's shared-block replay, its speed-ups are predicted
from that replay and the calibration (`check` with the real weights), and its timed cells only check the
prediction. Brute force (100 prompts x 256 tokens for every (method, K, L, T, dataset): 445 cells) priced
6.7 days at the same A100 model: the negative control below rebuilds its main table (80 cells) and must exceed
the budget.
"""

from __future__ import annotations

import re
import shutil

import pytest
from omegaconf import OmegaConf

from spectr_repro.conf import CONF_ENV_VAR, conf_dir
from spectr_repro.plan import main as main_plan
from spectr_repro.plan import plan_parts
from spectr_repro.plan.calibration import CHECK_ROUNDS, LOAD_GBS, plan_calibration

PAPER = "experiment=paper_main,ablation_K,ablation_L,ablation_T"  # the Makefile's PRESET=paper
BUDGET_S = 24 * 3600  # issue 34: PRESET=paper plans at most 24 GPU-hours in all, at the plan's A100 model


def _numbers_in_hours(line: str) -> list[float]:
    return [float(v) for v in re.findall(r"([\d.]+) h\b", line)]


def test_paper_preset_plans_replay_calibration_and_checking_cells_within_a_day(offline, capsys):
    argv = [PAPER, f"output_dir={offline / 'results'}"]
    parts = plan_parts(argv)
    assert 0 < parts.seconds <= BUDGET_S, parts.seconds / 3600
    assert parts.replay_seconds > 0 and parts.calibration_seconds > 0 and parts.cells_seconds > 0
    # the timed cells check the prediction; they are not where the hours go
    assert parts.cells_seconds < parts.replay_seconds
    cells = sum(p.cells for p in parts.cells.pairs)
    assert cells == 40 and sum(p.ar_cells for p in parts.cells.pairs) == 8, cells
    (calibration,) = parts.calibrations  # paper_main's replay, the 33B pair: its predictions need one
    assert calibration.pair == "deepseek_33b_1.3b"
    assert set(calibration.Ks) >= {1, 3, 5, 7} and set(calibration.Ls) >= {4, 12, 24}  # the replay's grid

    assert main_plan(argv) == 0
    text = capsys.readouterr().out
    replay = [line for line in text.splitlines() if line.startswith("Replay (shared blocks")]
    calibrations = [line for line in text.splitlines() if line.startswith("Calibration (")]
    totals = [line for line in text.splitlines() if line.startswith("Total:")]
    assert len(replay) == 1 and len(calibrations) == 1 and len(totals) == 1, text
    assert "`python -m spectr_repro check experiment=paper_main" in calibrations[0]
    assert "real weights" in calibrations[0] and "loading" in calibrations[0]
    assert "Estimated time:" in text  # the timed cells' own part
    total, replay_h, calibration_h, cells_h = _numbers_in_hours(totals[0])[:4]
    assert totals[0].startswith(f"Total: {total:.2f} h = replay {replay_h:.2f} h + calibration {calibration_h:.2f} h "
                                f"+ timed cells {cells_h:.2f} h")
    assert total == pytest.approx(replay_h + calibration_h + cells_h, abs=0.015)
    assert total == pytest.approx(parts.seconds / 3600, abs=0.005) and total <= 24
    assert not (offline / "results").exists(), "a plan writes nothing"


# paper_main before issue 34 (2026-12-03): Table 1 timed, every method on both pairs and the five datasets, 100
# prompts x 256 tokens a cell (80 cells); its replay: block as today's
BRUTE_FORCE_MAIN = """\
# @package _global_
defaults:
  - override /hardware: cuda
  - override /model_pair: deepseek_33b_1.3b
  - override /logger: wandb_offline
experiment: brute_force_main
K: 3
L: 12
temperature: 0.4
num_prompts: 100
max_new_tokens: 256
grid:
  - method: [spectr, spectr_gbv, rbv, sbv]
    K: [3]
    dataset: [humaneval, gsm8k, mgsm, lm1b, alpaca]
    model_pair: [deepseek_33b_1.3b, deepseek_6.7b_1.3b]
  - method: [sd, bv, gbv]
    K: [1]
    dataset: [humaneval, gsm8k, mgsm, lm1b, alpaca]
    model_pair: [deepseek_33b_1.3b, deepseek_6.7b_1.3b]
"""


def test_negative_control_the_brute_force_main_table_exceeds_the_budget(offline, tmp_path, monkeypatch):
    """The check above has power: the same plan prices the old paper_main (Table 1 timed at 100 prompts x 256
    tokens a cell, 80 cells; the K, L and T ablations brought the old preset to 445) past the day."""
    conf = tmp_path / "conf"
    shutil.copytree(conf_dir(), conf, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    replay = OmegaConf.load(conf / "experiment" / "paper_main.yaml").replay
    (conf / "experiment" / "brute_force_main.yaml").write_text(
        BRUTE_FORCE_MAIN + OmegaConf.to_yaml(OmegaConf.create({"replay": replay})))
    monkeypatch.setenv(CONF_ENV_VAR, str(conf))
    # its replay narrowed to one group (fewer compositions: the cells alone exceed the day)
    parts = plan_parts(["experiment=brute_force_main", "replay.datasets=[humaneval]", "replay.temperatures=[0.4]",
                        f"output_dir={offline / 'results'}"])
    assert sum(p.cells for p in parts.cells.pairs) == 80 and sum(p.ar_cells for p in parts.cells.pairs) == 10
    assert parts.replay_seconds > 0 and parts.calibration_seconds > 0
    assert parts.cells_seconds > BUDGET_S  # the timed cells alone: 25 h at the A100 model (2026-12-03)
    assert parts.seconds > BUDGET_S


def test_the_calibration_is_priced_from_its_shapes_rounds_and_loading(offline):
    """Twice the rounds or a bigger grid cost more; the loading is the checkpoints' bytes at LOAD_GBS."""
    from spectr_repro.replay.driver import parse

    argv = ["experiment=paper_main", "dataset=humaneval", "temperature=0.4", f"output_dir={offline / 'results'}"]
    (group,) = parse(argv)
    cfg, settings = group.run, group.settings
    wide = plan_calibration("check", [cfg], settings.K_values, settings.L_values)
    narrow = plan_calibration("check", [cfg], [3], [12])
    assert wide.target_shapes > narrow.target_shapes and wide.forward_seconds > narrow.forward_seconds > 0
    assert wide.load_seconds == pytest.approx((66.6 + 2.7) * 1e9 / (LOAD_GBS * 1e9), rel=0.01)
    # the forwards: each shape CHECK_ROUNDS times plus the context and two untimed forwards; so more than
    # CHECK_ROUNDS x the largest target call (K=7 x L+1=25 tokens) alone
    from spectr_repro.cost import forward_seconds
    from spectr_repro.cost.model import CellSpec, bytes_per_parameter, model_parameters
    from spectr_repro.launch.pairs import pair_config_of

    pair = pair_config_of(cfg)
    estimate = cfg.hardware.estimate
    width = bytes_per_parameter(CellSpec.of(cfg), pair)
    largest = forward_seconds(estimate, model_parameters(pair, "target"), width, 7 * 25)
    assert CHECK_ROUNDS * largest < wide.forward_seconds < 200 * largest
