"""Verification rules: pure functions of probability tensors (no models, configs or I/O).

    from spectr_repro.verify import get_verifier, VERIFIERS
    verify = get_verifier("rbv")
    res = verify(draft_tokens, draft_probs, target_probs, generator=g, state=None)
    outcomes = verify.law(draft_tokens, draft_probs, target_probs)   # exact law, small inputs

Shapes and conventions: see ``spectr_repro.verify.base``. One module per rule.
"""

from __future__ import annotations

from spectr_repro.verify.base import FirstTokenLaw, Outcome, Verifier, VerifyResult, validate_inputs
from spectr_repro.verify.registry import (
    AR_LABEL,
    AR_METHOD,
    VERIFIERS,
    VerifierSpec,
    get_verifier,
    method_labels,
    method_names,
    multi_draft_methods,
    single_draft_methods,
)

__all__ = [
    "AR_LABEL", "AR_METHOD", "VERIFIERS", "FirstTokenLaw", "Outcome", "Verifier", "VerifierSpec", "VerifyResult",
    "get_verifier", "method_labels", "method_names", "multi_draft_methods", "single_draft_methods", "validate_inputs",
]
