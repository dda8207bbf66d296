"""Every test here logs offline into its own folders: no network, nothing in the working directory, W&B's
environment variables of the machine ignored."""

from __future__ import annotations

import pytest

from tests.tracking.tracking_helpers import without_wandb_variables


@pytest.fixture(autouse=True)
def offline_wandb(monkeypatch):
    without_wandb_variables(monkeypatch)
