"""experiment=release_humaneval (the SpecTr-GBV release's own setting) and its offline Qwen version: the cells
compose to the release's setting and the plan works offline, loading nothing."""

from __future__ import annotations

import pytest

from spectr_repro.launch.config import Composer, expand, parse_arguments
from spectr_repro.plan import main as main_plan
from tests.runner.runner_helpers import line_starting  # the offline fixture comes from tests/runner/conftest.py

RELEASE_PAIRS = {"llama2_7b_68m", "llama2_7b_160m", "llama2_13b_68m", "llama2_13b_160m"}


@pytest.mark.parametrize("experiment, pairs", [("release_humaneval", RELEASE_PAIRS),
                                               ("release_humaneval_qwen", {"qwen25coder_1.5b_0.5b"})])
def test_cells_are_the_release_setting(experiment, pairs):
    with Composer() as composer:  # closed before the plan test composes its own configs
        cells = expand(composer, parse_arguments([f"experiment={experiment}", "logger=disabled"]), use_grid=True)
    assert {c.choices.model_pair for c in cells} == pairs
    assert {c.seed for c in cells} == {1001, 1002, 1003}
    assert {(c.L, float(c.temperature), c.max_new_tokens, c.num_prompts) for c in cells} == {(6, 0.7, 64, 31)}
    prompts = {(c.dataset.name, c.dataset.prompt_order, c.dataset.skip_prompts) for c in cells}
    assert prompts == {("humaneval", "file", 1)}
    by_method = {}
    for c in cells:
        by_method.setdefault(c.method.name, set()).add(c.K)
    assert by_method == {"spectr_gbv": {7}, "gbv": {1}, "sbv": {7}, "sbvf": {7}, "mpbv": {7}}
    carry = {bool(c.method.options.carry_over) for c in cells if c.method.name == "gbv"}
    assert carry == {False, True}  # the release's GBV (no carry-over) and our lossless one
    arithmetic = {c.method.options.get("arithmetic", "float64") for c in cells if c.method.name == "spectr_gbv"}
    assert arithmetic == {"float64", "release_bf16" if "qwen" in experiment else "release_fp16"}


def test_release_plan_offline(offline, capsys):  # noqa: F811 (the fixture)
    assert main_plan(["experiment=release_humaneval", f"output_dir={offline / 'results'}"]) == 0
    text = capsys.readouterr().out
    assert "Cells: 96 (12 AR baselines), 0 finished" in text
    columns = [c.strip() for c in line_starting(text, "| llama2_7b_68m").strip("|").split("|")]
    assert columns[2] == "24" and columns[9:11] == ["744", "47,616"]  # 24 cells x 31 prompts, x 64 tokens
    assert "meta-llama/Llama-2-13b-hf@main 26.0 GB" in text
    assert "JackFram/llama-68m@0359bbda21c69b1426e785b7f64ba782c3296f31" in text
    assert not (offline / "results").exists(), "a plan writes nothing"


def test_the_qwen_release_setting_has_its_replay():
    """`replay experiment=release_humaneval_qwen`: every rule at K = 1..7 and the release's L = 6 on the release's
    prompts (HumanEval 2..32 in file order), length, temperature and first seed; the sbv reference trajectory."""
    from spectr_repro.replay.driver import parse

    (group,) = parse(["experiment=release_humaneval_qwen"])
    cfg, settings = group.run, group.settings
    assert (settings.K_values, settings.L_values, settings.num_prompts) == ((1, 3, 5, 7), (6,), 31)
    assert "spectr_gbv" in settings.methods and "mpbv" in settings.methods and settings.reference == "sbv"
    assert (cfg.temperature, cfg.max_new_tokens, cfg.seed) == (0.7, 64, 1001)
    dataset = cfg.dataset_values
    assert (dataset["name"], dataset["prompt_order"], dataset["skip_prompts"]) == ("humaneval", "file", 1)
