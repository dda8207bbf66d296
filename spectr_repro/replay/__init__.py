"""Shared-block replay: block efficiency of every rule, K and L measured on the same draft blocks.

    from spectr_repro.replay import block_estimates
    block_estimates(draft_tokens, draft_probs, target_probs, ["sd", "sbv"], [1, 3], [4, 8], draws=8)

``python -m spectr_repro replay ...`` runs it on real models (``spectr_repro.replay.driver``).
"""

from spectr_repro.replay.core import ESTIMATORS, MODES, BlockEstimate, block_estimates, check_grid, grid

__all__ = ["ESTIMATORS", "MODES", "BlockEstimate", "block_estimates", "check_grid", "grid"]
