"""The one method registry: every rule of the harness, its label, lossless flags and module.

The engine, the runner, the analysis (order, labels, single-draft), theory and audit, and the shared test suites all
read it (through ``spectr_repro.verify``, which re-exports it). It imports no rule: ``get_verifier`` loads the rule's
module by name and imports nothing of ``verify``, so the rules' contract (``verify.base``) can read it (for its
error messages) with imports one way: __init__ -> base -> registry.
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class VerifierSpec:
    """One method of the harness. This registry is the only list of methods: the engine, the runner,
    the analysis (order, labels, single-draft), theory and audit, and the shared test suites all read it.
    Adding a rule = one module in ``verify/``, one entry here and one ``conf/method/<name>.yaml``."""

    name: str
    target: str  # "module:Class"
    label: str  # display name in tables and figures (the paper's spelling)
    lossless: bool  # guaranteed by this harness with default options (exact tests prove it)
    claimed_lossless: bool  # what the rule's authors claim
    single_draft: bool  # K must be 1
    description: str
    carries_state: bool = False  # default options thread a state into later iterations (gbv's carry-over)
    in_theory: bool = True  # included in `theory` (exact E[tau] on toys, LP comparison) and `audit`
    reduces_at_K1_to: str | None = None  # the single-draft rule whose law this one's equals at K = 1 (tested)
    # A rule whose sampler, fed the same uniforms, decides as this one does except where this one departs from
    # it (sbvf = sbv + a fallback): the replay estimates this rule as that rule's exact value plus the mean
    # difference of paired draws (a control variate: unbiased, with the noise of the departures only).
    shares_draws_with: str | None = None

    @property
    def lossless_as_is(self) -> bool:
        """Lossless with each iteration restarting from the plain target (what the LP limit bounds)."""
        return self.lossless and not self.carries_state


# The autoregressive baseline is a method of the runner and the tables, not a verification rule.
AR_METHOD = "ar"
AR_LABEL = "AR"

VERIFIERS: dict[str, VerifierSpec] = {
    spec.name: spec
    for spec in [
        VerifierSpec("sd", "spectr_repro.verify.sd:SpeculativeDecoding", "SD", True, True, True,
                     "token-level rejection sampling (Leviathan et al. 2023; Chen et al. 2023)"),
        VerifierSpec("spectr", "spectr_repro.verify.spectr:SpecTr", "SpecTr", True, True, False,
                     "SpecTr K-SEQ optimal-transport selection per depth (Sun et al. 2023)", reduces_at_K1_to="sd"),
        VerifierSpec("bv", "spectr_repro.verify.bv:BlockVerification", "BV", True, True, True,
                     "block verification (Sun et al., ICLR 2025)"),
        VerifierSpec("gbv", "spectr_repro.verify.gbv:GreedyBlockVerification", "GBV", True, True, True,
                     "greedy block verification (SpecTr-GBV at K=1), lossless with its carry-over target",
                     carries_state=True),
        VerifierSpec("spectr_gbv", "spectr_repro.verify.spectr_gbv:SpecTrGBV", "SpecTr-GBV", False, True, False,
                     "the authors' released SpecTr-GBV rule, run as published (not lossless for K >= 2)",
                     reduces_at_K1_to="gbv"),
        VerifierSpec("rbv", "spectr_repro.verify.rbv:RecursiveBlockVerification", "RBV", True, True, False,
                     "recursive block verification over K drafts (ours, lossless)", reduces_at_K1_to="bv"),
        VerifierSpec("sbv", "spectr_repro.verify.sbv:SelectionBlockVerification", "SBV", True, True, False,
                     "selection block verification: BV on a randomly selected path (ours, lossless)",
                     reduces_at_K1_to="bv"),
        VerifierSpec("sbvf", "spectr_repro.verify.sbvf:SelectionBlockVerificationFallback", "SBV-F", True, True,
                     False, "SBV with fallback: where BV rejects the selected path, the drafts that left it there "
                     "are tried against the residual (ours, lossless, never below SBV)", reduces_at_K1_to="bv",
                     shares_draws_with="sbv"),
        VerifierSpec("mpbv", "spectr_repro.verify.mpbv:GreedyMultiPathBlockVerification", "MP-BV", True, True,
                     False, "greedy multi-path block verification (Thomas & Pal 2026, their 'GBV'): BV on the "
                     "highest-ratio path with that path's exact law", reduces_at_K1_to="bv"),
        VerifierSpec("hsd", "spectr_repro.verify.hsd:HierarchicalSpeculativeDecoding", "HSD", False, True, True,
                     "hierarchical speculative decoding as released (Zhou et al., ICLR 2026): BV's capped branch "
                     "tests, the whole block on its joint ratio (not lossless, measured)"),
        VerifierSpec("hsd_rrs", "spectr_repro.verify.hsd_rrs:HierarchicalRecursiveRejection", "HSD-RRS", True, True,
                     False, "HSD over K drafts with recursive rejection sampling as the paper's Algorithm 3 reads: "
                     "each draft keeping the accepted prefix runs HSD from there against the last correction "
                     "(lossless, BV at K=1)", reduces_at_K1_to="bv"),
        VerifierSpec("hsd_rrs_release", "spectr_repro.verify.hsd_rrs:ReleasedHierarchicalRecursiveRejection",
                     "HSD-RRS (release)", False, True, False,
                     "the authors' multi-draft HSD loop: the prefix's joint ratio carried into each draft's tests, "
                     "each draft passing on its raw joint ratio (hsd at K=1; not lossless, measured)",
                     reduces_at_K1_to="hsd"),
    ]
}


def method_names() -> tuple[str, ...]:
    """Every method in canonical order (rows of every table, legends): AR, then the registry's order."""
    return (AR_METHOD, *VERIFIERS)


def method_labels() -> dict[str, str]:
    return {AR_METHOD: AR_LABEL, **{name: spec.label for name, spec in VERIFIERS.items()}}


def single_draft_methods() -> frozenset[str]:
    """Methods that draft one sequence (K = 1 always): AR and the single-draft rules."""
    return frozenset({AR_METHOD, *(name for name, spec in VERIFIERS.items() if spec.single_draft)})


def multi_draft_methods() -> tuple[str, ...]:
    """The rules that verify K >= 1 drafts, in the registry's order."""
    return tuple(name for name, spec in VERIFIERS.items() if not spec.single_draft)


def get_verifier(name: str, **options):
    """Instantiate the rule ``name``: a ``verify.base.Verifier`` (options are rule-specific, e.g. ``carry_over=False``).
    Not annotated with it: the registry imports no rule and not the contract, which reads the registry."""
    if name not in VERIFIERS:
        close = difflib.get_close_matches(name, VERIFIERS, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown verification rule {name!r}; known: {', '.join(VERIFIERS)}.{hint}")
    module_name, class_name = VERIFIERS[name].target.split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(**options)


__all__ = [
    "AR_LABEL", "AR_METHOD", "VERIFIERS", "VerifierSpec", "get_verifier", "method_labels", "method_names",
    "multi_draft_methods", "single_draft_methods",
]
