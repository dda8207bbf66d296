"""Test oracles of the selection core (``spectr_repro.verify.selection``) and of MP-BV.

- ``DepthRule``, ``selection_law``, ``choose_rho``, ``count_likelihood``: readable per-row views of the closed forms
  the verifier evaluates in batches, re-exported from ``spectr_repro.theory.selection_rows`` (the scripts use them
  too), which the tests compare with enumerations of c i.i.d. draws and the scan.
- ``GreedySelectionBlockVerification``: SBV's selection with rho = +inf at every count (a = 0 on the ranked tokens:
  always the highest-ratio survivor token), i.e. greedy multi-path BV written on SBV's selection core, an
  independent implementation of the registry's ``mpbv`` (``verify/mpbv.py``) that the tests check it against.
"""

from __future__ import annotations

import math

import torch

from spectr_repro.theory.selection_rows import DepthRule, choose_rho, count_likelihood, selection_law
from spectr_repro.verify.sbv import SelectionBlockVerification
from spectr_repro.verify.selection import Head

_F64 = torch.float64


class GreedySelectionBlockVerification(SelectionBlockVerification):
    """SBV with the greedy selection (rho = +inf at every count): greedy multi-path BV on SBV's selection core.

    On toy vocabularies (every token ranked, no ties of ratio) it is ``mpbv``'s rule; on a large vocabulary the
    tail (P + Q < tail_threshold) is accepted whenever drafted, and ties of ratio go to the token of higher id."""

    name = "sbv_greedy"

    def _choose_rho(self, ranked: Head, K: int) -> torch.Tensor:
        return torch.full((ranked.p.shape[0], K - 1), math.inf, dtype=_F64, device=ranked.p.device)


__all__ = ["DepthRule", "GreedySelectionBlockVerification", "choose_rho", "count_likelihood", "selection_law"]
