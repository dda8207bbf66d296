"""Verification rules: pure functions of probability tensors (no models, configs or I/O).

    from spectr_repro.verify import get_verifier, VERIFIERS
    verify = get_verifier("rbv")
    res = verify(draft_tokens, draft_probs, target_probs, generator=g, state=None)
    outcomes = verify.law(draft_tokens, draft_probs, target_probs)   # exact law, small inputs

Shapes and conventions: see ``spectr_repro.verify.base``. One module per rule.
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass

from spectr_repro.verify.base import Outcome, Verifier, VerifyResult, validate_inputs


@dataclass(frozen=True)
class VerifierSpec:
    name: str
    target: str  # "module:Class"
    lossless: bool  # guaranteed by this harness with default options (exact tests prove it)
    claimed_lossless: bool  # what the rule's authors claim
    single_draft: bool  # K must be 1
    description: str


VERIFIERS: dict[str, VerifierSpec] = {
    spec.name: spec
    for spec in [
        VerifierSpec("sd", "spectr_repro.verify.sd:SpeculativeDecoding", True, True, True,
                     "token-level rejection sampling (Leviathan et al. 2023; Chen et al. 2023)"),
        VerifierSpec("spectr", "spectr_repro.verify.spectr:SpecTr", True, True, False,
                     "SpecTr K-SEQ optimal-transport selection per depth (Sun et al. 2023)"),
        VerifierSpec("bv", "spectr_repro.verify.bv:BlockVerification", True, True, True,
                     "block verification (Sun et al., ICLR 2025)"),
        VerifierSpec("gbv", "spectr_repro.verify.gbv:GreedyBlockVerification", True, True, True,
                     "greedy block verification (SpecTr-GBV at K=1), lossless with its carry-over target"),
        VerifierSpec("spectr_gbv", "spectr_repro.verify.spectr_gbv:SpecTrGBV", False, True, False,
                     "the authors' released SpecTr-GBV rule, run as published (not lossless for K >= 2)"),
        VerifierSpec("rbv", "spectr_repro.verify.rbv:RecursiveBlockVerification", True, True, False,
                     "recursive block verification over K drafts (ours, lossless)"),
        VerifierSpec("sbv", "spectr_repro.verify.sbv:SelectionBlockVerification", True, True, False,
                     "selection block verification: BV on a randomly selected path (ours, lossless)"),
    ]
}


def get_verifier(name: str, **options) -> Verifier:
    """Instantiate the rule ``name`` (options are rule-specific, e.g. ``carry_over=False``)."""
    if name not in VERIFIERS:
        close = difflib.get_close_matches(name, VERIFIERS, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown verification rule {name!r}; known: {', '.join(VERIFIERS)}.{hint}")
    module_name, class_name = VERIFIERS[name].target.split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(**options)


__all__ = ["VERIFIERS", "Outcome", "Verifier", "VerifierSpec", "VerifyResult", "get_verifier", "validate_inputs"]
