"""Every test reads and writes its own calibration file: never this machine's (a `check` run here, or `make
reproduce`, writes one that would otherwise feed the report's speed-up predictions and the plan)."""

import pytest


@pytest.fixture(autouse=True)
def no_wandb_unless_asked(monkeypatch):
    """Commands log to W&B offline by default: a test that does not test the logging logs nothing (W&B's own
    switch); the tests of the logging unset it (tests/tracking, tests/runner/test_tracking.py)."""
    monkeypatch.setenv("WANDB_MODE", "disabled")


@pytest.fixture(autouse=True)
def isolated_calibration(tmp_path_factory, monkeypatch):
    from spectr_repro.cost.calibration import CALIBRATION_ENV_VAR

    monkeypatch.setenv(CALIBRATION_ENV_VAR, str(tmp_path_factory.mktemp("calibration") / "calibration.json"))


def pytest_configure(config):
    """Under pytest-xdist (`make test` runs one worker per core), each worker computes on one thread: two workers
    each asking torch for every core would oversubscribe the machine and make both slower."""
    import os

    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)
