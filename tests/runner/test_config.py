"""The Hydra configs compose for every group option; sweeps expand to the right grid of cells."""

from __future__ import annotations

import pytest

from spectr_repro.data import DATASETS
from spectr_repro.launch.config import (
    GROUPS,
    Composer,
    UsageError,
    conf_dir,
    expand,
    grid_axes,
    group_options,
    parse_arguments,
)
from spectr_repro.runner.execute import plan_cells
from spectr_repro.runner.store import cell_id
from spectr_repro.settings import run_config
from spectr_repro.verify import VERIFIERS

BASE = ["model_pair=tiny_random", "logger=disabled"]


@pytest.fixture(scope="module")
def composer():
    with Composer() as session:
        yield session


def test_every_group_option_composes(composer):
    expected = {
        "method": {"ar", *VERIFIERS},
        "hardware": {"cpu", "cuda"},
        "logger": {"wandb_offline", "wandb_online", "disabled"},
        "experiment": {"paper_main", "ablation_K", "ablation_L", "ablation_T", "cpu_quick"},
    }
    for group, options in expected.items():
        assert options <= set(group_options(group)), group
    for group in GROUPS:
        options = group_options(group)
        assert options, f"conf/{group}/ is empty"
        for option in options:
            cfg = composer.compose([f"{group}={option}"])
            assert cfg.choices[group] == option
            for key in ("K", "L", "temperature", "num_prompts", "max_new_tokens", "seed", "output_dir",
                        "experiment", "force"):
                assert key in cfg, (group, option, key)
            assert {"device", "dtype"} <= set(cfg.hardware)
            if group == "method":
                assert cfg.method.name == option
            if group == "experiment":
                # a sweep's experiment names its grid; a replay-only one (replay_qwen) its replay's datasets
                assert cfg.experiment == option and (cfg.grid or cfg.replay.datasets), "experiments name their work"



def test_the_dataset_configs_are_the_dataset_registry():
    # A dataset is its spec, its registry line and its config (docs/development.md, "Add a dataset"): a config
    # without a registered spec, or a spec without a config, is caught here. A long-input dataset has one config per
    # bucket of input length besides its own (longcode_1k ... longcode_32k): each names a registered spec.
    from omegaconf import OmegaConf

    options = set(group_options("dataset"))
    assert set(DATASETS) <= options
    for option in options - set(DATASETS):
        assert OmegaConf.load(conf_dir() / "dataset" / f"{option}.yaml").name in DATASETS, option


def test_every_experiment_names_only_existing_datasets_methods_and_pairs(composer):
    # Every yaml in conf/experiment/ is checked (docs/development.md, "Add an experiment"): a grid value is a plain
    # string until its cell is composed, so a misspelt dataset would otherwise surface mid-sweep.
    known = {group: set(group_options(group)) for group in ("dataset", "method", "model_pair")}
    for experiment in group_options("experiment"):
        cfg = composer.compose([f"experiment={experiment}"])
        named = {(key, value) for subgrid in grid_axes(cfg.grid, frozenset()) for key, values in subgrid
                 for value in values}
        named |= {("dataset", name) for name in cfg.replay.datasets or ()}
        for group, options in known.items():
            unknown = {value for key, value in named if key == group} - options
            assert not unknown, f"experiment {experiment} names unknown {group} option(s) {sorted(unknown)}"

