"""Names the tracking tests share (fixtures stay in conftest.py, which pytest loads; helpers are imported from here)."""

from __future__ import annotations

import pytest

WANDB_VARIABLES = ("WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_DIR")


def without_wandb_variables(patch: pytest.MonkeyPatch) -> None:
    """The machine's W&B variables (and the suite's WANDB_MODE=disabled) unset for what ``patch`` covers."""
    for name in WANDB_VARIABLES:
        patch.delenv(name, raising=False)
