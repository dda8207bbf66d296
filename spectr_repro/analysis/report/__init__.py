"""REPORT.md: one loading step (``context``), one module per section, one entry point (``build``).

    python -m spectr_repro report results/cpu_quick
"""

from spectr_repro.analysis.report.build import build_report, main
from spectr_repro.analysis.report.context import ReportContext, load_context

__all__ = ["ReportContext", "build_report", "load_context", "main"]
