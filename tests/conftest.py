"""Every test reads and writes its own calibration file: never this machine's (a `check` run here, or `make
reproduce`, writes one that would otherwise feed the report's speed-up predictions and the plan)."""

import pytest


@pytest.fixture(autouse=True)
def isolated_calibration(tmp_path_factory, monkeypatch):
    from spectr_repro.cost.calibration import CALIBRATION_ENV_VAR

    monkeypatch.setenv(CALIBRATION_ENV_VAR, str(tmp_path_factory.mktemp("calibration") / "calibration.json"))
