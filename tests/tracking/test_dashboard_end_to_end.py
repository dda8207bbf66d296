"""The real commands on the tiny random pair (a timed cell, replay, bias, check, theory, audit, report; bench's
logging call on a small bench.json, its real run loading SmolLM2) each leave an offline W&B run, and the dashboard
of their results folder plots only metrics those runs hold. Slow: ~40 s of commands on a shared CPU."""

from __future__ import annotations

import json

import pytest

from spectr_repro.tracking import dashboard
from spectr_repro.tracking.offline import read_runs
from tests.tracking.results import EXPERIMENT, make_results
from tests.tracking.tracking_helpers import without_wandb_variables

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from spectr_repro.cost.calibration import CALIBRATION_ENV_VAR

    root = tmp_path_factory.mktemp("reproduce")
    with pytest.MonkeyPatch.context() as patch:
        without_wandb_variables(patch)
        patch.setenv("SPECTR_REPRO_RUNNERS", str(root / "runners"))
        patch.setenv(CALIBRATION_ENV_VAR, str(root / "calibration.json"))
        patch.chdir(root)
        folder = make_results(root / "results")
        yield folder, read_runs(dashboard.run_folders(folder))


def test_every_step_leaves_an_offline_run(results):
    folder, runs = results
    assert sorted(run.job_type for run in runs) == sorted(
        ["ar", "sbv", "replay", "bias", "report", "check", "theory", "audit", "bench"])
    assert {run.group for run in runs if run.job_type in ("ar", "sbv", "replay", "bias", "report")} == {EXPERIMENT}


def test_the_dashboard_of_the_real_runs_plots_only_what_they_hold(results, capsys):
    folder, runs = results
    built = dashboard.sections(folder, runs)
    assert [s.name for s in built] == ["Verdicts", "Table 1 (replay)", "Tokens per call against K and L",
                                       "Speed-up against L: predicted and measured", "Bias per rule",
                                       "Machine: check and bench", "Figures"]
    assert dashboard.unplotted(built, runs) == []
    assert dashboard.main([str(folder)]) == 0
    assert "warning" not in capsys.readouterr().err
    definition = json.loads((folder / dashboard.DEFINITION_FILE).read_text())
    assert sum(len(s["panels"]) for s in definition["sections"]) == sum(len(s.panels) for s in built)
