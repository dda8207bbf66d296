"""Every test here logs offline into its own folders: no network, nothing in the working directory, W&B's
environment variables of the machine ignored."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def offline_wandb(monkeypatch):
    for name in ("WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_DIR"):
        monkeypatch.delenv(name, raising=False)