def test_slurm_launcher_composes(composer):
    cfg = composer.compose(["hydra/launcher=slurm", "experiment=paper_main"], with_hydra=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    assert launcher.gpus_per_node == 1 and launcher.timeout_min > 0


def test_plus_experiment_is_accepted(composer):
    cfg = expand(composer, parse_arguments(["+experiment=cpu_quick"]), use_grid=False)[0]
    assert cfg.choices.experiment == "cpu_quick" and cfg.experiment == "cpu_quick"


def test_comma_lists_expand_to_the_product(composer):
    args = parse_arguments([*BASE, "method=sd,bv,spectr_gbv", "K=1,3", "temperature=0.1,0.7"])
    cells = expand(composer, args, use_grid=True)
    got = {(c.method.name, c.K, c.temperature) for c in cells}
    assert got == {(m, k, t) for m in ("sd", "bv", "spectr_gbv") for k in (1, 3) for t in (0.1, 0.7)}
    assert all(c.choices.model_pair == "tiny_random" for c in cells)


def test_experiment_grid_and_user_axes(composer):
    # (dataset fixed on the command line to keep the test fast: each group choice is one composition)
    grid_cells = expand(composer, parse_arguments(["experiment=ablation_L", "dataset=lm1b"]), use_grid=True)
    # ablation_L's checking cells (issue 34): the multi-draft rules at K=3 and sd in its own sub-grid at K=1
    assert {(c.method.name, c.K, c.L) for c in grid_cells} == {
        *((m, 3, L) for m in ("spectr", "spectr_gbv", "sbvf") for L in (4, 24)), ("sd", 1, 4), ("sd", 1, 24)}
    assert len(grid_cells) == 4 * 2
    # An axis on the command line replaces that axis in every sub-grid.
    assert {c.choices.dataset for c in grid_cells} == {"lm1b"}
    narrowed = expand(composer, parse_arguments(["experiment=ablation_L", "K=3", "dataset=gsm8k",
                                                 "method=spectr_gbv,sd"]), True)
    assert {(c.method.name, c.K) for c in narrowed} == {("spectr_gbv", 3), ("sd", 3)}
    assert {c.choices.dataset for c in narrowed} == {"gsm8k"}
    # `run` ignores the grid: one cell.
    assert len(expand(composer, parse_arguments(["experiment=ablation_L"]), use_grid=False)) == 1


def test_plan_adds_one_ar_cell_per_group_and_skips_single_draft_at_k_above_1(composer):
    args = parse_arguments([*BASE, "method=sd,spectr_gbv", "K=1,3", "dataset=humaneval,gsm8k"])
    plans = plan_cells([run_config(cfg) for cfg in expand(composer, args, use_grid=True)])
    ar = [p for p in plans if p.method == "ar"]
    assert len(ar) == 2 and all(p.run.K == 1 and p.run.L == 1 for p in ar)
    assert all(p.run.choices["method"] == "ar" and p.run.values["method"]["name"] == "ar" for p in ar)
    skipped = [p for p in plans if p.skip_note]
    assert {(p.method, p.run.K) for p in skipped} == {("sd", 3)}
    assert "single draft" in skipped[0].skip_note
    for plan in plans:
        if plan.method != "ar" and not plan.skip_note:
            (group_ar,) = [p for p in ar if p.cell_id == plan.ar_cell_id]
            assert group_ar.run.dataset == plan.run.dataset
            assert plans.index(group_ar) < plans.index(plan), "the AR baseline runs first"


def test_cell_ids_are_distinct_for_method_options(composer):
    default = run_config(composer.compose([*BASE, "method=gbv", "K=1"]))
    changed = run_config(composer.compose([*BASE, "method=gbv", "K=1", "method.options.carry_over=false"]))
    assert cell_id(default) != cell_id(changed)
    assert cell_id(default) == cell_id(run_config(composer.compose([*BASE, "method=gbv", "K=1"])))
    assert cell_id(default).startswith("gbv-tiny_random-humaneval-K1-")


@pytest.mark.parametrize("argv, message", [
    (["method=spectr_gvb"], "Did you mean spectr_gbv"),
    (["dataset=humaneva"], "Did you mean humaneval"),
    (["model_pair=tiny_rnd"], "Did you mean tiny_random"),
    (["experiment=foo,bar"], "one experiment at a time"),
])
def test_unknown_options_are_usage_errors(argv, message):
    with pytest.raises(UsageError, match=message):
        parse_arguments(argv)
