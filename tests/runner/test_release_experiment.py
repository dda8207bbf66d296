"""experiment=release_humaneval (the SpecTr-GBV release's own setting) and its offline Qwen version: the cells
compose to the release's setting and the plan works offline, loading nothing."""

from __future__ import annotations

import pytest

from spectr_repro.runner.cli import main_plan
from spectr_repro.runner.config import Composer, expand, parse_arguments
from tests.runner.test_plan import _line  # the offline fixture comes from tests/runner/conftest.py

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
    columns = [c.strip() for c in _line(text, "| llama2_7b_68m").strip("|").split("|")]
    assert columns[2] == "24" and columns[9:11] == ["744", "47,616"]  # 24 cells x 31 prompts, x 64 tokens
    assert "meta-llama/Llama-2-13b-hf@main 26.0 GB" in text
    assert "JackFram/llama-68m@0359bbda21c69b1426e785b7f64ba782c3296f31" in text
    assert not (offline / "results").exists(), "a plan writes nothing"
