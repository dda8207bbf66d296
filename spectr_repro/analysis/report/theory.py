"""The Theory section: a link to THEORY.md (`python -m spectr_repro theory`) when one lies beside the results."""

from __future__ import annotations

from spectr_repro.analysis.format import relative
from spectr_repro.analysis.report.context import ReportContext


def theory_section(context: ReportContext) -> str | None:
    if context.theory is None:
        return None
    return (f"## Theory\n\nExact laws, the LP limit and the paper's bound on toy models: "
            f"[{context.theory.name}]({relative(context.theory, context.out_dir)}).\n")
