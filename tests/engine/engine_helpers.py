"""Names the engine tests share (fixtures stay in conftest.py, which pytest loads; helpers are imported from here)."""

from __future__ import annotations

from spectr_repro.verify import VERIFIERS

SPECULATIVE = tuple(VERIFIERS)  # every rule of the registry
ALL_METHODS = ("ar", *SPECULATIVE)


def draft_count(method: str, K: int = 3) -> int:
    """K for a method: single-draft rules take one draft."""
    return 1 if method == "ar" or VERIFIERS[method].single_draft else K
