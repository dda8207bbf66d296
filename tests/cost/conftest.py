from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def calibration_file(tmp_path, monkeypatch):
    """Each test writes and reads its own calibration file, never this machine's."""
    from spectr_repro.cost.calibration import CALIBRATION_ENV_VAR

    path = tmp_path / "calibration.json"
    monkeypatch.setenv(CALIBRATION_ENV_VAR, str(path))
    return path
