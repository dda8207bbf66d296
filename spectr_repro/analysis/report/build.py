"""`python -m spectr_repro report [results_dir ...]`: REPORT.md with environment, settings, Table 1
beside the paper's numbers, ablation figures, per-position acceptance, and (when present) the
losslessness audit, quality metrics and the theory summary.

Outputs, next to the first results folder (or ``--output``):

    REPORT.md
    tables/table1_<pair>.{md,csv,tex}       Table 1 (ours with 95 % intervals, paper, difference)
    tables/differences_<pair>.csv           each method vs SpecTr-GBV and vs SD, paired intervals
    tables/ablation_<K|L|T>_<pair>.csv      the numbers behind each ablation figure
    figures/ablation_<K|L|T>_<pair>.{png,svg}, figures/acceptance_<pair>.{png,svg}

The files are read once (``context.load_context``); each section is a function from that context to Markdown
(None: the section has nothing to say), in ``SECTIONS``' order. The report reads files only (records and
summaries; the audit, quality, theory, bias and replay files beside them), so it can be rebuilt anywhere; it
scores nothing (`python -m spectr_repro quality` does).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spectr_repro import tracking
from spectr_repro.analysis.report.audit import audit_section
from spectr_repro.analysis.report.batch import batch_section
from spectr_repro.analysis.report.batch_measured import batch_measured_section
from spectr_repro.analysis.report.bias import bias_section
from spectr_repro.analysis.report.block_verifiers import block_verifiers_section
from spectr_repro.analysis.report.context import ReportContext, load_context
from spectr_repro.analysis.report.context_length import context_length_section
from spectr_repro.analysis.report.environment import environment_section, integrity_section, settings_section
from spectr_repro.analysis.report.pairs import pair_sections
from spectr_repro.analysis.report.paper import paper_section
from spectr_repro.analysis.report.physics import physics_section
from spectr_repro.analysis.report.quality import quality_section
from spectr_repro.analysis.report.replay import replay_section, verdicts_section
from spectr_repro.analysis.report.speed_bench import speed_bench_section
from spectr_repro.analysis.report.speedup import speedup_section
from spectr_repro.analysis.report.theory import theory_section

DEFAULT_RESULTS_DIR = "results/cpu_quick"


def header_section(context: ReportContext) -> str:
    if context.results is None:
        source = ("from files without trajectory cells (no speed-ups: those come from `sweep`).")
        return f"# spectr_repro report\n\nGenerated {context.generated} by `{context.command}` {source}\n"
    return ("# spectr_repro report\n\nReproduction of *SpecTr-GBV* (arXiv 2604.25925) and baselines. Generated "
            f"{context.generated} by `{context.command}` from {len(context.results.cells)} cells.\n")


# The verdicts open the report; the replayed Table 1 comes before the trajectory one.
SECTIONS = [header_section, verdicts_section, environment_section, integrity_section, settings_section,
            replay_section, block_verifiers_section, speedup_section, batch_section, batch_measured_section,
            context_length_section,
            pair_sections, speed_bench_section, paper_section, physics_section, audit_section, quality_section,
            theory_section, bias_section]


def render(context: ReportContext) -> str:
    """REPORT.md's text (each section writes its own tables and figures beside it)."""
    context.out_dir.mkdir(parents=True, exist_ok=True)
    sections = [text for section in SECTIONS if (text := section(context))]
    return "\n".join(sections).rstrip() + "\n"


def build_report(
    results_dirs: list[str | Path],
    output: str | Path | None = None,
    paper_csv: str | Path | None = None,
    audit: str | Path | None = None,
    allow_incomplete: bool = False,
) -> Path:
    """Write REPORT.md (and its tables and figures) and return its path. ValueError on bad input,
    raised before anything is written."""
    context = load_context(results_dirs, output, paper_csv, audit, allow_incomplete)
    text = render(context)
    context.report_path.write_text(text, encoding="utf-8")
    return context.report_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spectr_repro report",
        description="Write REPORT.md (tables, figures, environment, settings, audit) for results folders.",
    )
    parser.add_argument(
        "results_dirs",
        nargs="*",
        default=[DEFAULT_RESULTS_DIR],
        metavar="results_dir",
        help=f"folders holding cells/<cell_id>/summary.json (default: {DEFAULT_RESULTS_DIR}); "
        "several are merged",
    )
    parser.add_argument("--output", help="report path (default: <first results_dir>/REPORT.md)")
    parser.add_argument("--paper", help="paper numbers CSV (default: the one shipped in the package)")
    parser.add_argument("--audit", help="audit.json (default: audit/audit.json beside or inside the results folder)")
    parser.add_argument(
        "--allow-incomplete",
        action="store_true",
        help="report although some cell folders are damaged or unfinished (they are listed in the report)",
    )
    tracking.add_logger_option(parser)
    args = parser.parse_args(argv)
    try:
        path = build_report(
            args.results_dirs,
            output=args.output,
            paper_csv=args.paper,
            audit=args.audit,
            allow_incomplete=args.allow_incomplete,
        )
    except ValueError as err:
        print(f"report: error: {err}", file=sys.stderr)
        return 2
    print(f"report written: {path}")
    tracking.log_command("report", tracking.logger_config(args.logger), path.parent,
                         tables={p.stem: p for p in sorted((path.parent / "tables").glob("*.csv"))},
                         images=sorted((path.parent / "figures").glob("*.png")), config=vars(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
